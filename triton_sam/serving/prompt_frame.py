"""Prompts from original pixels to the model's input frame, and masks back (numpy only).

Shared by the clients (``triton_sam.transforms`` / ``client.prompts`` call these) and the
``<family>_session`` model, which accepts prompts in original pixel coordinates and returns
finished masks for clients that are not ours. ``pre`` is anything with the attributes of
``triton_sam.models.spec.Preprocessing``. Coordinates are (X, Y) pixels; sizes (H, W).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import resample
from .intake import resized_hw

PADDING_LABEL = -1.0
BOX_LABELS = (2.0, 3.0)


def to_input_frame(points: np.ndarray, orig_hw: tuple[int, int], pre: Any) -> np.ndarray:
    """(X, Y) pixels of the original image [..., 2] -> the S x S input frame, float32.

    ``"square"`` with ``coord_rule="ratio"`` (transformers' processors: ``x * (S * (1 / w))``
    in float32), ``"square"`` otherwise (SAM2Transforms: ``x / w * S`` in float32),
    ``"longest_side"`` (ResizeLongestSide.apply_coords: ``x * (new_w / w)`` in float64).
    """
    h, w = orig_hw
    if pre.resize == "square" and pre.coord_rule == "ratio":
        out = np.asarray(points, np.float32).copy()
        one, size = np.float32(1), np.float32(pre.image_size)
        out[..., 0] = out[..., 0] * (size * (one / np.float32(w)))
        out[..., 1] = out[..., 1] * (size * (one / np.float32(h)))
        return out
    if pre.resize == "square":
        out = np.asarray(points, np.float32).copy()  # upstream casts before scaling
        out[..., 0] = out[..., 0] / np.float32(w)
        out[..., 1] = out[..., 1] / np.float32(h)
        return out * np.float32(pre.image_size)
    new_h, new_w = resized_hw((h, w), pre)
    out = np.asarray(points, np.float64).copy()
    out[..., 0] = out[..., 0] * (new_w / w)
    out[..., 1] = out[..., 1] * (new_h / h)
    return out.astype(np.float32)


def point_list(
    points: tuple[np.ndarray, np.ndarray] | None,
    box_xyxy: np.ndarray | None,
    orig_hw: tuple[int, int],
    pre: Any,
    *,
    box_before_points: bool,
    pad_with_box: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``point_list`` decoders' prompt: ``point_coords`` [1, N, 2], ``point_labels`` [1, N].

    Clicks (N x 2 pixels, N labels 0/1) and a box (4: x0, y0, x1, y1 pixels) as corners
    labelled 2/3, placed before the clicks (SAM2ImagePredictor) or after (SamPredictor), plus
    one padding point (0, 0) labelled -1 when there is no box (or always, ``pad_with_box``).
    """
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    if points is not None:
        parts.append((to_input_frame(points[0], orig_hw, pre), np.asarray(points[1])))
    if box_xyxy is not None:
        corners = to_input_frame(np.asarray(box_xyxy).reshape(2, 2), orig_hw, pre)
        parts.insert(0 if box_before_points else len(parts), (corners, np.array(BOX_LABELS)))
    if box_xyxy is None or pad_with_box:
        parts.append((np.zeros((1, 2)), np.array([PADDING_LABEL])))
    coords, labels = zip(*parts, strict=True)
    return (
        np.concatenate(coords).astype(np.float32)[None],
        np.concatenate(labels).astype(np.float32)[None],
    )


def upsample(low_res_logits: np.ndarray, orig_hw: tuple[int, int], pre: Any) -> np.ndarray:
    """Low-res logits [B, M, s, s] -> float32 [B, M, H, W] logits of the original image.

    ``"square"``: one bilinear resize (align_corners=False) to (H, W) (SAM2Transforms).
    ``"longest_side"``: bilinear to S x S, crop the unpadded part, bilinear to (H, W)
    (Sam.postprocess_masks). Threshold at 0 for binary masks.
    """
    h, w = orig_hw
    logits = low_res_logits
    if pre.resize == "longest_side":
        size = int(pre.image_size)
        new_h, new_w = resized_hw((h, w), pre)
        logits = resample.bilinear(logits, (size, size))[..., :new_h, :new_w]
    return resample.bilinear(logits, (h, w))


def mask_box(mask: np.ndarray) -> np.ndarray:
    """(x0, y0, x1, y1) of a bool [H, W] mask's pixels, inclusive, float32; zeros if empty."""
    ys = np.flatnonzero(mask.any(axis=1))
    xs = np.flatnonzero(mask.any(axis=0))
    if ys.size == 0:
        return np.zeros(4, np.float32)
    return np.array([xs[0], ys[0], xs[-1], ys[-1]], np.float32)


def pack_bits(mask: np.ndarray) -> bytes:
    """A bool [H, W] mask as bits, row-major, most significant bit first, rows not padded
    (``np.unpackbits(b, count=H * W).reshape(H, W)`` inverts it)."""
    return np.packbits(np.asarray(mask, bool).reshape(-1)).tobytes()
