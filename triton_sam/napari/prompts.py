"""Napari layers -> SAM prompts (Qt-free).

napari addresses pixels as (row, col), or (z, row, col) in a stack; SAM takes (X, Y) =
(col, row). Points are one layer with a ``label`` feature, ``positive`` or ``negative``,
toggled with a key as in micro-sam's annotator; a box is the last rectangle of a shapes
layer. In a stack, only the prompts on the slice being segmented count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

POSITIVE = "positive"
NEGATIVE = "negative"
POINT_LABELS = (POSITIVE, NEGATIVE)


@dataclass(frozen=True)
class Prompt:
    """One object's prompts on one 2-D image or slice, in SAM's convention.

    Attributes:
        point_coords: float [N, 2] (X, Y) pixels, or None.
        point_labels: int [N], 1 = object, 0 = background, or None.
        box: float [4] (X0, Y0, X1, Y1) pixels, or None.
    """

    point_coords: np.ndarray | None = None
    point_labels: np.ndarray | None = None
    box: np.ndarray | None = None

    @property
    def empty(self) -> bool:
        """No point and no box."""
        return self.point_coords is None and self.box is None


def _on_slice(coords: np.ndarray, z: int | None) -> np.ndarray:
    """Rows of ``coords`` ([N, 2] or [N, 3]) on slice ``z`` (all of them for 2-D)."""
    if coords.shape[1] == 2 or z is None:
        return np.ones(len(coords), bool)
    return np.round(coords[:, 0]).astype(int) == z


def points_prompt(coords: np.ndarray, labels: Sequence[str], z: int | None = None) -> Prompt:
    """A points layer's points on slice ``z`` as SAM's clicks.

    Args:
        coords: [N, 2] (row, col) or [N, 3] (z, row, col) data coordinates.
        labels: N of ``"positive"`` / ``"negative"`` (the layer's ``label`` feature).
        z: the slice (None for a 2-D image).

    Returns:
        A :class:`Prompt` with points only (None when no point is on the slice).
    """
    coords = np.asarray(coords, dtype=np.float64)
    if coords.size == 0:
        return Prompt()
    keep = _on_slice(coords, z)
    if not keep.any():
        return Prompt()
    rows_cols = coords[keep][:, -2:]
    flags = np.array([1 if str(v) == POSITIVE else 0 for v in np.asarray(labels)[keep]], np.int64)
    return Prompt(point_coords=rows_cols[:, ::-1].copy(), point_labels=flags)


def box_prompt(shapes: Sequence[np.ndarray], types: Sequence[str], z: int | None = None) -> Prompt:
    """The last rectangle of a shapes layer on slice ``z`` as SAM's box.

    Args:
        shapes: the layer's ``data``: one [4, 2] or [4, 3] array of corners per shape.
        types: the layer's ``shape_type`` list; only ``"rectangle"`` counts.
        z: the slice (None for a 2-D image).

    Returns:
        A :class:`Prompt` with a box only (None when no rectangle is on the slice).
    """
    for corners, kind in zip(reversed(list(shapes)), reversed(list(types)), strict=True):
        corners = np.asarray(corners, dtype=np.float64)
        if kind != "rectangle" or not _on_slice(corners, z).all():
            continue
        rows, cols = corners[:, -2], corners[:, -1]
        return Prompt(box=np.array([cols.min(), rows.min(), cols.max(), rows.max()]))
    return Prompt()


def combine(points: Prompt, box: Prompt) -> Prompt:
    """Points and a box as one prompt (SAM places the box's corners before the clicks)."""
    return Prompt(points.point_coords, points.point_labels, box.box)
