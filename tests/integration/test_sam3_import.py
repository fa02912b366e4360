"""Import path: an ONNX pair in the onnx-community layout (produced here from the small
random-init model, since the real files cannot be downloaded) -> repository -> Triton.

Parity of what the imported pair serves is in tests/parity/test_sam3_parity.py; this file
checks the layout itself and the configs written for both targets.
"""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2

from triton_sam.errors import RepositoryError
from triton_sam.models.sam3 import (
    ONNX_COMMUNITY_DECODER,
    ONNX_COMMUNITY_ENCODER,
    SAM3_FAMILY,
    SAM3_ONNX_COMMUNITY_FAMILY,
)
from triton_sam.repository.config import RepositoryOptions, parse_config
from triton_sam.repository.importer import find_pair, graph_tensors, import_onnx_pair

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_pair_has_the_onnx_community_layout(sam3_onnx_community_pair):
    from triton_sam.export.onnx_utils import external_data_files

    files = sorted(p.name for p in (sam3_onnx_community_pair / "onnx").iterdir())
    assert files == [
        "prompt_encoder_mask_decoder.onnx",
        "prompt_encoder_mask_decoder.onnx_data",
        "vision_encoder.onnx",
        "vision_encoder.onnx_data",
    ]
    encoder, decoder = find_pair(
        sam3_onnx_community_pair, ONNX_COMMUNITY_ENCODER, ONNX_COMMUNITY_DECODER
    )
    assert [p.name for p in external_data_files(encoder)] == ["vision_encoder.onnx_data"]
    enc_in, enc_out = graph_tensors(encoder)
    dec_in, dec_out = graph_tensors(decoder)
    assert [t.name for t in enc_in] == ["pixel_values"]
    assert [t.name for t in enc_out] == [
        "image_embeddings.0",
        "image_embeddings.1",
        "image_embeddings.2",
    ]
    assert [t.name for t in dec_in] == [
        "input_points", "input_labels", "input_boxes",
        "image_embeddings.0", "image_embeddings.1", "image_embeddings.2",
    ]  # fmt: skip
    assert [t.name for t in dec_out] == ["iou_scores", "pred_masks", "object_score_logits"]
    assert {t.name: t.dtype for t in dec_in}["input_labels"] == "int64"


@pytest.mark.parametrize("target", ["onnxruntime", "python"])
def test_import_writes_configs_read_from_the_graphs(sam3_onnx_community_pair, tmp_path, target):
    encoder, decoder = find_pair(
        sam3_onnx_community_pair, ONNX_COMMUNITY_ENCODER, ONNX_COMMUNITY_DECODER
    )
    repo = tmp_path / "model_repository"
    names = import_onnx_pair(
        repo,
        SAM3_ONNX_COMMUNITY_FAMILY,
        encoder_onnx=encoder,
        decoder_onnx=decoder,
        options=RepositoryOptions(target=target),
    )
    assert names == ("sam3_encoder", "sam3_decoder")  # the names clients ask for
    decoder_config = parse_config(repo / "sam3_decoder" / "config.pbtxt")
    dims = {t.name: list(t.dims) for t in decoder_config.input}
    assert dims["input_points"] == [-1, -1, 2] and dims["input_boxes"] == [-1, 4]
    assert dims["image_embeddings.0"] == [32, 288, 288]
    int64 = model_config_pb2.DataType.Value("TYPE_INT64")
    assert {t.name: t.data_type for t in decoder_config.input}["input_labels"] == int64
    assert (repo / "sam3_encoder" / "1" / "vision_encoder.onnx_data").is_file()
    backend = "python" if target == "python" else ""
    assert decoder_config.backend == backend


def test_import_refuses_a_pair_of_another_contract(sam3_build, tmp_path):
    _, build = sam3_build
    repo, _ = sam3_build
    ours = repo / "sam3_decoder" / "1" / "model.onnx"
    encoder = repo / "sam3_encoder" / "1" / "model.onnx"
    with pytest.raises(RepositoryError, match="input_points"):
        import_onnx_pair(
            tmp_path / "r",
            SAM3_ONNX_COMMUNITY_FAMILY,
            encoder_onnx=encoder,
            decoder_onnx=ours,
            options=RepositoryOptions(target="python"),
        )
    assert {t.name for t in graph_tensors(ours)[0]} == {t.name for t in SAM3_FAMILY.decoder_inputs}
