"""The figures every benchmark report gives of a list of latencies."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

KEYS = ("p50", "p95", "p99", "max")


def percentiles(values: Sequence[float], *, digits: int | None = None) -> dict[str, float]:
    """p50/p95/p99 (linear interpolation) and max of ``values``; NaN each when empty.

    Args:
        values: the samples (ms in every report).
        digits: round each figure to this many decimals (None: as computed).
    """
    if len(values) == 0:
        return dict.fromkeys(KEYS, math.nan)
    a = np.asarray(values, dtype=np.float64)
    figures = {f"p{q}": float(np.percentile(a, q)) for q in (50, 95, 99)}
    figures["max"] = float(a.max())
    if digits is not None:
        figures = {k: round(v, digits) for k, v in figures.items()}
    return figures


def ratio(a: float, b: float, *, digits: int = 2) -> float:
    """``a / b`` rounded (a same-run ratio), NaN when either is missing or ``b`` is 0."""
    return round(a / b, digits) if b and not math.isnan(a) and not math.isnan(b) else math.nan
