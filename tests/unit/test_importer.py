"""Importing a pre-exported pair: configs read from the graphs load in Triton's onnxruntime
backend as they are (checked statically here; tests/integration loads the SAM3 pair for real),
and a graph with a fixed batch dim is refused for that target instead of written broken."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from triton_sam.errors import RepositoryError
from triton_sam.models.sam2 import SAM2_FAMILY
from triton_sam.models.spec import TensorSpec
from triton_sam.repository.config import RepositoryOptions, parse_config
from triton_sam.repository.importer import import_onnx_pair
from triton_sam.repository.onnx_check import onnx_config_mismatches

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

FAMILY = dataclasses.replace(
    SAM2_FAMILY,
    family="pair",
    encoder_inputs=(TensorSpec("x", "float32", (3,)),),
    encoder_outputs=(TensorSpec("e", "float32", (3,)),),
    decoder_inputs=(TensorSpec("e", "float32", (3,)),),
    decoder_outputs=(TensorSpec("y", "float32", (3,)),),
    encoder_model="pair_encoder",
    decoder_model="pair_decoder",
)


def _graph(path: Path, name_in: str, name_out: str, batch: int | str, out_dim: int | str) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Identity", [name_in], [name_out])],
        path.stem,
        [helper.make_tensor_value_info(name_in, TensorProto.FLOAT, [batch, 3])],
        [helper.make_tensor_value_info(name_out, TensorProto.FLOAT, [batch, out_dim])],
    )
    onnx.save_model(helper.make_model(graph), str(path))
    return path


def _import(tmp_path: Path, batch: int | str, out_dim: int | str, target: str) -> Path:
    encoder = _graph(tmp_path / "enc.onnx", "x", "e", batch, out_dim)
    decoder = _graph(tmp_path / "dec.onnx", "e", "y", batch, out_dim)
    repo = tmp_path / f"repo_{target}"
    import_onnx_pair(
        repo,
        FAMILY,
        encoder_onnx=encoder,
        decoder_onnx=decoder,
        options=RepositoryOptions(target=target),  # type: ignore[arg-type]
    )
    return repo


@pytest.mark.parametrize("out_dim", [3, "n"])
def test_configs_read_from_the_graphs_load_in_the_onnxruntime_backend(tmp_path, out_dim):
    repo = _import(tmp_path, "batch", out_dim, "onnxruntime")
    for name in ("pair_encoder", "pair_decoder"):
        config = parse_config(repo / name / "config.pbtxt")
        assert config.max_batch_size > 0
        graph = repo / name / "1" / "model.onnx"
        assert onnx_config_mismatches(config, graph) == []
    # A symbolic graph output is -1 in the config, exactly there (outputs compare exactly).
    (output,) = parse_config(repo / "pair_decoder" / "config.pbtxt").output
    assert list(output.dims) == ([3] if out_dim == 3 else [-1])


def test_a_fixed_batch_graph_is_refused_for_the_onnxruntime_target(tmp_path):
    with pytest.raises(RepositoryError, match="batch dim is fixed to 1.*--target python"):
        _import(tmp_path, 1, 3, "onnxruntime")
    assert not (tmp_path / "repo_onnxruntime" / "pair_encoder").exists()
    repo = _import(tmp_path, 1, 3, "python")  # the runner takes it, one request at a time
    assert parse_config(repo / "pair_encoder" / "config.pbtxt").max_batch_size == 1
