"""A large image's requests beyond one click: the options of ``open``/``create``, sending an
array in pieces, and precomputing tiles.

Both read and send a bounded amount at a time, whatever the image's size: an upload reads one
piece of the caller's array (``piece`` x ``piece`` pixels of one slice) per ``put``, so a
zarr, a dask array or tifffile's zarr store of a 40,000 px slide is never held whole here; a
precompute asks the server which tiles it holds, then sends the others' ids in batches.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from triton_sam.errors import InputValidationError, ServerError
from triton_sam.serving.protocol import large as protocol
from triton_sam.serving.tiles import Block, TileGrid


class LargeImage(Protocol):
    """What these functions use of :class:`~triton_sam.client.large_image.LargeImage` (a
    protocol, so this module does not import the one that imports it)."""

    dtype: str
    tile: tuple[int, ...]
    complete: bool

    @property
    def image_size(self) -> tuple[int, int]: ...

    @property
    def depth(self) -> int | None: ...

    def request(self, op: str, pixels: np.ndarray | None = None, **fields: Any) -> dict: ...

    def held_tiles(self, z: int | None = None) -> set[int]: ...


# What each dtype a caller may hold travels as (the protocol's DTYPES): exactly, for every
# value these hold (float32 represents every int8/int16 and rounds float64 to 24 bits, far
# finer than the 8 bits SAM sees after the mapping).
_WIRE_DTYPE = {
    "uint8": "uint8",
    "uint16": "uint16",
    "float32": "float32",
    "int8": "float32",
    "int16": "float32",
    "float16": "float32",
    "float64": "float32",
}


@dataclass(frozen=True)
class PrecomputeResult:
    """What a precompute did.

    Attributes:
        tiles: tiles touching the region.
        embedded: tiles the encoder ran for in this call.
        held: tiles the server held already (before, or by the time their batch arrived).
        cancelled: stopped early (``cancel`` set); the tiles not counted above were not sent.
    """

    tiles: int
    embedded: int
    held: int
    cancelled: bool = False

    @property
    def remaining(self) -> int:
        """Tiles neither embedded nor held: what a rerun would send."""
        return self.tiles - self.embedded - self.held


def wire_dtype(dtype: Any) -> str:
    """The protocol dtype an array of ``dtype`` is sent as.

    Raises:
        InputValidationError: (field ``array``) a dtype without a lossless-enough form.
    """
    name = np.dtype(dtype).name
    if name not in _WIRE_DTYPE:
        raise InputValidationError(
            "array",
            f"dtype {name}, expected one of {sorted(_WIRE_DTYPE)}; cast it first "
            "(e.g. array.astype('float32'), lazily for dask)",
        )
    return _WIRE_DTYPE[name]


def create_body(array: Any) -> dict[str, Any]:
    """The ``create`` request's shape and dtype for a caller's array (read: nothing).

    Raises:
        InputValidationError: (field ``array``) no shape/dtype, or not 2-4 dimensions.
    """
    shape = getattr(array, "shape", None)
    if shape is None or not hasattr(array, "dtype") or not hasattr(array, "__getitem__"):
        raise InputValidationError(
            "array", f"got {type(array).__name__}, expected an array (.shape, .dtype, slicing)"
        )
    if not 2 <= len(shape) <= 4 or min(shape) < 1:
        raise InputValidationError(
            "array",
            f"shape {tuple(shape)}, expected (rows, cols), (rows, cols, channels) or "
            "(z, rows, cols[, channels])",
        )
    return {"op": "create", "shape": [int(v) for v in shape], "dtype": wire_dtype(array.dtype)}


def _pair(value: Any, field: str, least: int) -> list[int] | None:
    """A side (int) or (rows, cols) as the wire's [rows, cols], each at least ``least``."""
    if value is None:
        return None
    sides = [value, value] if isinstance(value, (int, np.integer)) else list(value)
    if len(sides) != 2 or not all(isinstance(v, (int, np.integer)) and v >= least for v in sides):
        raise InputValidationError(
            field, f"got {value!r}, expected a side or (rows, cols), each >= {least}"
        )
    return [int(v) for v in sides]


def image_options(
    mapping: dict[str, Any] | None,
    tile: int | tuple[int, int] | None,
    halo: int | tuple[int, int] | None,
) -> dict[str, Any]:
    """The optional fields ``open`` and ``create`` share, checked (None: the server's).

    Raises:
        InputValidationError: naming ``mapping``, ``tile`` or ``halo``.
    """
    body: dict[str, Any] = {}
    if mapping is not None:
        kind = mapping.get("kind") if isinstance(mapping, dict) else None
        if kind not in protocol.MAPPING_KINDS:
            raise InputValidationError(
                "mapping",
                f"got {mapping!r}, expected a dict whose kind is one of "
                f"{list(protocol.MAPPING_KINDS)}, e.g. {{'kind': 'percentile', 'low': 1, "
                "'high': 99}",
            )
        body["mapping"] = dict(mapping)
    # A halo of 0 (no context) is a choice of its own, not "the server's default".
    for field, value, least in (("tile", tile, 1), ("halo", halo, 0)):
        if (pair := _pair(value, field, least)) is not None:
            body[field] = pair
    return body


def pieces(image: LargeImage, piece: int) -> Iterator[tuple[list[int], tuple[slice, ...]]]:
    """Each piece of the image once, as its ``put`` offset and the slices reading it: slices
    of one z, ``piece`` x ``piece`` pixels (cut at the edges), row-major."""
    rows, cols = image.image_size
    depth = image.depth
    for z in range(depth) if depth is not None else (None,):
        for r in range(0, rows, piece):
            for c in range(0, cols, piece):
                window = (slice(r, min(r + piece, rows)), slice(c, min(c + piece, cols)))
                if z is None:
                    yield [r, c], window
                else:
                    yield [z, r, c], (z, *window)


def check_piece(piece: Any) -> int:
    """``piece`` (a side, pixels) checked against the protocol's default piece bound.

    Raises:
        InputValidationError: (field ``piece``) not an int of 1..4096.
    """
    side = int(protocol.DEFAULT_MAX_PIECE_PIXELS**0.5)
    if not isinstance(piece, int) or not 1 <= piece <= side:
        raise InputValidationError("piece", f"got {piece!r}, expected a side of 1..{side}")
    return piece


def put_pieces(image: LargeImage, array: Any, *, piece: int, progress: bool) -> None:
    """Send ``array`` to the created ``image``, one piece per ``put`` (``piece`` checked).

    Raises:
        ServerError: every piece was put and the server still says the image is incomplete.
    """
    from tqdm import tqdm

    dtype = np.dtype(image.dtype)
    rows, cols = image.image_size
    total = rows * cols * (image.depth or 1)
    with tqdm(total=total, unit="px", unit_scale=True, disable=not progress, desc="upload") as bar:
        for offset, where in pieces(image, piece):
            pixels = np.ascontiguousarray(np.asarray(array[where]), dtype=dtype)
            if pixels.ndim == 2:  # the wire's pieces are [rows, cols, channels]
                pixels = pixels[..., None]
            answer = image.request("put", pixels, offset=offset)
            bar.update(pixels.shape[0] * pixels.shape[1])
    if not answer.get("complete", False):
        raise ServerError(
            f"put: every piece of {image.shape} was sent, but the server has "
            f"{answer.get('received')} pixels and says the image is incomplete"
        )
    image.complete = True


def region_tiles(image: LargeImage, region: tuple[int, int, int, int] | None) -> list[int]:
    """Ids of the tiles whose core overlaps ``region`` (row0, col0, row1, col1; None: all).

    Raises:
        InputValidationError: (field ``region``) not four ints with 0 <= row0 < row1 <= rows
            and 0 <= col0 < col1 <= cols.
    """
    rows, cols = image.image_size
    grid = TileGrid((rows, cols), (image.tile[0], image.tile[1]))
    if region is None:
        return list(range(len(grid)))
    values = list(region) if isinstance(region, (tuple, list)) else []
    ok = len(values) == 4 and all(isinstance(v, (int, np.integer)) for v in values)
    if not ok or not (0 <= values[0] < values[2] <= rows and 0 <= values[1] < values[3] <= cols):
        raise InputValidationError(
            "region",
            f"got {region!r}, expected (row0, col0, row1, col1) with 0 <= row0 < row1 <= "
            f"{rows} and 0 <= col0 < col1 <= {cols}",
        )
    r0, c0, r1, c1 = (int(v) for v in values)
    return grid.tiles_touching(Block((r0, c0), (r1, c1)))


def precompute(
    image: LargeImage,
    region: tuple[int, int, int, int] | None,
    z: int | None,
    *,
    progress: bool,
    batch: int,
    cancel: threading.Event | None,
) -> PrecomputeResult:
    """:meth:`LargeImage.precompute <triton_sam.client.large_image.LargeImage.precompute>`
    (``z`` checked): status first, then the tiles not held, ``batch`` ids per ``embed``."""
    if not isinstance(batch, int) or batch < 1:
        raise InputValidationError("batch", f"got {batch!r}, expected an integer >= 1")
    wanted = region_tiles(image, region)
    held_before = image.held_tiles(z)
    todo = [t for t in wanted if t not in held_before]
    embedded, held = 0, len(wanted) - len(todo)
    from tqdm import tqdm

    bar = tqdm(total=len(wanted), initial=held, unit="tile", disable=not progress, desc="embed")
    with bar:
        for start in range(0, len(todo), batch):
            if cancel is not None and cancel.is_set():
                return PrecomputeResult(len(wanted), embedded, held, cancelled=True)
            ids = todo[start : start + batch]
            answer = image.request("embed", z=z, tiles=ids)
            embedded += len(answer.get("embedded", ()))
            held += len(answer.get("held", ()))
            bar.update(len(ids))
    return PrecomputeResult(len(wanted), embedded, held)
