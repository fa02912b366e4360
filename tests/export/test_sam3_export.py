"""Export tier: the small random-init SAM3 tracker -> ONNX on CPU, and its checkpoint/Hub paths.

The self-check's tolerance is FP32_TOLERANCE (relative to each output's magnitude), as for
SAM1/SAM2.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from triton_sam.errors import CheckpointError, DownloadError
from triton_sam.export import ExportOptions, export_model, onnx_utils
from triton_sam.models import get_model
from triton_sam.models.sam3 import SAM3_FAMILY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SPEC = get_model("sam3_tracker")


@pytest.fixture(scope="module")
def exported(sam3_small_checkpoint, tmp_path_factory):
    t0 = time.perf_counter()
    result = export_model(SPEC, sam3_small_checkpoint, tmp_path_factory.mktemp("onnx"))
    result.seconds["total"] = time.perf_counter() - t0
    return result


def test_small_config_keeps_the_real_tensor_contract():
    from triton_sam.export.sam3 import small_config

    cfg = small_config()
    assert cfg.vision_config.backbone_feature_sizes == [[288, 288], [144, 144], [72, 72]]
    assert cfg.prompt_encoder_config.image_size == SAM3_FAMILY.preprocessing.image_size
    assert [t.shape for t in SAM3_FAMILY.encoder_outputs] == [
        (32, 288, 288),
        (64, 144, 144),
        (256, 72, 72),
    ]


def test_export_writes_graphs_with_the_spec_contract(exported):
    import onnx

    fam = SAM3_FAMILY
    for path, inputs, outputs in (
        (exported.encoder, fam.encoder_inputs, fam.encoder_outputs),
        (exported.decoder, fam.decoder_inputs, fam.decoder_outputs),
    ):
        model = onnx.load(str(path), load_external_data=False)
        assert [i.name for i in model.graph.input] == [t.name for t in inputs]
        assert [o.name for o in model.graph.output] == [t.name for t in outputs]
        # Outputs too: Triton's onnxruntime backend compares their dims with the config's
        # exactly, so the fixed sizes must be declared (a symbolic dim would not load).
        declared = [*model.graph.input, *model.graph.output]
        for value, spec in zip(declared, [*inputs, *outputs], strict=True):
            dims = value.type.tensor_type.shape.dim
            assert dims[0].dim_param, f"{spec.name}: batch dim must be symbolic"
            for d, expected in zip(dims[1:], spec.shape, strict=True):
                assert d.dim_value == expected if expected > 0 else d.dim_param


def test_self_check_ran_within_the_stated_tolerance(exported):
    assert exported.tolerance is onnx_utils.FP32_TOLERANCE
    assert set(exported.max_abs_error) >= {"image_embeddings.2", "masks", "object_score_logits"}
    assert max(exported.max_abs_error.values()) < 1e-4


def test_no_memory_embedding_is_applied_to_the_lowest_level(sam3_small_checkpoint, exported):
    """The random checkpoint's no_memory_embedding is non-zero, and the graph adds it."""
    import torch
    from transformers import Sam3TrackerModel

    model = Sam3TrackerModel.from_pretrained(sam3_small_checkpoint).eval()
    assert model.no_memory_embedding.abs().max() > 0.1
    pixels = np.random.default_rng(0).standard_normal((1, 3, 1008, 1008)).astype(np.float32)
    ours = onnx_utils.run_onnx(exported.encoder, {"pixel_values": pixels})
    with torch.no_grad():
        raw = model.get_image_features(torch.from_numpy(pixels)).fpn_hidden_states[2]
    raw = raw.permute(1, 2, 0).reshape(1, 256, 72, 72).numpy()
    added = model.no_memory_embedding.detach().numpy().reshape(1, 256, 1, 1)
    np.testing.assert_allclose(ours["image_embeddings.2"], raw + added, atol=1e-4)


def test_fused_attention_export_keeps_fp32_parity(sam3_small_checkpoint, exported, tmp_path):
    """``fuse_attention=True``: our SDPA rewrite (optimize.fuse_attention(path, "sam3")) turns
    the windowed (layer 0) and global (layer 1) attentions into MultiHeadAttention, and the
    export's own check against torch passes at the fp32 tolerance."""
    import onnx

    fused = export_model(SPEC, sam3_small_checkpoint, tmp_path, ExportOptions(fuse_attention=True))
    assert fused.fused_operators == {"MultiHeadAttention": 2, "FoldedConv": 2}
    ops = [n.op_type for n in onnx.load(str(fused.encoder), load_external_data=False).graph.node]
    assert ops.count("MultiHeadAttention") == 2
    assert "Softmax" not in ops
    assert fused.encoder_tolerance is onnx_utils.FP32_TOLERANCE
    assert max(fused.max_abs_error.values()) < 1e-4
    pixels = np.random.default_rng(2).standard_normal((1, 3, 1008, 1008)).astype(np.float32)
    ours = onnx_utils.run_onnx(fused.encoder, {"pixel_values": pixels})
    plain = onnx_utils.run_onnx(exported.encoder, {"pixel_values": pixels})
    for name, value in plain.items():
        np.testing.assert_allclose(ours[name], value, atol=1e-4, rtol=1e-4, err_msg=name)


def test_not_a_model_directory_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        export_model(SPEC, tmp_path, tmp_path / "out", ExportOptions(verify=False))


def test_offline_hub_download_is_a_clear_download_error(tmp_path, monkeypatch):
    from triton_sam.setup.pipeline import obtain_checkpoint

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(DownloadError, match="offline"):
        obtain_checkpoint(SPEC, checkpoint=None, checkpoints_dir=tmp_path)


@pytest.mark.parametrize("status", [401, 403])
def test_gated_hub_download_says_how_to_log_in(tmp_path, monkeypatch, status):
    from types import SimpleNamespace

    from huggingface_hub import errors

    from triton_sam.setup.pipeline import obtain_checkpoint

    def gated(*args, **kwargs):
        response = SimpleNamespace(status_code=status, headers={}, request=None)
        raise errors.GatedRepoError(f"{status} Client Error: gated", response=response)

    monkeypatch.setattr("huggingface_hub.snapshot_download", gated)
    with pytest.raises(DownloadError, match="hf auth login") as info:
        obtain_checkpoint(SPEC, checkpoint=None, checkpoints_dir=tmp_path)
    assert "HF_TOKEN" in str(info.value) and "facebook/sam3" in str(info.value)
