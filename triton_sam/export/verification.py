"""The check of an exported graph against torch: tolerances relative to each tensor's own
magnitude (:class:`Tolerance`, one source of truth for every export check), onnxruntime runs,
and one report listing every output that disagrees (:func:`verify_graph`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from triton_sam.errors import ExportValidationError

if TYPE_CHECKING:
    pass


# float32's machine epsilon (2^-23): the spacing of floats in [1, 2), the unit of the bounds.
EPS_FP32 = float(np.finfo(np.float32).eps)
EPS_FP16 = float(np.finfo(np.float16).eps)  # 2^-10


@dataclass(frozen=True)
class Tolerance:
    """How far an ONNX output may be from its torch reference, relative to the reference's
    own magnitude (one source of truth for every export check).

    Two bounds, both scaled by the tensor: ``max|onnx - torch| <= max_rel * max(max|torch|,
    floor)`` and ``rms(onnx - torch) <= rms_rel * max(rms(torch), floor)``. A float32 rounding
    error is relative to the magnitude of the values summed, not to the element it lands in:
    the same graph with another summation order moves every output by a few ulps of the
    tensor's scale, so an element-wise ``atol + rtol * |x|`` trips on the elements near 0 of a
    large-valued tensor (a fine-tuned checkpoint with larger activations) though the export is
    exact up to rounding. The max bound, loose, catches a bug confined to a few elements; the
    rms bound, tight because independent roundings average out, catches a small error spread
    over every element.

    ``floor`` is the scale below which the bounds stop shrinking: SAM's activations are
    normalised (LayerNorm, GroupNorm) to order 1, so an output that is small because terms of
    order 1 cancel (a single object-score logit of 0.02) still carries their rounding.

    Attributes:
        max_rel: bound on the largest absolute error, as a fraction of the scale.
        rms_rel: bound on the root-mean-square error, as a fraction of the rms scale.
        unit: the epsilon the fractions are stated in, for messages (float32's, fp16's, 1).
        floor: the smallest scale (see above).
    """

    max_rel: float
    rms_rel: float
    unit: float = 1.0
    floor: float = 1.0

    @classmethod
    def ulps(cls, max_ulps: float, rms_ulps: float, eps: float = EPS_FP32) -> Tolerance:
        """Bounds in units of ``eps`` (float32's by default) of the tensor's magnitude."""
        return cls(max_ulps * eps, rms_ulps * eps, eps)

    def bounds(self, reference: np.ndarray) -> tuple[float, float]:
        """(bound on the max abs error, bound on the rms error) for this reference."""
        ref = np.abs(np.asarray(reference, np.float64))
        rms = float(np.sqrt(np.mean(ref * ref))) if ref.size else 0.0
        largest = float(ref.max(initial=0.0))
        return self.max_rel * max(largest, self.floor), self.rms_rel * max(rms, self.floor)

    def mismatch(self, actual: np.ndarray, reference: np.ndarray) -> str | None:
        """Why ``actual`` is out of tolerance of ``reference`` (None when it is within).

        NaN or inf anywhere in either is a mismatch (their comparisons are false)."""
        if actual.shape != reference.shape:
            return f"shape {actual.shape}, expected {reference.shape}"
        err = np.abs(np.asarray(actual, np.float64) - np.asarray(reference, np.float64))
        max_bound, rms_bound = self.bounds(reference)
        worst = float(err.max(initial=0.0))
        rms = float(np.sqrt(np.mean(err * err))) if err.size else 0.0
        found = []
        if not worst <= max_bound:
            outside = int((~(err <= max_bound)).sum())
            found.append(
                f"max abs error {worst:.3g} > {max_bound:.3g} ({outside}/{err.size} elements; "
                f"bound {self._in_units(self.max_rel)} of max|torch|)"
            )
        if not rms <= rms_bound:
            found.append(
                f"rms error {rms:.3g} > {rms_bound:.3g} "
                f"(bound {self._in_units(self.rms_rel)} of rms(torch))"
            )
        return "; ".join(found) or None

    def describe(self) -> str:
        """The bounds in words, for reports."""
        return (
            f"max error <= {self._in_units(self.max_rel)} of max|torch|, "
            f"rms error <= {self._in_units(self.rms_rel)} of rms(torch) "
            f"(scales of at least {self.floor:g})"
        )

    def _in_units(self, fraction: float) -> str:
        if self.unit == EPS_FP32:
            return f"{fraction / self.unit:g} float32 ulps"
        if self.unit == EPS_FP16:
            return f"{fraction / self.unit:g} fp16 ulps"
        return f"{fraction:g}"


# fp32: ORT and torch run the same float32 math up to the order of sums (fused kernels, other
# blockings). Rounding a reordered sum of n terms moves it by ~sqrt(n) ulps of the terms'
# magnitude (independent roundings); the deepest reductions here (attention over 64x64 tokens,
# 12 Hiera blocks) make ~64 ulps of the tensor's scale a plausible single-element drift.
# Measured on SAM2.1-tiny's five video graphs, seeds 0-5 (tests/export/test_export_gates.py
# for the encoder): largest error 11 ulps of max|torch| (encoder features), 30 ulps of a
# single object-score logit's own magnitude (0.02: within the floor of 1), rms errors <= 9 ulps
# of rms(torch). max 512 ulps (6.1e-5 of the scale) is 8x that plausible drift and ~45x what
# is measured; rms 64 ulps (7.6e-6 of the scale) is 7x the measured rms. A bug is orders
# above both: a weight off by 1% is ~84,000 ulps, a dropped bias or residual is of the order
# of the tensor itself (tests/unit/test_export_tolerance.py plants each).
FP32_TOLERANCE = Tolerance.ulps(max_ulps=512, rms_ulps=64)
# fp16 weights and activations carry ~3 significant digits (eps 2^-10); errors accumulate over
# the depth of the encoder, so the check is only a guard against a broken conversion: 64 fp16
# ulps of the scale (6%) on the worst element, 16 (1.6%) in rms.
FP16_TOLERANCE = Tolerance.ulps(max_ulps=64, rms_ulps=16, eps=EPS_FP16)


def run_onnx(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run an ONNX file once on CPU with onnxruntime and return outputs by name."""
    return _run(_session(path), feeds)


def _session(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _run(session: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(feeds)), strict=True))


def declared_shape_mismatches(
    session: Any, actual: Mapping[str, np.ndarray], *, label: str = ""
) -> list[str]:
    """Outputs whose computed shape contradicts a fixed dim the graph declares.

    onnxruntime only warns about such a contradiction; Triton sizes and checks responses
    by the config, which says what the graph declares, so it must be an error here.
    """
    problems = []
    for output in session.get_outputs():
        got = actual.get(output.name)
        if got is None:
            continue
        declared = list(output.shape)
        fixed_ok = len(declared) == got.ndim and all(
            not isinstance(d, int) or d == n for d, n in zip(declared, got.shape, strict=True)
        )
        if not fixed_ok:
            problems.append(
                f"{label}{output.name}: computed shape {got.shape}, the graph declares {declared}"
            )
    return problems


def compare_outputs(
    actual: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    tolerance: Tolerance,
    *,
    label: str = "",
) -> list[str]:
    """Compare every expected output; return one line per mismatch (empty when all match)."""
    mismatches = []
    for name, ref in expected.items():
        got = actual.get(name)
        if got is None:
            mismatches.append(f"{label}{name}: missing from the ONNX outputs")
            continue
        why = tolerance.mismatch(got, ref)
        if why is not None:
            mismatches.append(f"{label}{name}: {why}")
    return mismatches


def verify_graph(
    path: Path,
    cases: Sequence[tuple[str, Mapping[str, np.ndarray], Mapping[str, np.ndarray]]],
    tolerance: Tolerance,
) -> dict[str, float]:
    """Run each ``(label, feeds, expected)`` case through ORT; raise once listing all mismatches
    (values out of tolerance, and computed shapes that contradict the graph's declared dims).

    Returns:
        The max absolute error per output over all cases (for reports).

    Raises:
        ExportValidationError: one or more outputs of one or more cases are out of tolerance.
    """
    mismatches: list[str] = []
    max_err: dict[str, float] = {}
    session = _session(path)
    for label, feeds, expected in cases:
        actual = _run(session, feeds)
        mismatches += compare_outputs(actual, expected, tolerance, label=f"[{label}] ")
        mismatches += declared_shape_mismatches(session, actual, label=f"[{label}] ")
        for name, ref in expected.items():
            if name in actual and actual[name].shape == ref.shape:
                err = float(np.abs(actual[name].astype(np.float64) - ref).max(initial=0.0))
                max_err[name] = max(max_err.get(name, 0.0), err)
    if mismatches:
        raise ExportValidationError(path.name, mismatches)
    return max_err
