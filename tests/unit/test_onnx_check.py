"""The static check of a config against its graph, by the rules of Triton's onnxruntime backend
(onnxruntime_backend r24.10: inputs compatible, outputs exactly equal, batch dim variable).

The first case is the mismatch that kept every exported SAM2 model from loading: the graph
declared symbolic non-batch output dims, the config fixed sizes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from triton_sam.errors import RepositoryError
from triton_sam.repository.config import parse_config
from triton_sam.repository.onnx_check import check_onnx_config, onnx_config_mismatches

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402


def _graph(path: Path, x_dims: list, y_dims: list, y_type: int = TensorProto.FLOAT) -> Path:
    """x -> Identity -> y, with the given declared dims (str = symbolic)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)],
        [helper.make_tensor_value_info("y", y_type, y_dims)],
    )
    onnx.save_model(helper.make_model(graph), str(path))
    return path


def _config(x: str = "2, 3", y: str = "2, 3", batch: int = 4, extra: str = "") -> object:
    return parse_config(
        f'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {batch}\n'
        f'input {{ name: "x" data_type: TYPE_FP32 dims: [{x}] }}\n'
        f'output {{ name: "y" data_type: TYPE_FP32 dims: [{y}] }}\n{extra}'
    )


def test_symbolic_output_dims_against_fixed_config_dims_are_refused(tmp_path):
    path = _graph(tmp_path / "m.onnx", ["b", 2, 3], ["b", "s1", "s2"])
    (problem,) = onnx_config_mismatches(_config(), path)
    assert "output 'y': the graph declares [-1, -1, -1], the config [-1, 2, 3]" in problem
    with pytest.raises(RepositoryError, match="would refuse"):
        check_onnx_config(_config(), path)
    # -1 exactly where the graph is symbolic loads; so does a graph declaring the sizes.
    assert onnx_config_mismatches(_config(y="-1, -1"), path) == []
    declared = _graph(tmp_path / "f.onnx", ["b", 2, 3], ["b", 2, 3])
    assert onnx_config_mismatches(_config(), declared) == []


def test_inputs_only_need_to_be_compatible(tmp_path):
    path = _graph(tmp_path / "m.onnx", ["b", "n", 3], ["b", 2, 3])
    assert onnx_config_mismatches(_config(x="2, 3"), path) == []  # symbolic accepts a size
    assert onnx_config_mismatches(_config(x="-1, 3"), path) == []
    fixed = _graph(tmp_path / "f.onnx", ["b", 2, 3], ["b", 2, 3])
    (problem,) = onnx_config_mismatches(_config(x="-1, 3"), fixed)  # fixed needs its size
    assert "input 'x'" in problem and "must fit" in problem


def test_batching_needs_a_variable_first_dim_and_no_optional_inputs(tmp_path):
    path = _graph(tmp_path / "m.onnx", [1, 2, 3], [1, 2, 3])
    problems = onnx_config_mismatches(_config(), path)
    assert len(problems) == 2 and all("batch dim fixed to 1" in p for p in problems)
    assert onnx_config_mismatches(_config(x="1, 2, 3", y="1, 2, 3", batch=0), path) == []
    optional = _config()
    optional.input[0].optional = True
    assert any("optional" in p for p in onnx_config_mismatches(optional, path))


def test_names_counts_and_dtypes(tmp_path):
    path = _graph(tmp_path / "m.onnx", ["b", 2, 3], ["b", 2, 3], y_type=TensorProto.FLOAT16)
    (dtype,) = onnx_config_mismatches(_config(), path)
    assert "output 'y': the graph has TYPE_FP16, the config TYPE_FP32" in dtype
    extra = 'input { name: "z" data_type: TYPE_FP32 dims: [1] }\n'
    problems = onnx_config_mismatches(_config(extra=extra), path)
    assert any("the graph has 1 inputs" in p for p in problems)
    assert any("input 'z' is not in the graph" in p for p in problems)


def test_an_unreadable_graph_is_a_repository_error(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a graph")
    with pytest.raises(RepositoryError, match="not a readable ONNX model"):
        onnx_config_mismatches(_config(), bad)
