"""The export checks' tolerance (``onnx_utils.Tolerance``), on synthetic tensors.

The reference is a float64 computation; the "export" is the same computation in float32 with
its sums in another order, what ORT does to a torch graph. A good computation must pass at
every scale and seed (a fine-tuned checkpoint can have much larger activations than ours);
a real bug (a constant off by 1%, a dropped bias or residual, one wrong element, a small
error spread over every element) must still fail. tests/export/test_export_gates.py does
the same on the real SAM2.1-tiny video encoder.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from triton_sam.errors import ExportValidationError
from triton_sam.export import onnx_utils
from triton_sam.export.concept_graphs import DECODER_TOLERANCE, MASK_TOLERANCE
from triton_sam.export.optimize import INT8_TOLERANCE

TOL = onnx_utils.FP32_TOLERANCE
WIDTH, DEPTH, ROWS = 512, 8, 64
SEEDS = range(5)
SCALES = (1.0, 30.0, 1e3)  # ours, and larger activations (a fine-tuned checkpoint's)


def _layers(seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (
            (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32),
            (rng.standard_normal(WIDTH) * 0.5).astype(np.float32),
        )
        for _ in range(DEPTH)
    ]


def _net(x, layers, dtype, *, order=None, scale=1.0, bug=None) -> np.ndarray:
    """Residual blocks ``h + tanh(layernorm(h @ W + b))`` (sums of 512 terms, 8 deep), then
    ``* scale``. ``order`` permutes every sum's terms; ``bug`` plants one."""
    h = x.astype(dtype)
    for i, (w, b) in enumerate(layers):
        w, b = w.astype(dtype), b.astype(dtype)
        if bug == "constant" and i == 3:
            w = w * dtype(1.01)
        if bug == "bias" and i == DEPTH - 1:
            b = np.zeros_like(b)
        pre = (h[:, order] @ w[order] if order is not None else h @ w) + b
        mu = pre.mean(-1, keepdims=True)
        var = ((pre - mu) ** 2).mean(-1, keepdims=True)
        step = np.tanh((pre - mu) / np.sqrt(var + dtype(1e-6)))
        h = step if bug == "residual" and i == DEPTH - 1 else h + step
    return h * dtype(scale)


def _case(seed: int, scale: float, bug: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(float32 reordered computation, float64 reference)."""
    layers = _layers(seed)
    rng = np.random.default_rng(100 + seed)
    x = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
    order = rng.permutation(WIDTH)
    got = _net(x, layers, np.float32, order=order, scale=scale, bug=bug)
    return got, _net(x, layers, np.float64, scale=scale)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("seed", SEEDS)
def test_reordered_float32_passes_at_every_scale_and_seed(seed, scale):
    got, ref = _case(seed, scale)
    assert got.dtype == np.float32 and not np.array_equal(got, ref)  # it does differ
    assert TOL.mismatch(got, ref) is None


def test_an_element_wise_atol_rtol_trips_on_large_activations_where_this_does_not():
    """What refused a good export: at 1000x our scale, the rounding of the elements near 0 is
    beyond ``1e-4 + 1e-4 * |x|``, though the tensor is exact up to rounding."""
    got, ref = _case(0, 1e3)
    assert not np.isclose(got, ref, atol=1e-4, rtol=1e-4).all()
    assert TOL.mismatch(got, ref) is None


@pytest.mark.parametrize("bug", ["constant", "bias", "residual"])
@pytest.mark.parametrize("scale", SCALES)
def test_a_planted_bug_fails_at_every_scale(bug, scale):
    got, ref = _case(1, scale, bug)
    why = TOL.mismatch(got, ref)
    assert why is not None and "max abs error" in why and "rms error" in why


def test_one_wrong_element_fails_on_the_max_bound():
    got, ref = _case(2, 1.0)
    got[7, 11] += 1e-4 * np.abs(ref).max()  # ~840 ulps of the scale, on one element
    why = TOL.mismatch(got, ref)
    assert why is not None and "max abs error" in why and "(1/32768 elements" in why
    assert "rms error" not in why  # one element of 32768 hardly moves the rms


def test_a_small_error_over_every_element_fails_on_the_rms_bound():
    """A constant off by 2e-5 (168 ulps): under the max bound, far over the rms one."""
    got, ref = _case(3, 1.0)
    why = TOL.mismatch((got * np.float32(1 + 2e-5)).astype(np.float32), ref)
    assert why is not None and why.startswith("rms error")


@pytest.mark.parametrize(
    "bad",
    [
        lambda a: np.where(a == a.max(), np.nan, a),
        lambda a: np.where(a == a.max(), np.inf, a),
        lambda a: a[:-1],
    ],
    ids=["nan", "inf", "shape"],
)
def test_nan_inf_and_shape_are_mismatches(bad):
    got, ref = _case(4, 1.0)
    assert TOL.mismatch(bad(got), ref) is not None


def test_below_the_floor_the_bound_stops_shrinking():
    """Normalised activations are of order 1: a zero or tiny output is held to float32
    rounding at scale 1, not to exact equality."""
    zeros = np.zeros((4, 4), np.float32)
    assert TOL.mismatch(zeros, zeros) is None
    assert TOL.mismatch(zeros + np.float32(1e-6), zeros) is None
    assert TOL.mismatch(zeros + np.float32(1e-3), zeros) is not None


def _small_logit(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A single logit of ~0.02 from 256 terms of order 1 (an object-score head), summed in
    float32 in another order, and its float64 reference."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(256), rng.standard_normal(256)
    b -= (a @ b - 0.02) * a / (a @ a)  # the sum cancels to 0.02
    a, b = a.astype(np.float32), b.astype(np.float32)
    ref = np.array([a.astype(np.float64) @ b.astype(np.float64)])
    order = rng.permutation(256)
    return np.array([np.cumsum(a[order] * b[order], dtype=np.float32)[-1]]), ref


@pytest.mark.parametrize("seed", SEEDS)
def test_a_logit_small_by_cancellation_passes(seed):
    """Its rounding is tens of ulps of the terms, hundreds of ulps of its own value."""
    got, ref = _small_logit(seed)
    assert TOL.mismatch(got, ref) is None
    assert TOL.mismatch(got * np.float32(1.01) + np.float32(1e-3), ref) is not None


def test_without_the_floor_small_logits_would_be_refused():
    unfloored = dataclasses.replace(TOL, floor=0.0)
    refused = [s for s in SEEDS if unfloored.mismatch(*_small_logit(s)) is not None]
    assert len(refused) >= 2, refused


def test_bounds_scale_with_the_reference():
    ref = np.array([[3.0, -4.0], [0.0, 0.0]])
    max_bound, rms_bound = TOL.bounds(ref)
    assert max_bound == pytest.approx(512 * onnx_utils.EPS_FP32 * 4.0)
    assert rms_bound == pytest.approx(64 * onnx_utils.EPS_FP32 * 2.5)  # rms of (3, 4, 0, 0)
    assert TOL.bounds(1000 * ref)[0] == pytest.approx(1000 * max_bound)
    assert TOL.bounds(ref / 1000) == pytest.approx(
        (512 * onnx_utils.EPS_FP32, 64 * onnx_utils.EPS_FP32)
    )


@pytest.mark.parametrize(
    ("tolerance", "words"),
    [
        (TOL, "max error <= 512 float32 ulps of max|torch|, rms error <= 64 float32 ulps"),
        (onnx_utils.FP16_TOLERANCE, "max error <= 64 fp16 ulps of max|torch|"),
        (INT8_TOLERANCE, "max error <= 0.1 of max|torch|, rms error <= 0.03 of rms(torch)"),
    ],
)
def test_every_tolerance_says_what_it_bounds(tolerance, words):
    assert tolerance.describe().startswith(words)


def test_looser_tolerances_still_catch_a_dropped_residual():
    """fp16, int8 and the concept decoder's bounds are guards, but a dropped term is of the
    order of the tensor itself."""
    got, ref = _case(0, 1.0, "residual")
    for tolerance in (onnx_utils.FP16_TOLERANCE, INT8_TOLERANCE, DECODER_TOLERANCE):
        assert tolerance.mismatch(got, ref) is not None, tolerance
    assert MASK_TOLERANCE.mismatch(*_case(0, 1.0, "constant")) is not None


# -- verify_graph: one ONNX graph, every mismatch reported once ----------------------------
def _graph(path, w: np.ndarray, b: np.ndarray, *, with_bias: bool = True):
    """``y = x @ w + b`` and ``z = y + x`` (a residual), as an ONNX file."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["y"])
        if with_bias
        else helper.make_node("Identity", ["xw"], ["y"]),
        helper.make_node("Add", ["y", "x"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", WIDTH])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", WIDTH]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", WIDTH]),
        ],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _expected(x, w, b) -> dict[str, np.ndarray]:
    y = x.astype(np.float64) @ w.astype(np.float64) + b
    return {"y": y, "z": y + x}


@pytest.mark.parametrize("seed", SEEDS)
def test_verify_graph_passes_a_correct_graph_for_every_seed(tmp_path, seed):
    (w, b), x = _layers(seed)[0], np.random.default_rng(seed).standard_normal((64, WIDTH))
    x = (x * 300).astype(np.float32)  # large activations: the element-wise check failed these
    errors = onnx_utils.verify_graph(
        _graph(tmp_path / "g.onnx", w, b), [("x", {"x": x}, _expected(x, w, b))], TOL
    )
    assert set(errors) == {"y", "z"}


def test_verify_graph_reports_every_output_of_every_case_once(tmp_path):
    (w, b), rng = _layers(0)[0], np.random.default_rng(0)
    cases = []
    for label in ("a", "b"):
        x = rng.standard_normal((8, WIDTH)).astype(np.float32)
        cases.append((label, {"x": x}, _expected(x, w, b)))
    wrong_constant = _graph(tmp_path / "w.onnx", (w * np.float32(1.01)), b)
    with pytest.raises(ExportValidationError) as info:
        onnx_utils.verify_graph(wrong_constant, cases, TOL)
    assert [m.split(":")[0] for m in info.value.mismatches] == ["[a] y", "[a] z", "[b] y", "[b] z"]
    dropped_bias = _graph(tmp_path / "b.onnx", w, b, with_bias=False)
    with pytest.raises(ExportValidationError) as info:
        onnx_utils.verify_graph(dropped_bias, cases, TOL)
    assert len(info.value.mismatches) == 4
