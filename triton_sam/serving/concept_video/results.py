"""A frame's answer at the video's size: ``Sam3VideoProcessor.postprocess_outputs`` in numpy,
and the masks as COCO RLE.

Per frame: objects in increasing id order; low-resolution logits resized bilinearly
(``align_corners=False``) to the frame and thresholded at 0; empty masks and hidden objects
(suppressed on this frame, or removed by hot-start) dropped; boxes from the masks; then,
within each prompt, a pixel claimed by several objects goes to the one with the highest
tracker score this frame (the first in id order on a tie).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np

from .. import resample
from ..masks import encode_rle

_F32 = np.float32


@dataclass(frozen=True)
class FrameResult:
    """The instances of one frame.

    Attributes:
        frame_idx: the frame.
        object_ids: int64 [K] increasing.
        scores: float32 [K] each object's detection probability at birth.
        boxes: float32 [K, 4] (x0, y0, x1, y1) pixel indices of the mask's extent
            (inclusive; torchvision's ``masks_to_boxes``), before the overlap resolution.
        masks: bool [K, H, W] at the frame's size, not overlapping within a prompt.
        prompt_ids: int64 [K] the prompt each object came from.
    """

    frame_idx: int
    object_ids: np.ndarray
    scores: np.ndarray
    boxes: np.ndarray
    masks: np.ndarray
    prompt_ids: np.ndarray

    def rle(self) -> list[bytes]:
        """Each mask as COCO compressed RLE ``counts`` (``{"size": [H, W], "counts": c}``)."""
        return [encode_rle(mask) for mask in self.masks]


def masks_to_boxes(masks: np.ndarray) -> np.ndarray:
    """``torchvision.ops.masks_to_boxes``: float32 [K, 4] (x_min, y_min, x_max, y_max) of
    each non-empty bool [K, H, W] mask's pixels, inclusive."""
    boxes = np.zeros((len(masks), 4), _F32)
    for row, mask in enumerate(masks):
        ys, xs = np.nonzero(mask)
        if len(xs):
            boxes[row] = (xs.min(), ys.min(), xs.max(), ys.max())
    return boxes


def object_wise_non_overlap(
    masks: np.ndarray, scores: np.ndarray, prompt_ids: np.ndarray
) -> np.ndarray:
    """Within each prompt, each pixel keeps only the overlapping object with the highest
    score (``Sam3VideoProcessor._apply_object_wise_non_overlapping_constraints`` with
    ``background_value=0`` on binary masks). An object whose score is 0 keeps no pixel.

    Args:
        masks: bool [K, H, W]; scores: float32 [K]; prompt_ids: int [K].

    Returns:
        bool [K, H, W].
    """
    out = masks.copy()
    for prompt_id in np.unique(prompt_ids):
        rows = np.flatnonzero(prompt_ids == prompt_id)
        scored = np.where(masks[rows], np.asarray(scores, _F32)[rows, None, None], _F32(0))
        if len(rows) == 1:
            out[rows] = scored > 0
            continue
        winner = np.argmax(scored, axis=0)  # first index on ties, as torch's argmax
        won = winner[None] == np.arange(len(rows))[:, None, None]
        out[rows] = won & (scored > 0)
    return out


def postprocess_frame(
    frame_idx: int,
    obj_id_to_mask: Mapping[int, np.ndarray],
    obj_id_to_score: Mapping[int, float],
    obj_id_to_tracker_score: Mapping[int, float],
    obj_id_to_prompt_id: Mapping[int, int],
    hidden_obj_ids: Collection[int],
    hw: tuple[int, int],
) -> FrameResult:
    """One frame's answer (``Sam3VideoProcessor.postprocess_outputs``).

    Args:
        frame_idx: the frame.
        obj_id_to_mask: object id -> float32 [h, w] low-resolution logits
            (:func:`.planning.frame_masks`).
        obj_id_to_score: detection probabilities; obj_id_to_tracker_score: this frame's
            tracker scores (0 for an object without one).
        obj_id_to_prompt_id: each object's prompt.
        hidden_obj_ids: objects not to answer: suppressed on this frame, and removed by
            hot-start (as known when the frame is answered).
        hw: (H, W) of the video.
    """
    ids = sorted(obj_id_to_mask)
    h, w = hw
    if not ids:
        return FrameResult(
            frame_idx,
            np.zeros(0, np.int64),
            np.zeros(0, _F32),
            np.zeros((0, 4), _F32),
            np.zeros((0, h, w), bool),
            np.zeros(0, np.int64),
        )
    low_res = np.stack([np.asarray(obj_id_to_mask[o], _F32) for o in ids])
    masks = resample.bilinear(low_res, hw) > 0
    keep = masks.reshape(len(ids), -1).any(axis=1)
    keep &= ~np.isin(np.asarray(ids, np.int64), np.asarray(list(hidden_obj_ids), np.int64))
    kept = [o for o, k in zip(ids, keep, strict=True) if k]
    masks = masks[keep]
    boxes = masks_to_boxes(masks)
    prompt_ids = np.asarray([obj_id_to_prompt_id[o] for o in kept], np.int64)
    if len(kept) > 1:
        tracker = np.asarray([obj_id_to_tracker_score.get(o, 0.0) for o in kept], _F32)
        masks = object_wise_non_overlap(masks, tracker, prompt_ids)
    return FrameResult(
        frame_idx=frame_idx,
        object_ids=np.asarray(kept, np.int64),
        scores=np.asarray([obj_id_to_score[o] for o in kept], _F32),
        boxes=boxes,
        masks=masks,
        prompt_ids=prompt_ids,
    )
