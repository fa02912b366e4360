"""Intensities -> SAM's uint8 RGB: the one mapping the server, the Python client and the page use.

Kinds (:data:`~triton_sam.serving.protocol.large.MAPPING_KINDS`):

- ``none``: uint8 pixels as they are; what the session model does with a small image.
- ``range`` (``min``, ``max``): ``(x - min) / (max - min) * 255`` in float32 (each operand
  cast to float32 first; ``min < max`` as float32), clipped to
  [0, 255], rounded half to even (``np.rint``); NaN is 0, +inf 255, -inf 0.
- ``percentile`` (``low``, ``high``, default 1 and 99): ``range`` with ``min``/``max`` the
  ``low``/``high`` percentiles of a bounded sample of the image (:func:`resolve_mapping`),
  numpy's default ``linear`` interpolation (type 7 of Hyndman and Fan), NaN ignored; the
  default for every dtype but uint8.
- ``tile_minmax``: each block stretched from its own per-channel min to max, exactly as
  micro-sam 1.8 does before embedding a tile (``micro_sam/util.py`` ``_to_image``): float32,
  ``x - min``, ``/ (max + 1e-7)``, ``* 255``, truncated to uint8.

Channels, for every kind as micro-sam's ``_to_image``: grey is replicated to 3 channels, two
channels get a zero third, more than three keep the first three (RGBA drops its alpha).

Standard library and numpy only: shipped into Triton's stub with the large model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..bounds import RequestError
from ..protocol.large import MAPPING_KINDS
from .source import Source

DEFAULT_LOW = 1.0
DEFAULT_HIGH = 99.0
SAMPLE_PATCH = 256  # pixels a side of one patch of a percentile sample
MICRO_SAM_EPS = np.float32(1e-7)  # micro-sam's divisor guard (its python float, as float32)
_PARAMS = {"none": (), "range": ("min", "max"), "percentile": ("low", "high"), "tile_minmax": ()}


@dataclass(frozen=True)
class Mapping:
    """A mapping to uint8 RGB; the fields its kind does not use are None."""

    kind: str
    low: float | None = None
    high: float | None = None
    min: float | None = None
    max: float | None = None


def parse_mapping(value: dict | None, dtype: Any, *, field: str = "request.mapping") -> Mapping:
    """The mapping a request asks for, checked against the image's dtype.

    Args:
        value: the request's ``mapping`` object, or None for the dtype's default (``none``
            for uint8, ``percentile`` 1/99 otherwise).
        dtype: the image's pixel dtype.
        field: the request field refusals name.

    Raises:
        RequestError: an unknown kind or key, ``none`` on pixels that are not uint8,
            non-finite bounds, ``min >= max``, or percentiles outside ``0 <= low < high <=
            100``.
    """
    uint8 = np.dtype(dtype) == np.uint8
    if value is None:
        return Mapping("none") if uint8 else Mapping("percentile", DEFAULT_LOW, DEFAULT_HIGH)
    if not isinstance(value, dict) or value.get("kind") not in MAPPING_KINDS:
        raise RequestError(field, f"got {value!r}, expected an object with kind in {MAPPING_KINDS}")
    kind = value["kind"]
    unknown = set(value) - {"kind", *_PARAMS[kind]}
    if unknown:
        raise RequestError(
            field, f"{kind}: unknown keys {sorted(unknown)}, expected {_PARAMS[kind]}"
        )
    if kind == "none" and not uint8:
        raise RequestError(
            field,
            f"none keeps uint8 pixels as they are; these are {np.dtype(dtype)}: use range "
            "(min, max) or percentile (low, high)",
        )
    if kind == "range":
        return _range(_number(value, "min", None, field), _number(value, "max", None, field), field)
    if kind == "percentile":
        low = _number(value, "low", DEFAULT_LOW, field)
        high = _number(value, "high", DEFAULT_HIGH, field)
        if not 0 <= low < high <= 100:
            raise RequestError(
                field, f"got low {low}, high {high}; expected 0 <= low < high <= 100"
            )
        return Mapping("percentile", low=low, high=high)
    return Mapping(kind)


def _number(value: dict, name: str, default: float | None, field: str) -> float:
    number = value.get(name, default)
    if (
        isinstance(number, bool)
        or not isinstance(number, (int, float))
        or not math.isfinite(number)
    ):
        raise RequestError(field, f"{name}: got {number!r}, expected a finite number")
    return float(number)


def _range(low: float, high: float, field: str) -> Mapping:
    if not np.float32(low) < np.float32(high):  # the arithmetic is float32's (to_rgb)
        raise RequestError(field, f"range: got min {low}, max {high}; expected min < max")
    return Mapping("range", min=low, max=high)


def resolve_mapping(
    mapping: Mapping, source: Source, sample_pixels: int, z: int | None = None
) -> Mapping:
    """A ``percentile`` mapping as the ``range`` it stands for; other kinds as they are.

    The sample: the coarsest pyramid level when it holds at most ``sample_pixels`` pixels
    (read whole), else patches of ``SAMPLE_PATCH`` px spread evenly over that level, at most
    ``sample_pixels`` pixels in all. A volume is sampled on slice ``z`` (its middle slice
    when None). Channels past the third, NaN and infinities are left out. A constant
    sample gives ``max = min + 1`` (every pixel maps to 0), an empty one ``0..1``.

    Args:
        mapping: from :func:`parse_mapping`.
        source: the opened image.
        sample_pixels: the most pixels read (``LargeSettings.sample_pixels``).
        z: the volume's slice to sample.
    """
    if mapping.kind != "percentile":
        return mapping
    sample = _sample(source, sample_pixels, z)
    if "c" in source.axes:
        sample = sample[..., :3]  # the channels SAM sees (to_rgb drops the rest)
    values = sample.astype(np.float64).ravel()
    values = values[np.isfinite(values)]
    if values.size == 0:
        return Mapping("range", min=0.0, max=1.0)
    low, high = (float(v) for v in np.percentile(values, [mapping.low, mapping.high]))
    return Mapping(
        "range", min=low, max=high if np.float32(high) > np.float32(low) else _above(low)
    )


def _above(value: float) -> float:
    """A max just above ``value`` that float32 still tells apart (``value + 1`` if it can)."""
    if np.float32(value + 1.0) > np.float32(value):
        return value + 1.0
    return float(np.nextafter(np.float32(value), np.float32(np.inf)))


def _sample(source: Source, sample_pixels: int, z: int | None) -> np.ndarray:
    level = len(source.levels) - 1
    shape = dict(zip(source.axes, source.levels[level], strict=True))
    if "z" in shape and z is None:
        z = shape["z"] // 2
    rows, cols = shape["y"], shape["x"]
    if rows * cols <= sample_pixels:
        return source.read(slice(0, rows), slice(0, cols), z, level)
    side = min(SAMPLE_PATCH, rows, cols)
    count = max(1, sample_pixels // (side * side))
    per_row = max(1, math.isqrt(count))
    patches = [
        source.read(slice(r, r + side), slice(c, c + side), z, level)
        for r in _starts(rows, side, per_row)
        for c in _starts(cols, side, max(1, count // per_row))
    ]
    return np.stack(patches)


def _starts(size: int, side: int, count: int) -> list[int]:
    """``count`` patch starts spread evenly over ``[0, size - side]``."""
    return sorted({round(i * (size - side) / max(1, count - 1)) for i in range(count)})


def to_rgb(block: np.ndarray, mapping: Mapping) -> np.ndarray:
    """Maps a block of pixels to SAM's input.

    Args:
        block: [h, w] or [h, w, c] pixels (a region read).
        mapping: a resolved mapping (``percentile`` turned into ``range`` by
            :func:`resolve_mapping`).

    Returns:
        uint8 [h, w, 3], a fresh array.

    Raises:
        ValueError: an unresolved ``percentile`` mapping, ``none`` on non-uint8 pixels, or
            a block that is not 2-d or 3-d.
    """
    rgb = _three_channels(np.asarray(block))
    if mapping.kind == "none":
        if rgb.dtype != np.uint8:
            raise ValueError(f"mapping none needs uint8 pixels, got {rgb.dtype}")
        return np.array(rgb, copy=True)
    if mapping.kind == "range":
        low, high = np.float32(mapping.min), np.float32(mapping.max)
        scaled = (rgb.astype(np.float32) - low) / (high - low) * np.float32(255)
        scaled = np.nan_to_num(scaled, nan=0.0, posinf=255.0, neginf=0.0)
        return np.rint(np.clip(scaled, 0.0, 255.0)).astype(np.uint8)
    if mapping.kind == "tile_minmax":
        stretched = rgb.astype(np.float32)
        stretched -= stretched.min(axis=(0, 1))[None, None]
        stretched /= stretched.max(axis=(0, 1))[None, None] + MICRO_SAM_EPS
        return (stretched * 255).astype(np.uint8)
    raise ValueError(f"mapping {mapping.kind!r} must be resolved first (resolve_mapping)")


def _three_channels(block: np.ndarray) -> np.ndarray:
    if block.ndim == 2:
        block = block[..., None]
    if block.ndim != 3:
        raise ValueError(f"expected [h, w] or [h, w, c] pixels, got shape {block.shape}")
    channels = block.shape[-1]
    if channels == 1:
        return np.concatenate([block] * 3, axis=-1)
    if channels == 2:
        return np.concatenate([block, np.zeros(block.shape[:2] + (1,), block.dtype)], axis=-1)
    return block[..., :3]


def mapping_json(mapping: Mapping) -> dict:
    """The mapping as the server answers it (``kind`` and the fields its kind uses)."""
    return {"kind": mapping.kind, **{k: getattr(mapping, k) for k in _PARAMS[mapping.kind]}}
