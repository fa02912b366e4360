"""A frame's answer at the video's size: ``Sam3VideoProcessor.postprocess_outputs`` in numpy,
and the masks as COCO RLE.

Per frame: objects in increasing id order; low-resolution logits resized bilinearly
(``align_corners=False``) to the frame and thresholded at 0; empty masks and hidden objects
(suppressed on this frame, or removed by hot-start) dropped; boxes from the masks; then,
within each prompt, a pixel claimed by several objects goes to the one with the highest
tracker score this frame (the first in id order on a tie).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
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


@dataclass(frozen=True)
class PackedFrameResult:
    """The instances of one frame as the server computes them: :class:`FrameResult`'s fields,
    with the masks kept packed until read.

    The masks are kept packed (one bit per pixel, each object's mask before the overlap
    resolution) and resolved when read: one frame's answer then costs K x H x W / 8 bytes
    and a few H x W maps, where K float32 masks at the frame's size would cost 32x that
    (64 objects on an 8192 px frame: 17 GB).

    Attributes:
        hw: (H, W) of the frame.
        packed: uint8 [K, ceil(H * W / 8)] each mask before the overlap resolution
            (``np.packbits`` of the row-major mask).
        tracker_scores: float32 [K] the scores that resolve overlaps within a prompt.

    Its other attributes are :class:`FrameResult`'s.
    """

    frame_idx: int
    object_ids: np.ndarray
    scores: np.ndarray
    boxes: np.ndarray
    prompt_ids: np.ndarray
    hw: tuple[int, int]
    packed: np.ndarray
    tracker_scores: np.ndarray

    @property
    def masks(self) -> np.ndarray:
        """bool [K, H, W] at the frame's size, not overlapping within a prompt (all at once:
        for tests and in-process callers; :meth:`rle` holds one mask at a time)."""
        out = np.zeros((len(self.object_ids), *self.hw), bool)
        for row, mask in self.resolved():
            out[row] = mask
        return out

    def rle(self) -> list[bytes]:
        """Each mask as COCO compressed RLE ``counts`` (``{"size": [H, W], "counts": c}``)."""
        counts: list[bytes] = [b""] * len(self.object_ids)
        for row, mask in self.resolved():
            counts[row] = encode_rle(mask)
        return counts

    def resolved(self) -> Iterator[tuple[int, np.ndarray]]:
        """(row, bool [H, W]) for every object, prompt by prompt: within a prompt each pixel
        goes to the object with the highest tracker score (the first in id order on a tie),
        and an object whose score is 0 keeps no pixel (``Sam3VideoProcessor.
        _apply_object_wise_non_overlapping_constraints`` with ``background_value=0`` on binary
        masks). Holds one prompt's winner map and one mask at a time."""
        scores = np.asarray(self.tracker_scores, _F32)
        for prompt_id in np.unique(self.prompt_ids):
            rows = np.flatnonzero(self.prompt_ids == prompt_id)
            if len(rows) == 1:
                yield int(rows[0]), self._mask(rows[0]) & bool(scores[rows[0]] > 0)
                continue
            # strictly greater from 0: the first object in id order keeps a tie, and a pixel
            # nobody claims with a positive score stays background
            best = np.zeros(self.hw, _F32)
            winner = np.full(self.hw, -1, np.int32)
            for row in rows:
                wins = self._mask(row) & (scores[row] > best)
                best[wins], winner[wins] = scores[row], row
            for row in rows:
                yield int(row), winner == row

    def _mask(self, row: int) -> np.ndarray:
        height, width = self.hw
        flat = np.unpackbits(self.packed[row], count=height * width)
        return flat.reshape(height, width).astype(bool)


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


def postprocess_frame(
    frame_idx: int,
    obj_id_to_mask: Mapping[int, np.ndarray],
    obj_id_to_score: Mapping[int, float],
    obj_id_to_tracker_score: Mapping[int, float],
    obj_id_to_prompt_id: Mapping[int, int],
    hidden_obj_ids: Collection[int],
    hw: tuple[int, int],
) -> PackedFrameResult:
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
    h, w = hw
    hidden = {int(o) for o in hidden_obj_ids}
    kept, packed, boxes = [], [], []
    for obj_id in sorted(obj_id_to_mask):
        if obj_id in hidden:
            continue
        # one object at a time: the resize of a stack equals each object's resize bit for bit
        mask = resample.bilinear(np.asarray(obj_id_to_mask[obj_id], _F32), hw) > 0
        if not mask.any():
            continue
        kept.append(obj_id)
        packed.append(np.packbits(mask, axis=None))
        boxes.append(masks_to_boxes(mask[None])[0])
    return PackedFrameResult(
        frame_idx=frame_idx,
        object_ids=np.asarray(kept, np.int64),
        scores=np.asarray([obj_id_to_score[o] for o in kept], _F32),
        boxes=np.asarray(boxes, _F32).reshape(-1, 4),
        prompt_ids=np.asarray([obj_id_to_prompt_id[o] for o in kept], np.int64),
        hw=(h, w),
        packed=np.asarray(packed, np.uint8).reshape(len(kept), (h * w + 7) // 8),
        tracker_scores=np.asarray([obj_id_to_tracker_score.get(o, 0.0) for o in kept], _F32),
    )
