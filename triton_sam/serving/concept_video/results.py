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
    each non-empty bool [K, H, W] mask's pixels, inclusive (zeros for an empty mask)."""
    boxes = np.zeros((len(masks), 4), _F32)
    for row, mask in enumerate(masks):
        # the extents from the row and column projections: a pass over the mask, no index list
        ys = np.flatnonzero(mask.any(axis=1))
        xs = np.flatnonzero(mask.any(axis=0))
        if len(xs):
            boxes[row] = (xs[0], ys[0], xs[-1], ys[-1])
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
    scores = np.asarray(scores, _F32)
    # a pixel of one object only stays its own iff its score is positive (upstream's argmax
    # over "score where the mask is" picks it, or finds no positive value): only the pixels
    # two objects claim need the argmax, which keeps the work near one pass over the masks
    out = masks & (scores > 0)[:, None, None]
    flat_out = out.reshape(len(out), -1)
    for prompt_id in np.unique(prompt_ids):
        rows = np.flatnonzero(prompt_ids == prompt_id)
        if len(rows) == 1:
            continue
        group = masks[rows].reshape(len(rows), -1)
        contested = group.sum(axis=0, dtype=np.int32) > 1
        if not contested.any():
            continue
        # few contested pixels: gather them; many: the whole group (a gather costs more)
        where = np.flatnonzero(contested) if contested.mean() < 0.25 else slice(None)
        scored = np.where(group[:, where], scores[rows, None], _F32(0))
        winner = np.argmax(scored, axis=0)  # first index on ties, as torch's argmax
        won = (winner[None] == np.arange(len(rows))[:, None]) & (scored > 0)
        if isinstance(where, slice):
            flat_out[rows] = won
        else:
            flat_out[np.ix_(rows, where)] = won
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
