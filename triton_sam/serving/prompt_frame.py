"""Prompts from original pixels to the model's input frame, and masks back (numpy only).

Shared by the clients (``client.model_frame`` / ``client.prompts`` call these) and the
``<family>_session`` model, which accepts prompts in original pixel coordinates and returns
finished masks for clients that are not ours. ``pre`` is anything with the attributes of
``triton_sam.models.spec.Preprocessing``. Coordinates are (X, Y) pixels; sizes (H, W).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import rules

PADDING_LABEL = -1.0
BOX_LABELS = (2.0, 3.0)


def to_input_frame(points: np.ndarray, orig_hw: tuple[int, int], pre: Any) -> np.ndarray:
    """(X, Y) pixels of the original image [..., 2] -> the S x S input frame, float32, by the
    family's upstream rule (:mod:`.rules`)."""
    return rules.rule_for(pre).coords(points, orig_hw, int(pre.image_size))


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
    """Low-res logits [B, M, s, s] -> float32 [B, M, H, W] logits of the original image, by the
    family's upstream rule (:mod:`.rules`). Threshold at 0 for binary masks."""
    return rules.rule_for(pre).upsample(low_res_logits, orig_hw, int(pre.image_size))


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
