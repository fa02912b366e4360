"""The ``read`` op: a block of a large image as SAM sees it (the mapping applied), uint8 RGB.

What the everything model reads a tile by (over BLS, so pixels never pass through a client)
and what the page's tile pyramid is drawn from. At most ``max_block`` pixels a side come
back. A coarse view of a large block is asked for with a pyramid ``level`` of the source (the
block stays in full-resolution pixels and is scaled to the level) or with a ``step`` (every
step-th pixel); without a pyramid, a step is read in sub-blocks of at most ``max_block``
pixels a side, each thinned as it arrives, so memory stays bounded whatever the block.
"""

from __future__ import annotations

import math

import numpy as np

from .. import protocol as envelope
from ..bounds import RequestError
from . import requests

MAX_STEP = 1024


def read_block(image, request: dict, max_block: int, to_rgb) -> tuple[dict, np.ndarray]:
    """``(answer, rgb)`` of a ``read`` on ``image`` (a :class:`~.handles.Image`).

    Raises:
        RequestError: a field (``request.block``, ``step``, ``level``, ``z``) is malformed.
        ProtocolError: ``LimitExceeded``: more than ``max_block`` pixels a side would come back.
    """
    z = requests.optional_z(request, image.depth)
    r0, c0, r1, c1 = requests.ints(request, "block", (4,))
    rows, cols = image.grid.shape
    if not (r0 < r1 <= rows and c0 < c1 <= cols):
        raise RequestError(
            requests.field("block"),
            f"got {[r0, c0, r1, c1]}, expected row0 < row1 <= {rows}, col0 < col1 <= {cols}",
        )
    step = requests.integer(request, "step", maximum=MAX_STEP) if "step" in request else 1
    if step < 1:
        raise RequestError(requests.field("step"), f"got {step}, expected >= 1")
    levels = image.source.levels
    level = requests.integer(request, "level", maximum=len(levels) - 1) if "level" in request else 0
    (r0, c0, r1, c1), plane = _at_level(image, levels[level], (r0, c0, r1, c1))
    out = (math.ceil((r1 - r0) / step), math.ceil((c1 - c0) / step))
    if max(out) > max_block:
        raise envelope.ProtocolError(
            envelope.ERR_LIMIT,
            f"{requests.field('block')}: {out[0]}x{out[1]} pixels would come back, expected at "
            f"most max_block = {max_block} a side; ask a coarser level or a larger step",
            requests.field("block"),
        )
    pixels = _thinned(image.source, (r0, c0, r1, c1), z, level, step, max_block)
    mapping = image.resolved if image.resolved is not None else image.mapping
    rgb = np.ascontiguousarray(to_rgb(pixels, mapping))
    answer = {"size": list(rgb.shape[:2]), "level": level, "step": step, "plane": list(plane)}
    return answer, rgb


def _at_level(image, level_shape, block):
    """The block in a level's own pixels (rounded outwards), and that level's plane."""
    axes = image.source.axes
    plane = (level_shape[axes.index("y")], level_shape[axes.index("x")])
    full = image.grid.shape
    fy, fx = full[0] / plane[0], full[1] / plane[1]
    r0, c0, r1, c1 = block
    scaled = (
        int(r0 // fy),
        int(c0 // fx),
        min(plane[0], max(int(r0 // fy) + 1, math.ceil(r1 / fy))),
        min(plane[1], max(int(c0 // fx) + 1, math.ceil(c1 / fx))),
    )
    return scaled, plane


def _thinned(source, block, z, level, step, max_block) -> np.ndarray:
    """Every ``step``-th pixel of ``block``, read in sub-blocks of at most ``max_block`` a
    side (each aligned to the step, so the result is the same as one read then thinned)."""
    r0, c0, r1, c1 = block
    if step == 1:
        return source.read(slice(r0, r1), slice(c0, c1), z, level)
    band = max(step, (max_block // step) * step)
    parts = []
    for top in range(r0, r1, band):
        row = []
        for left in range(c0, c1, band):
            piece = source.read(
                slice(top, min(top + band, r1)), slice(left, min(left + band, c1)), z, level
            )
            row.append(piece[::step, ::step])
        parts.append(np.concatenate(row, axis=1))
    return np.concatenate(parts, axis=0)
