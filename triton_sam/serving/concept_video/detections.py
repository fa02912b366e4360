"""One frame's detections: the detector's instances per prompt, thresholded, NMS'd, merged.

Mirrors the part of ``Sam3VideoModel.run_detection`` after the detector ran (probabilities =
sigmoid(query logit) x sigmoid(presence logit), NMS, threshold) and
``Sam3VideoModel._merge_detections_from_prompts``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .mask_ops import nms_masks
from .settings import ConceptVideoSettings

_F32 = np.float32


@dataclass(frozen=True)
class Detections:
    """Detections of one frame, in query order per prompt and prompts in order.

    Attributes:
        masks: float32 [N, H, W] low-resolution mask logits (288 x 288 for SAM3).
        scores: float32 [N] probabilities (query x presence).
        boxes: float32 [N, 4] (x0, y0, x1, y1) normalised to [0, 1] of the frame.
        prompt_ids: int64 [N] the prompt each came from.
    """

    masks: np.ndarray
    scores: np.ndarray
    boxes: np.ndarray
    prompt_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.scores)

    @classmethod
    def empty(cls, mask_hw: tuple[int, int]) -> Detections:
        """No detections (masks [0, H, W])."""
        return cls(
            masks=np.zeros((0, *mask_hw), _F32),
            scores=np.zeros(0, _F32),
            boxes=np.zeros((0, 4), _F32),
            prompt_ids=np.zeros(0, np.int64),
        )


def select_detections(
    probs: np.ndarray,
    boxes: np.ndarray,
    masks: np.ndarray,
    prompt_id: int,
    settings: ConceptVideoSettings,
) -> Detections:
    """One prompt's detections from the detector's queries (``run_detection``'s tail).

    Args:
        probs: float32 [Q] sigmoid(logit) x sigmoid(presence) of each query (or of the
            queries the decoder graph already kept above ``score_threshold_detection``: the
            others take no part in NMS and are dropped anyway).
        boxes: float32 [Q, 4] normalised xyxy; masks: float32 [Q, H, W] logits.
        prompt_id: the prompt these came from.
        settings: ``score_threshold_detection``, ``det_nms_thresh``, ``use_nms``.

    Returns:
        The queries with probability above the threshold that NMS kept, in query order.
    """
    probs = np.asarray(probs, _F32).copy()
    threshold = settings.score_threshold_detection
    if settings.use_nms and settings.det_nms_thresh > 0.0:
        keep = nms_masks(probs, masks, threshold, settings.det_nms_thresh)
        probs[~keep] = 0.0  # upstream zeroes the suppressed probabilities, then thresholds
    kept = np.flatnonzero(probs > _F32(threshold))
    return Detections(
        masks=np.asarray(masks, _F32)[kept],
        scores=probs[kept],
        boxes=np.asarray(boxes, _F32)[kept],
        prompt_ids=np.full(len(kept), prompt_id, np.int64),
    )


def merge_detections(per_prompt: Mapping[int, Detections], mask_hw: tuple[int, int]) -> Detections:
    """All prompts' detections as one list, prompts in the mapping's order
    (``Sam3VideoModel._merge_detections_from_prompts``; ``det_idx_to_prompt_id`` is the
    result's ``prompt_ids``).

    Args:
        per_prompt: prompt id -> its detections, in the order the prompts were added.
        mask_hw: (H, W) of the low-resolution masks, for an empty result.
    """
    parts = [d for d in per_prompt.values() if len(d)]
    if not parts:
        return Detections.empty(mask_hw)
    return Detections(
        masks=np.concatenate([d.masks for d in parts]),
        scores=np.concatenate([d.scores for d in parts]),
        boxes=np.concatenate([d.boxes for d in parts]),
        prompt_ids=np.concatenate([d.prompt_ids for d in parts]),
    )
