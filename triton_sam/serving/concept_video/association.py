"""Detections against tracked masklets: ``Sam3VideoModel._associate_det_trk`` in numpy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .mask_ops import mask_iou
from .settings import ConceptVideoSettings

_F32 = np.float32


@dataclass
class Association:
    """How one frame's detections and masklets relate.

    Attributes:
        new_det_inds: detections that match no masklet (IoU < ``assoc_iou_thresh`` with all
            of their prompt's) and score at least ``new_det_thresh``: new objects.
        unmatched_obj_ids: non-empty masklets no detection matches with IoU >=
            ``trk_assoc_iou_thresh``, in masklet order.
        det_to_matched_obj_ids: every detection -> the masklets it matches (IoU >=
            ``assoc_iou_thresh``; a detection may match several, which marks duplicates).
        obj_to_recondition_det: masklet -> the detection that may recondition it: the
            detection's best-IoU masklet, when that IoU and its score are high and the
            detection is not new (a later detection overwrites an earlier one's entry).
        empty_obj_ids: masklets with no foreground pixel this frame.
    """

    new_det_inds: list[int] = field(default_factory=list)
    unmatched_obj_ids: list[int] = field(default_factory=list)
    det_to_matched_obj_ids: dict[int, list[int]] = field(default_factory=dict)
    obj_to_recondition_det: dict[int, int] = field(default_factory=dict)
    empty_obj_ids: list[int] = field(default_factory=list)


def associate(
    det_masks: np.ndarray,
    det_scores: np.ndarray,
    det_prompt_ids: np.ndarray,
    trk_masks: np.ndarray,
    trk_obj_ids: Sequence[int],
    trk_prompt_ids: np.ndarray,
    settings: ConceptVideoSettings,
) -> Association:
    """Match a frame's detections with the propagated masklets
    (``Sam3VideoModel._associate_det_trk``).

    A detection and a masklet of different prompts never match (their IoU counts as 0).

    Args:
        det_masks: float32 [N, H, W] detection logits; det_scores: float32 [N];
        det_prompt_ids: int [N].
        trk_masks: float32 [M, H, W] masklet logits this frame; trk_obj_ids: [M] their
            object ids; trk_prompt_ids: int [M].
        settings: the association thresholds.
    """
    trk_obj_ids = np.asarray(list(trk_obj_ids), np.int64)
    if len(trk_masks) == 0:
        return Association(new_det_inds=list(range(len(det_masks))))
    trk_binary = np.asarray(trk_masks) > 0
    nonempty = trk_binary.reshape(len(trk_binary), -1).any(axis=1)
    if len(det_masks) == 0:
        return Association(
            unmatched_obj_ids=trk_obj_ids[nonempty].tolist(),
            empty_obj_ids=trk_obj_ids[~nonempty].tolist(),
        )
    ious = mask_iou(np.asarray(det_masks) > 0, trk_binary)
    same_prompt = np.asarray(det_prompt_ids)[:, None] == np.asarray(trk_prompt_ids)[None, :]
    ious = np.where(same_prompt, ious, _F32(0))

    matched_trk = (ious >= _F32(settings.trk_assoc_iou_thresh)).any(axis=0)
    matches = ious >= _F32(settings.assoc_iou_thresh)
    det_scores = np.asarray(det_scores, _F32)
    is_new = (det_scores >= _F32(settings.new_det_thresh)) & ~matches.any(axis=1)
    # reconditioning candidates: confident, not new, and overlapping one masklet strongly
    may_recondition = (
        (det_scores >= _F32(settings.high_conf_thresh))
        & ~is_new
        & (ious.max(axis=1) >= _F32(settings.high_iou_thresh))
    )
    best_trk = np.argmax(ious, axis=1)  # first index on ties, as torch's argmax
    recondition: dict[int, int] = {}
    for det in np.flatnonzero(may_recondition):
        recondition[int(trk_obj_ids[best_trk[det]])] = int(det)
    return Association(
        new_det_inds=np.flatnonzero(is_new).tolist(),
        unmatched_obj_ids=trk_obj_ids[nonempty & ~matched_trk].tolist(),
        det_to_matched_obj_ids={
            det: trk_obj_ids[matches[det]].tolist() for det in range(len(det_masks))
        },
        obj_to_recondition_det=recondition,
        empty_obj_ids=trk_obj_ids[~nonempty].tolist(),
    )
