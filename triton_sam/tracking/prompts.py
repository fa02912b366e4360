"""Clicks and boxes as upstream lays them out for the decoder (dependency-free, numpy only)."""

from __future__ import annotations

import numpy as np

from . import protocol
from .protocol import TrackingError
from .state import PointInputs

_F32 = np.float32


def point_inputs(
    video_hw: tuple[int, int],
    points: np.ndarray | None,
    labels: np.ndarray | None,
    box: np.ndarray | None,
    normalize_coords: bool,
    image_size: int,
) -> PointInputs:
    """Validated prompts, box corners first, scaled to the input frame as upstream
    (``points / [W, H] * image_size`` in float32)."""
    if (points is None) != (labels is None):
        raise TrackingError(
            protocol.ERR_INVALID_INPUT, "points: points and labels go together", "points"
        )
    if points is None and box is None:
        raise TrackingError(
            protocol.ERR_INVALID_INPUT, "points: give points (with labels) or a box", "points"
        )
    coords = _finite(points, "points", (-1, 2)) if points is not None else np.zeros((0, 2), _F32)
    if labels is not None:
        values = np.asarray(labels)
        if values.shape != (len(coords),) or not np.isin(values, (0, 1)).all():
            raise TrackingError(
                protocol.ERR_INVALID_INPUT,
                f"labels: expected {len(coords)} labels, each 0 or 1, got {values.tolist()}",
                "labels",
            )
        point_labels = values.astype(np.int32)
    else:
        point_labels = np.zeros(0, np.int32)
    if box is not None:
        corners = _finite(box, "box", (4,)).reshape(2, 2)
        coords = np.concatenate([corners, coords])
        point_labels = np.concatenate([np.array([2, 3], np.int32), point_labels])
    if len(coords) > protocol.MAX_POINTS:
        raise TrackingError(
            protocol.ERR_INVALID_INPUT,
            f"points: {len(coords)} points, at most {protocol.MAX_POINTS}",
            "points",
        )
    if normalize_coords:
        height, width = video_hw
        coords = coords / np.array([width, height], _F32)
    scaled = coords * _F32(image_size)
    return PointInputs(scaled.astype(_F32), point_labels)


def _finite(values: object, field: str, shape: tuple[int, ...]) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=_F32)
    except (TypeError, ValueError) as e:
        raise TrackingError(protocol.ERR_INVALID_INPUT, f"{field}: not numbers ({e})", field) from e
    wanted = tuple(len(array) if d == -1 else d for d in shape)
    if array.shape != wanted or not np.isfinite(array).all():
        raise TrackingError(
            protocol.ERR_INVALID_INPUT,
            f"{field}: got shape {array.shape}; expected finite {shape} (-1 = any)",
            field,
        )
    return array
