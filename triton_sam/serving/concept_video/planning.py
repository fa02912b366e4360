"""One frame's update plan and answer: ``Sam3VideoModel.run_tracker_update_planning_phase``
(without running the memory encoder: the plan says what it must encode),
``_suppress_overlapping_based_on_recent_occlusion``, ``_tracker_update_memories``' masks,
``build_outputs`` and the session update of ``forward``.

Order per frame (upstream's): detections and the tracker's propagated masklets come in ->
:func:`plan_frame` (association, new ids, hot-start, reconditioning, occlusion suppression,
memory masks) -> the tracker encodes ``plan.memory_masks`` for the tracked objects, adds the
new objects from their detection masks, drops the removed ones -> :func:`frame_masks` and
:func:`record_tracker_scores` -> the caller keeps ``plan.book`` as the session's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .association import Association, associate
from .detections import Detections
from .hotstart import process_hotstart
from .mask_ops import most_recently_occluded_to_suppress, suppress_object_pw_area_shrinkage
from .settings import ConceptVideoSettings
from .state import REMOVED_SCORE, ObjectBook

_F32 = np.float32
NEVER_OCCLUDED = -1
# Larger than any frame index: an object being removed is always the one suppressed.
ALWAYS_OCCLUDED = 100000
# The logit of a suppressed masklet and the memory encoder's object score for an empty one.
NO_OBJ_LOGIT = -10.0
OBJ_LOGIT = 10.0


@dataclass
class FramePlan:
    """What one frame changes.

    Attributes:
        tracked_obj_ids: the objects the tracker propagated (rows of its masks), before
            this frame's additions and removals.
        association: detections against those masklets.
        new_det_inds: detections that become new objects (best first when
            ``max_num_objects`` cut them, else in detection order).
        new_obj_ids: the ids issued to them, in the same order.
        removed_obj_ids: objects removed by hot-start on this frame.
        num_dropped: new detections refused by ``max_num_objects``.
        reconditioned_obj_ids: objects whose memory this frame is a conditioning memory.
        masks: float32 [K, H, W] the propagated masklets after occlusion suppression (rows
            ``tracked_obj_ids``): what the frame answers for them.
        memory_masks: float32 [K, 1, H, W] what the memory encoder encodes for them.
        memory_object_scores: float32 [K, 1, 1] its object score logits (+-10 by emptiness).
        book: the session's bookkeeping after this frame (a copy; commit it when done).
    """

    tracked_obj_ids: list[int]
    association: Association
    new_det_inds: list[int] = field(default_factory=list)
    new_obj_ids: list[int] = field(default_factory=list)
    removed_obj_ids: set[int] = field(default_factory=set)
    num_dropped: int = 0
    reconditioned_obj_ids: set[int] = field(default_factory=set)
    masks: np.ndarray | None = None
    memory_masks: np.ndarray | None = None
    memory_object_scores: np.ndarray | None = None
    book: ObjectBook = field(default_factory=ObjectBook)


def admit_new_objects(
    new_det_inds: Sequence[int], scores: np.ndarray, num_tracked: int, max_num_objects: int
) -> tuple[list[int], int]:
    """Which new detections fit under ``max_num_objects`` (the cut in
    ``run_tracker_update_planning_phase``): all of them, or the best-scoring that fit,
    best first.

    Returns:
        (admitted detection indices, how many were dropped).
    """
    new_det_inds = list(new_det_inds)
    if num_tracked + len(new_det_inds) <= max_num_objects:
        return new_det_inds, 0
    room = max_num_objects - num_tracked
    order = np.argsort(-np.asarray(scores, _F32)[new_det_inds], kind="stable")[:room]
    return [new_det_inds[i] for i in order], len(new_det_inds) - room


def plan_frame(
    book: ObjectBook,
    frame_idx: int,
    detections: Detections,
    trk_masks: np.ndarray,
    trk_score_logits: np.ndarray,
    settings: ConceptVideoSettings,
    *,
    reverse: bool = False,
    streaming: bool = False,
) -> FramePlan:
    """Decide one frame's updates (``run_tracker_update_planning_phase``).

    Args:
        book: the session's bookkeeping before this frame (not modified).
        frame_idx: this frame.
        detections: this frame's merged detections.
        trk_masks: float32 [K, H, W] the tracker's propagated logits for ``book.obj_ids``.
        trk_score_logits: float32 [K] its object score logits.
        settings: the thresholds.
        reverse: propagating backwards; streaming: frames streamed (no hot-start removal).
    """
    new_book = book.copy()
    tracked = list(book.obj_ids)
    trk_masks = np.array(trk_masks, dtype=_F32, copy=True).reshape(
        len(tracked), *trk_masks.shape[-2:]
    )
    trk_prompt_ids = np.asarray([book.obj_id_to_prompt_id[o] for o in tracked], np.int64)
    assoc = associate(
        detections.masks,
        detections.scores,
        detections.prompt_ids,
        trk_masks,
        tracked,
        trk_prompt_ids,
        settings,
    )
    new_det_inds, dropped = admit_new_objects(
        assoc.new_det_inds, detections.scores, len(tracked), settings.max_num_objects
    )
    start = book.max_obj_id + 1
    new_obj_ids = list(range(start, start + len(new_det_inds)))
    for obj_id, det in zip(new_obj_ids, new_det_inds, strict=True):
        new_book.obj_id_to_prompt_id[obj_id] = int(detections.prompt_ids[det])

    removed = process_hotstart(
        new_book,
        frame_idx,
        reverse=reverse,
        det_to_matched_obj_ids=assoc.det_to_matched_obj_ids,
        new_obj_ids=new_obj_ids,
        empty_obj_ids=assoc.empty_obj_ids,
        unmatched_obj_ids=assoc.unmatched_obj_ids,
        settings=settings,
        streaming=streaming,
    )
    recondition = _recondition_targets(
        frame_idx, tracked, assoc, np.asarray(trk_score_logits, _F32), detections, settings
    )
    plan = FramePlan(
        tracked_obj_ids=tracked,
        association=assoc,
        new_det_inds=new_det_inds,
        new_obj_ids=new_obj_ids,
        removed_obj_ids=removed,
        num_dropped=dropped,
        reconditioned_obj_ids=set(recondition),
        masks=trk_masks,
        book=new_book,
    )
    new_book.obj_id_to_last_occluded = {}  # upstream rebuilds it below, or leaves it empty
    if tracked:
        if settings.suppress_overlapping_based_on_recent_occlusion_threshold > 0.0:
            _suppress_recently_occluded(plan, book, frame_idx, settings, reverse=reverse)
        plan.memory_masks, plan.memory_object_scores = memory_inputs(
            plan.masks,
            {tracked.index(o): mask for o, mask in recondition.items()},
            [new_book.obj_id_to_prompt_id[o] for o in tracked],
        )
    _update_ids_and_scores(plan, frame_idx, detections)
    return plan


def _recondition_targets(
    frame_idx: int,
    tracked: list[int],
    assoc: Association,
    trk_score_logits: np.ndarray,
    detections: Detections,
    settings: ConceptVideoSettings,
) -> dict[int, np.ndarray | None]:
    """Objects reconditioned this frame -> the mask their memory encodes instead of the
    propagated one (None: the propagated one, ``recondition_on_trk_masks``)
    (``_prepare_recondition_masks``).

    Upstream compares the tracker's object score *logit* with ``high_conf_thresh`` (a
    probability threshold elsewhere); kept as is, for parity.
    """
    period = settings.recondition_every_nth_frame
    if not (period > 0 and frame_idx % period == 0 and assoc.obj_to_recondition_det):
        return {}
    targets: dict[int, np.ndarray | None] = {}
    for obj_id, det in assoc.obj_to_recondition_det.items():
        if trk_score_logits[tracked.index(obj_id)] <= _F32(settings.high_conf_thresh):
            continue
        if settings.recondition_on_trk_masks:
            targets[obj_id] = None
        else:  # the detection's mask, binarised as upstream does (>= 0.5 on logits)
            targets[obj_id] = (detections.masks[det] >= 0.5).astype(_F32)
    return targets


def _suppress_recently_occluded(
    plan: FramePlan,
    book: ObjectBook,
    frame_idx: int,
    settings: ConceptVideoSettings,
    *,
    reverse: bool,
) -> None:
    """``_suppress_overlapping_based_on_recent_occlusion``: within each prompt, of two
    strongly overlapping masklets the more recently occluded one is set to -10, and every
    object's last-occluded frame is updated (empty or suppressed this frame -> this frame)."""
    tracked = plan.tracked_obj_ids
    binary = plan.masks > 0
    last_prev = np.asarray(
        [
            book.obj_id_to_last_occluded.get(
                o, ALWAYS_OCCLUDED if o in plan.removed_obj_ids else NEVER_OCCLUDED
            )
            for o in tracked
        ],
        np.int64,
    )
    prompt_ids = np.asarray([book.obj_id_to_prompt_id[o] for o in tracked], np.int64)
    suppress = np.zeros(len(tracked), dtype=bool)
    for prompt_id in np.unique(prompt_ids):
        rows = np.flatnonzero(prompt_ids == prompt_id)
        if len(rows) > 1:
            suppress[rows] = most_recently_occluded_to_suppress(
                binary[rows],
                last_prev[rows],
                settings.suppress_overlapping_based_on_recent_occlusion_threshold,
                reverse=reverse,
            )
    occluded = ~binary.reshape(len(tracked), -1).any(axis=1) | suppress
    last_new = np.where(occluded, frame_idx, last_prev)
    plan.book.obj_id_to_last_occluded = {o: int(v) for o, v in zip(tracked, last_new, strict=True)}
    plan.masks[suppress] = NO_OBJ_LOGIT


def memory_inputs(
    masks: np.ndarray, recondition: dict[int, np.ndarray | None], prompt_ids: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """The masks and object scores the memory encoder reads for the tracked objects
    (``_tracker_update_memories`` before ``run_memory_encoder``): reconditioned objects'
    replacement masks, then the per-prompt shrinkage suppression, then object score +10 for
    a non-empty mask, -10 for an empty one.

    Args:
        masks: float32 [K, H, W] the masklets after occlusion suppression.
        recondition: row of a reconditioned object -> the mask its memory encodes instead
            (None: its own row, as with ``recondition_on_trk_masks``).
        prompt_ids: [K] each row's prompt.

    Returns:
        (float32 [K, 1, H, W] masks, float32 [K, 1, 1] object score logits).
    """
    high = masks[:, None].copy()
    for row, mask in recondition.items():
        if mask is not None:
            high[row, 0] = mask
    high = suppress_object_pw_area_shrinkage(high, prompt_ids)
    present = (high > 0).reshape(len(high), -1).any(axis=1)
    # [K, 1, 1], upstream's shape: the memory encoder broadcasts it over [K, C, H, W]
    scores = np.where(present, _F32(OBJ_LOGIT), _F32(NO_OBJ_LOGIT)).astype(_F32)[:, None, None]
    return high, scores


def _update_ids_and_scores(plan: FramePlan, frame_idx: int, detections: Detections) -> None:
    """Step 5 of the planning phase: the id list, scores and the largest id issued."""
    book = plan.book
    ids = plan.tracked_obj_ids + plan.new_obj_ids
    book.obj_ids = [o for o in ids if o not in plan.removed_obj_ids]
    frame_scores = book.obj_id_to_tracker_score_frame_wise[frame_idx]
    if plan.new_obj_ids:
        new_scores = detections.scores[plan.new_det_inds].tolist()
        book.obj_id_to_score.update(zip(plan.new_obj_ids, new_scores, strict=True))
        frame_scores.update(zip(plan.new_obj_ids, new_scores, strict=True))
        book.max_obj_id = max(book.max_obj_id, max(plan.new_obj_ids))
    for obj_id in plan.removed_obj_ids:
        book.obj_id_to_score[obj_id] = REMOVED_SCORE
        frame_scores[obj_id] = REMOVED_SCORE
        book.obj_id_to_last_occluded.pop(obj_id, None)
    # the tracker forgets a removed object's prompt (Sam3VideoInferenceSession.remove_object)
    for obj_id in plan.removed_obj_ids:
        book.obj_id_to_prompt_id.pop(obj_id, None)


def frame_masks(
    plan: FramePlan, detections: Detections, row_obj_ids: Sequence[int]
) -> dict[int, np.ndarray]:
    """The frame's low-resolution logits per object (``Sam3VideoModel.build_outputs``):
    the propagated masklets (after occlusion suppression), then the new objects' detection
    masks, then reconditioned objects' detection masks.

    Args:
        plan: this frame's plan.
        detections: this frame's detections.
        row_obj_ids: the ids given to the rows of ``plan.masks``. The true owners are
            ``plan.tracked_obj_ids``; upstream zips the rows with the session's ids *after*
            this frame's additions and removals (``plan.book.obj_ids``), which differs when
            an object other than the last is removed: then later objects take their
            predecessor's mask on that frame. Pass ``plan.book.obj_ids`` for parity.

    Returns:
        object id -> float32 [H, W] logits.
    """
    out = {int(o): m for o, m in zip(row_obj_ids, plan.masks, strict=False)}
    for obj_id, det in zip(plan.new_obj_ids, plan.new_det_inds, strict=True):
        out[obj_id] = detections.masks[det]
    for obj_id in plan.reconditioned_obj_ids:
        out[obj_id] = detections.masks[plan.association.obj_to_recondition_det[obj_id]]
    return out


def record_tracker_scores(
    plan: FramePlan, frame_idx: int, trk_score_logits: np.ndarray, row_obj_ids: Sequence[int]
) -> dict[int, float]:
    """Record sigmoid of the tracker's object scores for this frame in ``plan.book``
    (the end of ``_det_track_one_frame``; ``row_obj_ids`` as in :func:`frame_masks`).

    Returns:
        object id -> this frame's tracker score (``obj_id_to_tracker_score``).
    """
    frame_scores = plan.book.obj_id_to_tracker_score_frame_wise[frame_idx]
    logits = np.asarray(trk_score_logits, _F32).reshape(-1)
    if len(logits):
        probs = (_F32(1) / (_F32(1) + np.exp(-logits))).tolist()
        frame_scores.update(zip(row_obj_ids, probs, strict=False))
    return frame_scores
