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


def test_an_imported_decoder_bounds_its_points_as_an_exported_one_and_the_source_is_kept(
    tmp_path,
):
    """A pre-exported decoder has no bound of its own: the repository's copy gets the guard
    of ``export.onnx_utils.bound_points`` (per item and per batch)."""
    import numpy as np
    import onnxruntime as ort

    from triton_sam.serving.bounds import GRAPH_MAX_BATCH_POINTS, GRAPH_MAX_POINTS

    family = dataclasses.replace(
        FAMILY,
        decoder_inputs=(TensorSpec("input_points", "float32", (-1, -1, 2)),),
        decoder_outputs=(TensorSpec("y", "float32", (-1, -1, 2)),),
    )
    encoder = _graph(tmp_path / "enc.onnx", "x", "e", "batch", 3)
    decoder = _graph(tmp_path / "dec.onnx", "input_points", "y", "batch", 3)
    graph = onnx.load(str(decoder)).graph
    for value in (*graph.input, *graph.output):  # [B, objects, N, 2]
        dims = value.type.tensor_type.shape.dim
        del dims[1:]
        for name in ("objects", "n"):
            dims.add().dim_param = name
        dims.add().dim_value = 2
    model = helper.make_model(graph)
    onnx.save_model(model, str(decoder))
    source = decoder.read_bytes()
    repo = tmp_path / "repo"
    import_onnx_pair(
        repo,
        family,
        encoder_onnx=encoder,
        decoder_onnx=decoder,
        options=RepositoryOptions(target="onnxruntime"),
    )
    assert decoder.read_bytes() == source
    session = ort.InferenceSession(str(repo / "pair_decoder" / "1" / "model.onnx"))
    ok = np.ones((GRAPH_MAX_BATCH_POINTS // GRAPH_MAX_POINTS, 1, GRAPH_MAX_POINTS, 2), np.float32)
    assert session.run(None, {"input_points": ok})[0].shape == ok.shape
    for shape in [(1, 2, GRAPH_MAX_POINTS // 2 + 1, 2), (ok.shape[0] + 1, 1, GRAPH_MAX_POINTS, 2)]:
        with pytest.raises(Exception, match="input_points: at most"):
            session.run(None, {"input_points": np.ones(shape, np.float32)})
