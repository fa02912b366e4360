"""The decoder graphs bound their own prompt points (``export.onnx_utils.bound_points``).

Triton 2.51 cannot bound a variable dim, so a request sent straight to ``<family>_decoder``
would otherwise reach the attention with any number of points; it bounds the batch dim, but
a batch of items each within the per-item bound multiplies it. The guard must be a no-op
within bounds (same outputs), refuse one point more per item or per batch with an error naming
the input, count objects x points for [B, O, N, 2] inputs, and be idempotent.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from triton_sam.errors import ExportError
from triton_sam.export.onnx_utils import bound_points


def toy_graph(path, name: str, dims: list) -> None:
    """y = ReduceSum(x * 2): every element of ``name`` reaches the output."""
    x = helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    nodes = [
        helper.make_node("Mul", [name, "two"], ["doubled"]),
        helper.make_node("ReduceSum", ["doubled"], ["y"], keepdims=0),
    ]
    graph = helper.make_graph(nodes, "toy", [x], [y], initializer=[two])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def run(path, name: str, array: np.ndarray) -> float:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return float(session.run(None, {name: array})[0])


def test_within_bounds_nothing_changes_and_one_more_point_is_refused_by_name(tmp_path):
    path = tmp_path / "decoder.onnx"
    toy_graph(path, "point_coords", ["batch", "n", 2])
    points = np.arange(2 * 8 * 2, dtype=np.float32).reshape(2, 8, 2)
    before = run(path, "point_coords", points)
    bound_points(path, "point_coords", 8, 16)
    onnx.checker.check_model(onnx.load(str(path)))
    assert run(path, "point_coords", points) == before
    with pytest.raises(Exception, match="point_coords: at most 8 points per item and 16 per"):
        run(path, "point_coords", np.ones((1, 9, 2), np.float32))


def test_a_batch_of_items_within_bounds_is_refused_past_the_batch_total(tmp_path):
    """2 x 8 points is the batch total; 3 x 6 is within the item bound, not the batch's."""
    path = tmp_path / "decoder.onnx"
    toy_graph(path, "point_coords", ["batch", "n", 2])
    bound_points(path, "point_coords", 8, 16)
    assert run(path, "point_coords", np.ones((2, 8, 2), np.float32)) == 64.0
    assert run(path, "point_coords", np.ones((16, 1, 2), np.float32)) == 64.0
    for shape in [(3, 6, 2), (17, 1, 2)]:
        with pytest.raises(Exception, match="point_coords: at most 8 points per item"):
            run(path, "point_coords", np.ones(shape, np.float32))


def test_objects_times_points_are_counted(tmp_path):
    path = tmp_path / "decoder.onnx"
    toy_graph(path, "input_points", ["batch", "objects", "n", 2])
    bound_points(path, "input_points", 8, 16)
    assert run(path, "input_points", np.ones((2, 2, 4, 2), np.float32)) == 64.0
    with pytest.raises(Exception, match="input_points: at most 8 points"):
        run(path, "input_points", np.ones((1, 3, 3, 2), np.float32))
    with pytest.raises(Exception, match="input_points: at most 8 points"):
        run(path, "input_points", np.ones((3, 2, 3, 2), np.float32))


def test_bounding_twice_adds_one_guard_and_a_missing_input_is_named(tmp_path):
    path = tmp_path / "decoder.onnx"
    toy_graph(path, "point_coords", ["batch", "n", 2])
    bound_points(path, "point_coords", 8, 16)
    bound_points(path, "point_coords", 8, 16)
    guards = [n for n in onnx.load(str(path)).graph.node if n.op_type == "Reshape"]
    assert len(guards) == 1
    with pytest.raises(ExportError, match="already bounded"):
        bound_points(path, "point_coords", 8, 32)
    with pytest.raises(ExportError, match="input_points"):
        bound_points(path, "input_points", 8, 16)
