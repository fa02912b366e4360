"""An image or volume held in memory -> SAM's uint8 RGB, by the large model's one mapping.

The server maps a large image's intensities (16-bit, float) with
:mod:`triton_sam.serving.datasets.pixels` (the same code runs in the client and the page);
an application holding pixels in memory (a napari layer, a notebook array) maps them here
with that same code, so a slice it embeds whole reads exactly as the server's tiled path
reads the same image: uint8 as it is, any other dtype by its 1st..99th percentile sampled
as the server samples it (a volume on its middle slice), grey replicated to three channels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from triton_sam.errors import InputValidationError
from triton_sam.serving.bounds import RequestError
from triton_sam.serving.datasets import pixels
from triton_sam.serving.datasets.source import Source
from triton_sam.serving.protocol.large import DEFAULT_SAMPLE_PIXELS


class _InMemory:
    """A numpy array as the one pyramid level a :class:`Source` reads (no chunks: memory)."""

    chunks = None

    def __init__(self, array: np.ndarray) -> None:
        self._array = array
        self.shape = array.shape
        self.dtype = array.dtype

    def __getitem__(self, index: tuple) -> np.ndarray:
        return self._array[index]


def resolve_pixel_mapping(
    pixels_in: Any, *, volume: bool = False, mapping: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The mapping the server would use for ``pixels_in``, resolved (percentiles as a range).

    Args:
        pixels_in: (rows, cols[, channels]), or with ``volume`` (z, rows, cols[, channels]);
            channels last (1 to 4), any integer or float dtype.
        volume: the first axis is z (sampled on its middle slice, as the server does).
        mapping: as ``open_array`` takes it; None: the dtype's default (``none`` for uint8,
            percentile 1..99 otherwise).

    Returns:
        ``{"kind": "none"}``, ``{"kind": "range", "min": ..., "max": ...}`` or
        ``{"kind": "tile_minmax"}``: pass it to :func:`to_sam_rgb` for every slice.

    Raises:
        InputValidationError: (field ``mapping`` or ``image``) a bad mapping or array.
    """
    array = np.asarray(pixels_in)
    axes = ("zyx" if volume else "yx") + ("c" if array.ndim == (4 if volume else 3) else "")
    if array.ndim != len(axes) or (axes.endswith("c") and not 1 <= array.shape[-1] <= 4):
        expected = "(z, rows, cols[, channels])" if volume else "(rows, cols[, channels])"
        raise InputValidationError(
            "image", f"got an array of shape {array.shape}; expected {expected}, 1-4 channels"
        )
    try:
        parsed = pixels.parse_mapping(mapping, array.dtype, field="mapping")
        source = Source([_InMemory(array)], axes, field="image")
        resolved = pixels.resolve_mapping(parsed, source, DEFAULT_SAMPLE_PIXELS)
    except RequestError as e:
        raise InputValidationError(e.field, str(e).split(": ", 1)[-1]) from e
    return pixels.mapping_json(resolved)


def to_sam_rgb(pixels_in: Any, mapping: dict[str, Any] | None = None) -> np.ndarray:
    """One 2-D image (or slice) as SAM's HxWx3 uint8 RGB.

    Args:
        pixels_in: (rows, cols) or (rows, cols, channels), channels last.
        mapping: a resolved mapping from :func:`resolve_pixel_mapping` (pass the volume's to
            each of its slices so they read alike); None resolves this image's own.

    Returns:
        uint8 [rows, cols, 3], C-contiguous.

    Raises:
        InputValidationError: (field ``image`` or ``mapping``) a bad array or mapping.
    """
    array = np.asarray(pixels_in)
    if mapping is None:
        mapping = resolve_pixel_mapping(array)
    kind = mapping.get("kind")
    if kind == "percentile":
        raise InputValidationError(
            "mapping",
            "got an unresolved percentile mapping; resolve it with resolve_pixel_mapping first",
        )
    if kind not in ("none", "range", "tile_minmax"):
        raise InputValidationError(
            "mapping", f"got {mapping!r}; expected kind none, range or tile_minmax"
        )
    resolved = pixels.Mapping(kind, min=mapping.get("min"), max=mapping.get("max"))
    try:
        return np.ascontiguousarray(pixels.to_rgb(array, resolved))
    except ValueError as e:
        raise InputValidationError("image", str(e)) from e
