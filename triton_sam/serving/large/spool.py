"""Created images' pixels, spooled to disk: the server's memory never grows with the image.

A ``create`` reserves the image's bytes in its tenant's budget (``max_upload_bytes``, on
disk) and makes two ``.npy`` files (``numpy.lib.format.open_memmap``) in a private directory:
the pixels, and one byte per pixel position saying whether a ``put`` wrote it, so
``received`` counts each pixel once however the pieces overlap and ``complete`` is exact.
Both are written and read through the page cache, a piece or a block at a time. The files
are deleted when the image is closed or evicted, and the directory at shutdown.

:class:`Upload` reads like a dataset (``shape``, ``dtype``, ``axes``, ``levels``,
``read(rows, cols, z=None, level=0)``, ``close()``), so predictions never care where the
pixels come from.
"""

from __future__ import annotations

import math
import os
import secrets
import shutil
import tempfile
import threading

import numpy as np
from numpy.lib.format import open_memmap

from .. import protocol as envelope
from ..bounds import RequestError

AXES = ("yx", "yxc", "zyx", "zyxc")
CHANNELS = (1, 3)


def axes_of(shape: tuple[int, ...], axes: str | None) -> str:
    """The axes of a created image: given, or read from its shape (3 sides are
    ``[rows, cols, channels]`` when the last is 1 or 3, else ``[z, rows, cols]``).

    Raises:
        RequestError: (``request.axes`` / ``request.shape``) unknown axes, a rank they
            contradict, or channels other than 1 or 3.
    """
    if axes is None:
        axes = {2: "yx", 3: "yxc" if shape[-1] in CHANNELS else "zyx", 4: "zyxc"}.get(len(shape))
        if axes is None:
            raise RequestError("request.shape", f"got {list(shape)}, expected 2 to 4 sides")
    if axes not in AXES:
        raise RequestError("request.axes", f"got {axes!r}, expected one of {list(AXES)}")
    if len(axes) != len(shape) or min(shape) < 1:
        raise RequestError(
            "request.shape", f"got {list(shape)}, expected {len(axes)} sides >= 1 ({axes})"
        )
    if axes.endswith("c") and shape[-1] not in CHANNELS:
        raise RequestError("request.shape", f"got {shape[-1]} channels, expected 1 or 3")
    return axes


class Spool:
    """Uploads on disk, bounded per tenant.

    Args:
        directory: where the files go ("" or None: a private temporary directory, removed by
            :meth:`close`).
        max_bytes: a tenant's uploads on disk (pixels and their written-marks).
    """

    def __init__(self, directory: str | None, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._own = not directory
        if directory:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        self.directory = directory or tempfile.mkdtemp(prefix="triton_sam_large_")
        self.used: dict[str, int] = {}

    def create(self, tenant: str, shape: tuple[int, ...], dtype: str, axes: str) -> Upload:
        """A new empty upload of ``tenant``.

        Raises:
            ProtocolError: ``LimitExceeded`` (``request.shape``) past the tenant's budget.
        """
        # Python's integers: a hostile shape must not wrap around int64 into a small number
        positions = math.prod(shape[:-1] if axes.endswith("c") else shape)
        need = math.prod(shape) * np.dtype(dtype).itemsize + positions
        used = self.used.get(tenant, 0)
        if used + need > self.max_bytes:
            raise envelope.ProtocolError(
                envelope.ERR_LIMIT,
                f"request.shape: {list(shape)} {dtype} needs {need} bytes on the server; you "
                f"hold {used} of max_upload_bytes = {self.max_bytes} (close images first)",
                "request.shape",
            )
        path = os.path.join(self.directory, secrets.token_hex(8))
        os.mkdir(path, mode=0o700)
        try:
            upload = Upload(path, shape, dtype, axes, lambda: self._release(tenant, need))
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        self.used[tenant] = used + need
        return upload

    def _release(self, tenant: str, size: int) -> None:
        left = self.used.get(tenant, 0) - size
        if left > 0:
            self.used[tenant] = left
        else:
            self.used.pop(tenant, None)

    def close(self) -> None:
        if self._own:
            shutil.rmtree(self.directory, ignore_errors=True)


class Upload:
    """One created image's pixels on disk (a source: see the module doc)."""

    def __init__(self, path: str, shape, dtype: str, axes: str, release) -> None:
        self.path, self.shape, self.axes = path, tuple(shape), axes
        self.levels = (self.shape,)  # each pyramid level's shape: an upload has one
        self.dtype = np.dtype(dtype)
        self._release = release
        self._pixels = open_memmap(os.path.join(path, "pixels.npy"), "w+", self.dtype, shape)
        marks = self.shape[:-1] if axes.endswith("c") else self.shape
        self._written = open_memmap(os.path.join(path, "written.npy"), "w+", np.uint8, marks)
        self.total = math.prod(marks)
        self.received = 0
        self._lock = threading.Lock()  # puts run on a thread pool; one at a time per image

    @property
    def complete(self) -> bool:
        return self.received == self.total

    def put(self, offset: tuple[int, ...], pixels: np.ndarray) -> int:
        """Write one piece at ``offset`` ([row, col], or [z, row, col] for a volume: one
        slice's piece); answers the pixels received so far.

        Raises:
            RequestError: (``request.offset`` / ``pixels``) an offset of the wrong rank, a
                piece outside the shape, of another dtype or channel count, or not finite.
        """
        volume = self.axes.startswith("z")
        if len(offset) != (3 if volume else 2):
            wanted = "[z, row, col]" if volume else "[row, col]"
            raise RequestError("request.offset", f"got {list(offset)}, expected {wanted}")
        channels = self.shape[-1] if self.axes.endswith("c") else None
        if channels is None and pixels.ndim == 3 and pixels.shape[2] == 1:
            pixels = pixels[..., 0]  # a grey piece travels as [h, w, 1]
        plane = (self.shape[1:] if volume else self.shape)[:2]
        want = (-1, -1) if channels is None else (-1, -1, channels)
        if (
            pixels.dtype != self.dtype
            or pixels.ndim != len(want)
            or (channels is not None and pixels.shape[-1] != channels)
        ):
            raise RequestError(
                "pixels",
                f"got {pixels.dtype} {list(pixels.shape)}, expected {self.dtype} "
                f"[rows, cols{', ' + str(channels) if channels else ''}]",
            )
        if self.dtype.kind == "f" and not np.isfinite(pixels).all():
            raise RequestError("pixels", "got NaN or infinity, expected finite values")
        z, (r, c) = (offset[0] if volume else None), offset[-2:]
        h, w = pixels.shape[:2]
        if (
            (volume and not 0 <= z < self.shape[0])
            or min(r, c) < 0
            or (r + h > plane[0] or c + w > plane[1])
        ):
            raise RequestError(
                "request.offset",
                f"a {h}x{w} piece at {list(offset)} is outside the image {list(self.shape)}",
            )
        where = (slice(r, r + h), slice(c, c + w))
        if volume:
            where = (z, *where)
        with self._lock:
            if self._pixels is None:
                raise RequestError("request.handle", "the image was closed during this put")
            self._pixels[where] = pixels
            fresh = int(h * w - np.count_nonzero(self._written[where]))
            self._written[where] = 1
            self.received += fresh
            return self.received

    def read(self, rows: slice, cols: slice, z: int | None = None, level: int = 0) -> np.ndarray:
        """A copy of the pixels of ``rows`` x ``cols`` (of slice ``z`` in a volume)."""
        if level != 0:
            raise RequestError("level", f"got {level}, an upload has one level (0)")
        pixels = self._pixels
        if pixels is None:
            raise RequestError("request.handle", "the image was closed")
        if self.axes.startswith("z"):
            return np.array(pixels[z, rows, cols])
        return np.array(pixels[rows, cols])

    def close(self) -> None:
        """Delete the files and give the bytes back to the tenant's budget (once)."""
        with self._lock:
            if self._release is None:
                return
            self._pixels = self._written = None
            release, self._release = self._release, None
        shutil.rmtree(self.path, ignore_errors=True)
        release()
