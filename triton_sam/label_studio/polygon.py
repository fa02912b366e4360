"""A mask's outline as one polygon, for ``polygonlabels`` results (pure).

The outline follows pixel edges exactly (vertices on the pixel grid, (X, Y) with (0, 0) the
top-left corner of the top-left pixel), so filling the polygon gives back the region's pixels:
nothing is smoothed away. Only vertices where the outline turns are kept.

A polygon has no holes and Label Studio's polygon is one ring, so the answer is the outer
boundary of the 4-connected region that encloses the largest area; holes (background not
8-connected to the outside: a gap between two diagonal pixels leads out) and smaller islands
are left out (a BrushLabels config keeps them: brush results are the exact mask).
"""

from __future__ import annotations

import numpy as np


def largest_outline(mask: np.ndarray) -> np.ndarray | None:
    """The outer boundary of the mask's largest region.

    Args:
        mask: bool [H, W].

    Returns:
        float64 [N, 2] vertices (X, Y) in pixel-corner coordinates, clockwise on screen (Y
        down), without repeating the first; None for an empty mask.
    """
    loops = [loop for loop in _loops(np.asarray(mask, dtype=bool)) if _area(loop) > 0]
    if not loops:
        return None
    return _corners(max(loops, key=_area)).astype(np.float64)


def _edges(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Directed boundary edges (start, end as [E, 2] (x, y) corners), foreground on the right
    of the direction of travel (screen coordinates): outer rings run clockwise, holes not."""
    padded = np.pad(mask, 1)
    inside = padded[1:-1, 1:-1]
    starts, ends = [], []
    # (neighbour offset (dy, dx), edge start and end relative to the pixel's top-left corner)
    sides = (
        ((-1, 0), (0, 0), (1, 0)),  # top: left to right
        ((0, 1), (1, 0), (1, 1)),  # right: top to bottom
        ((1, 0), (1, 1), (0, 1)),  # bottom: right to left
        ((0, -1), (0, 1), (0, 0)),  # left: bottom to top
    )
    h, w = mask.shape
    for (dy, dx), start, end in sides:
        neighbour = padded[1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w]
        ys, xs = np.nonzero(inside & ~neighbour)
        corner = np.stack([xs, ys], axis=1)
        starts.append(corner + start)
        ends.append(corner + end)
    return np.concatenate(starts), np.concatenate(ends)


def _loops(mask: np.ndarray) -> list[np.ndarray]:
    """The closed rings of boundary edges, each as its start corners [N, 2] in order."""
    starts, ends = _edges(mask)
    width = mask.shape[1] + 1
    outgoing: dict[int, list[int]] = {}
    for i, k in enumerate((starts[:, 1] * width + starts[:, 0]).tolist()):
        outgoing.setdefault(k, []).append(i)
    used = np.zeros(len(starts), dtype=bool)
    loops = []
    for first in range(len(starts)):
        if used[first]:
            continue
        loop: list[int] = []
        edge: int | None = first
        while edge is not None and not used[edge]:
            used[edge] = True
            loop.append(edge)
            end = ends[edge]
            free = [c for c in outgoing[int(end[1] * width + end[0])] if not used[c]]
            edge = _pick(free, ends[edge] - starts[edge], starts, ends)
        loops.append(starts[loop])
    return loops


def _pick(free: list[int], came: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> int | None:
    """The edge to follow: the only free one, or, at a corner where two regions touch
    diagonally (two ways on), the right turn, which keeps to the pixel just walked past, so
    diagonal neighbours stay separate 4-connected regions."""
    if len(free) <= 1:
        return free[0] if free else None
    right = (-int(came[1]), int(came[0]))  # (dx, dy) turned clockwise on screen (Y down)
    for c in free:
        if tuple((ends[c] - starts[c]).tolist()) == right:
            return c
    return free[0]


def _area(loop: np.ndarray) -> float:
    x, y = loop[:, 0].astype(np.float64), loop[:, 1].astype(np.float64)
    return 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(np.roll(x, -1), y))


def _corners(loop: np.ndarray) -> np.ndarray:
    """The vertices where the direction changes."""
    before = loop - np.roll(loop, 1, axis=0)
    after = np.roll(loop, -1, axis=0) - loop
    turns = (before != after).any(axis=1)
    return loop[turns]
