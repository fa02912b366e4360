"""One opened image or volume, whatever its format: axes, pyramid levels and region reads.

Every reader (:mod:`.zarr_source`, :mod:`.n5_source`, :mod:`.tiff_source`) hands this module
its arrays in their own axis order (``native_axes``, letters ``t c z y x``; N5's reversed
order and tifffile's ``S``/``I`` already named) and :class:`Source` gives them one shape:
``yx``, ``yxc``, ``zyx`` or ``zyxc`` (time squeezed when it has one point, a single channel
and a single z slice squeezed, channels last: a 5-d OME-Zarr of one plane is ``yx``). A read
names a region (and a z slice) of one level in that level's own pixels and
decodes only the chunks, tiles or strips it touches: the arrays behind a source are lazy
(zarr arrays, tensorstore handles, memory maps), never the image in memory.

``MAX_CHUNK_BYTES`` bounds what one touched chunk costs: a reader decodes a chunk whole, so
a file stored as one 40,000 px strip would be decoded whole by the smallest read. Such a file
is refused at open with what to do (re-save it tiled or chunked).

Standard library and numpy only at import: shipped into Triton's stub with the large model.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from ..bounds import RequestError

# One decoded chunk (tile, strip, zarr/N5 chunk) at most: 64 MiB is a 4096 x 4096 uint32
# chunk, 64x the 512 x 512 uint16 tiles slides and OME-Zarr writers use, and a read of a
# largest block (2048 px a side) touches at most 4 of them at a time.
MAX_CHUNK_BYTES = 64 * 2**20
AXES = ("yx", "yxc", "zyx", "zyxc")
REGION_FIELD = "region"


class LevelArray(Protocol):
    """What a reader gives per level: a lazy array in its native axis order."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...] | None  # the decoded unit; None: memory-mapped, no decode

    def __getitem__(self, index: tuple) -> np.ndarray: ...


class Source:
    """One opened image or volume.

    Attributes:
        shape: the full-resolution shape, in ``axes`` order.
        dtype: the pixels' numpy dtype (native byte order).
        axes: ``"yx"``, ``"yxc"``, ``"zyx"`` or ``"zyxc"``.
        levels: the shape of each pyramid level in ``axes`` order, level 0 the full one
            (one entry when the image has no pyramid).
    """

    def __init__(
        self,
        arrays: Sequence[LevelArray],
        native_axes: str,
        *,
        field: str,
        close: Callable[[], None] | None = None,
    ) -> None:
        """Checks the arrays and works out the axes.

        Args:
            arrays: one lazy array per level, level 0 first, all in ``native_axes`` order.
            native_axes: one letter of ``tczyx`` per dimension of the arrays.
            field: the request field errors name.
            close: releases the reader's files (called by :meth:`close`).

        Raises:
            RequestError: a dtype that is not integer or float (bool and complex included),
                more than one time point, no y or x axis, levels that disagree, or a chunk
                above ``MAX_CHUNK_BYTES``.
        """
        self._arrays = list(arrays)
        self._native = native_axes
        self._close = close
        try:
            self.dtype = _pixel_dtype(self._arrays[0].dtype, field)
            self._index_axes = _index_axes(native_axes, self._arrays[0].shape, field)
            kept = {a for a, index in self._index_axes.items() if not isinstance(index, int)}
            self.axes = "".join(a for a in "zyxc" if a in kept)
            self.levels = tuple(self._level_shape(a, field) for a in self._arrays)
        except BaseException:
            self.close()
            raise
        self.shape = self.levels[0]

    def _level_shape(self, array: LevelArray, field: str) -> tuple[int, ...]:
        if len(array.shape) != len(self._native) or array.dtype != self._arrays[0].dtype:
            raise RequestError(field, "its pyramid levels differ in dimensions or dtype")
        if array.chunks is not None:
            chunk_bytes = math.prod(array.chunks) * self.dtype.itemsize
            if chunk_bytes > MAX_CHUNK_BYTES:
                raise RequestError(
                    field,
                    f"got chunks (tiles or strips) of {array.chunks}, {chunk_bytes / 2**20:.0f} "
                    f"MiB each; expected at most {MAX_CHUNK_BYTES // 2**20} MiB, since a read "
                    "decodes every chunk it touches whole: re-save it tiled or chunked "
                    "(e.g. 512 x 512)",
                )
        size = dict(zip(self._native, array.shape, strict=True))
        return tuple(size[a] for a in self.axes)

    def read(self, rows: slice, cols: slice, z: int | None = None, level: int = 0) -> np.ndarray:
        """The pixels of a region of one level.

        Args:
            rows, cols: ``[start, stop)`` in that level's pixels (step 1), inside the level.
            z: the slice of a volume (required for ``zyx``/``zyxc``, refused otherwise).
            level: the pyramid level (0: full resolution).

        Returns:
            A fresh array, [h, w] (``yx``/``zyx``) or [h, w, c], of ``dtype``.

        Raises:
            RequestError: a level, z or region outside the image.
        """
        if not 0 <= level < len(self.levels):
            raise RequestError("request.level", f"got {level}, expected 0..{len(self.levels) - 1}")
        shape = dict(zip(self.axes, self.levels[level], strict=True))
        picks = {"y": _span(rows, shape["y"], "rows"), "x": _span(cols, shape["x"], "cols")}
        z = _slice_index(z, shape.get("z"))
        if z is not None:
            picks["z"] = z
        index = tuple(picks.get(a, self._index_axes[a]) for a in self._native)
        block = np.asarray(self._arrays[level][index])
        kept = [a for a, i in zip(self._native, index, strict=True) if isinstance(i, slice)]
        block = np.transpose(block, [kept.index(a) for a in "yxc" if a in kept])
        return np.ascontiguousarray(block, dtype=self.dtype)

    def close(self) -> None:
        """Releases the files behind the source (idempotent)."""
        close, self._close = self._close, None
        if close is not None:
            close()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pixel_dtype(dtype: np.dtype, field: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.kind not in "uif" or dtype.fields is not None:
        raise RequestError(
            field,
            f"got pixels of dtype {dtype}, expected integers or floats (bool, complex and "
            "structured arrays have no intensity to map): convert it first",
        )
    return dtype.newbyteorder("=")


def _index_axes(native: str, shape: tuple[int, ...], field: str) -> dict[str, object]:
    """What each native axis is read with: ``slice(None)`` for y, x and channels, 0 for
    squeezed axes (time, and a single channel or z slice), ``None`` for z (the read's)."""
    if len(native) != len(set(native)) or set(native) - set("tczyx"):
        raise RequestError(field, f"got axes {native!r}, expected distinct letters of 'tczyx'")
    if "y" not in native or "x" not in native:
        raise RequestError(field, f"got axes {native!r}, expected a y and an x axis")
    size = dict(zip(native, shape, strict=True))
    if size.get("t", 1) != 1:
        raise RequestError(
            field,
            f"got a time series of {size['t']} points, expected one image or volume: "
            "store one time point per dataset",
        )
    index: dict[str, object] = {"y": slice(None), "x": slice(None)}
    if "t" in size:
        index["t"] = 0
    if "c" in size:
        index["c"] = 0 if size["c"] == 1 else slice(None)
    if "z" in size:
        index["z"] = 0 if size["z"] == 1 else None
    if 0 in shape:
        raise RequestError(field, f"got an empty image of shape {tuple(shape)}")
    return index


def _integer(value: object) -> int | None:
    """``value`` as an int when it is one (numpy integers too, bool not), else None."""
    if isinstance(value, (bool, np.bool_)) or not hasattr(value, "__index__"):
        return None
    return operator.index(value)


def _span(region: slice, size: int, name: str) -> slice:
    start, stop = _integer(region.start), _integer(region.stop)
    if start is None or stop is None or region.step not in (None, 1):
        raise RequestError(REGION_FIELD, f"{name}: got {region}, expected [start, stop) ints")
    if not 0 <= start < stop <= size:
        raise RequestError(
            REGION_FIELD, f"{name}: got [{start}, {stop}), expected inside [0, {size})"
        )
    return slice(start, stop)


def _slice_index(z: int | None, depth: int | None) -> int | None:
    if depth is None:
        if z is not None:
            raise RequestError("request.z", f"got {z}, expected none: the image is 2-d")
        return None
    index = _integer(z)
    if index is None or not 0 <= index < depth:
        raise RequestError("request.z", f"got {z!r}, expected a slice in [0, {depth})")
    return index


def infer_axes(shape: tuple[int, ...], field: str) -> str:
    """Axes of an array that carries none (a plain zarr array, N5 dataset, TIFF page): 2-d
    is ``yx``; 3-d is ``yxc`` when its last dim is at most 4 (RGB(A), micro-sam's reading)
    and ``zyx`` otherwise; 4-d ``zyxc`` when its last dim is at most 4."""
    channels = len(shape) >= 3 and shape[-1] <= 4
    axes = {2: "yx", 3: "yxc" if channels else "zyx", 4: "zyxc" if channels else None}
    found = axes.get(len(shape))
    if found is None:
        raise RequestError(
            field,
            f"got an array of shape {tuple(shape)}, expected (y, x), (y, x, c), (z, y, x) or "
            "(z, y, x, c) with at most 4 channels last; an OME-Zarr names its axes",
        )
    return found


def level_index(key: str | None, count: int) -> int:
    """The pyramid level a ``key`` names (OME-Zarr, pyramidal TIFF): None is level 0."""
    if key is None:
        return 0
    if not (key.isascii() and key.isdigit()) or int(key) >= count:
        raise RequestError(
            "request.key", f"got {key!r}, expected a pyramid level index in 0..{count - 1}"
        )
    return int(key)
