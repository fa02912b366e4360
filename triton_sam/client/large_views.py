"""A large image's pixels as the server maps them: blocks read over the wire, and a volume
view that numpy-style code (the volume tracker) slices like an array.

The ``read`` op answers a block's pixels after the image's mapping, uint8 RGB, so what the
client shows or tracks is exactly what SAM sees on the server; at most the server's
``max_block`` pixels a side per read (a ``step`` or a pyramid ``level`` covers more).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from triton_sam.errors import InputValidationError, ServerError
from triton_sam.serving.protocol import large as protocol


def read(image, block, z: int | None, *, step: int = 1, level: int = 0) -> np.ndarray:
    """``image.read``: the mapped pixels of ``block`` (row0, col0, row1, col1)."""
    values = [int(v) for v in np.asarray(block).reshape(-1)]
    rows, cols = image.image_size
    if len(values) != 4 or not (
        0 <= values[0] < values[2] <= rows and 0 <= values[1] < values[3] <= cols
    ):
        raise InputValidationError(
            "block", f"got {block!r}, expected (row0, col0, row1, col1) inside {rows}x{cols}"
        )
    if int(step) < 1 or int(level) < 0:
        raise InputValidationError("step", f"got step {step}, level {level}: expected >= 1, >= 0")
    fields: dict[str, Any] = {"block": values, "z": z}
    if step != 1:
        fields["step"] = int(step)
    if level:
        fields["level"] = int(level)
    body = {"op": "read", "handle": image.handle}
    body.update({k: v for k, v in fields.items() if v is not None})
    _, out = image.model.call_for(body, outputs=(protocol.RGB,))
    rgb = out[protocol.RGB]
    if rgb is None or rgb.ndim != 3 or rgb.shape[-1] != 3 or rgb.dtype != np.uint8:
        raise ServerError(f"{image.model.model}: a read answered no uint8 [h, w, 3] pixels")
    return rgb


class ServerVolume:
    """A volume the server holds, sliced like a (z, rows, cols, 3) uint8 array: each slice
    ``[z, rows, cols]`` is one ``read`` (mapped RGB). Give it to
    :class:`~triton_sam.client.volume.VolumeTracker` to track through a dataset that lives on
    the server, a window at a time."""

    def __init__(self, image) -> None:
        if image.depth is None:
            raise InputValidationError("image", "not a volume: open a (z, y, x) dataset")
        self.image = image
        self.shape = (image.depth, *image.image_size, 3)
        self.dtype = np.dtype(np.uint8)

    def __getitem__(self, index) -> np.ndarray:
        z, rows, cols = index
        if not (isinstance(rows, slice) and isinstance(cols, slice)):
            raise InputValidationError("index", "expected [z, row slice, col slice]")
        r0, r1, _ = rows.indices(self.shape[1])
        c0, c1, _ = cols.indices(self.shape[2])
        return self.image.read((r0, c0, r1, c1), int(z))
