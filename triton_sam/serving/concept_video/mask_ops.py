"""Mask operations of ``Sam3VideoModel``: IoU, NMS and the non-overlap constraints, in numpy.

Masks are float32 logits [N, H, W] (foreground where ``> 0``) or bool [N, H, W]. Every
function names the upstream function of ``transformers.models.sam3_video`` it mirrors; they
agree exactly (same float32 divisions, same first-index tie-breaks of ``argmax``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_F32 = np.float32
# The logit a suppressed pixel or object is clamped to: sigmoid(-10) = 4.5e-5, "no object".
SUPPRESSED_LOGIT = -10.0


def mask_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of bool masks (``modeling_sam3_video.mask_iou``).

    Args:
        a: bool [N, H, W]; b: bool [M, H, W].

    Returns:
        float32 [N, M]: intersection / max(union, 1) (an empty pair has IoU 0).
    """
    a = np.asarray(a, dtype=bool).reshape(len(a), -1)
    b = np.asarray(b, dtype=bool).reshape(len(b), -1)
    # counts are exact in float64 matmuls (< 2**53); float32 division rounds as torch's does
    inter = a.astype(np.float64) @ b.astype(np.float64).T
    union = a.sum(1, dtype=np.int64)[:, None] + b.sum(1, dtype=np.int64)[None, :] - inter
    return inter.astype(_F32) / np.maximum(union, 1).astype(_F32)


def greedy_nms(ious: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Greedy NMS over a pairwise IoU matrix: the ``generic_nms`` of SAM3's ``cv-utils``
    kernel (``torchvision.ops.nms`` with IoUs given).

    Takes the best remaining score, keeps it, drops every remaining one whose IoU with it
    exceeds ``iou_threshold``; repeats.

    Args:
        ious: float [K, K]; scores: float [K].

    Returns:
        int64 [kept]: indices into ``scores``, best first.
    """
    # a stable sort of the negated scores: equal scores are taken in index order
    order = np.argsort(-np.asarray(scores, np.float32), kind="stable")
    kept = []
    while order.size:
        best = order[0]
        kept.append(best)
        order = order[1:][ious[best, order[1:]] <= iou_threshold]
    return np.asarray(kept, dtype=np.int64)


def nms_masks(
    probs: np.ndarray, masks: np.ndarray, prob_threshold: float, iou_threshold: float
) -> np.ndarray:
    """Which detections survive thresholding and mask NMS (``modeling_sam3_video.nms_masks``).

    Args:
        probs: float32 [Q] detection probabilities; masks: float32 [Q, H, W] logits.
        prob_threshold: only detections with ``probs > prob_threshold`` take part.
        iou_threshold: NMS IoU (of the ``> 0`` masks).

    Returns:
        bool [Q]: kept.
    """
    valid = np.asarray(probs) > prob_threshold
    keep = np.zeros_like(valid)
    if not valid.any():
        return keep
    binary = np.asarray(masks)[valid] > 0
    kept = greedy_nms(mask_iou(binary, binary), np.asarray(probs)[valid], iou_threshold)
    keep[np.flatnonzero(valid)[kept]] = True
    return keep


def apply_non_overlapping_constraints(masks: np.ndarray) -> np.ndarray:
    """Each pixel keeps only its highest-scoring object; the others' logits there are clamped
    to at most -10 (``Sam3VideoModel._apply_non_overlapping_constraints``).

    Args:
        masks: float [N, ...] logits (N objects first).

    Returns:
        float [N, ...], a new array. Ties go to the lowest index, as torch's ``argmax``.
    """
    masks = np.asarray(masks)
    if len(masks) == 1:
        return masks.copy()
    winner = np.argmax(masks, axis=0)[None]
    keep = winner == np.arange(len(masks)).reshape((-1,) + (1,) * (masks.ndim - 1))
    return np.where(keep, masks, np.minimum(masks, masks.dtype.type(SUPPRESSED_LOGIT)))


def suppress_shrunk_masks(
    masks: np.ndarray, constrained: np.ndarray, shrink_threshold: float = 0.3
) -> np.ndarray:
    """Objects whose foreground shrank below ``shrink_threshold`` of its area under the
    non-overlap constraint are clamped to at most -10 everywhere; the others keep their
    unconstrained logits (``Sam3VideoModel._suppress_shrunk_masks``).

    Args:
        masks: float [N, ...] logits before the constraint; constrained: after it.
    """
    axes = tuple(range(1, masks.ndim))
    before = np.maximum((masks > 0).sum(axis=axes), 1).astype(_F32)
    after = (constrained > 0).sum(axis=axes).astype(_F32)
    keep = (after / before) >= _F32(shrink_threshold)
    keep = keep.reshape((-1,) + (1,) * (masks.ndim - 1))
    return np.where(keep, masks, np.minimum(masks, masks.dtype.type(SUPPRESSED_LOGIT)))


def suppress_object_pw_area_shrinkage(
    masks: np.ndarray, prompt_ids: Sequence[int] | None = None
) -> np.ndarray:
    """Per prompt group, clamp the objects that the pixel-wise non-overlap constraint would
    shrink by more than 70% (``Sam3VideoModel._suppress_object_pw_area_shrinkage``).

    Args:
        masks: float [N, ...] logits; prompt_ids: [N] each object's prompt (None: one group).

    Returns:
        float [N, ...], a new array.
    """
    masks = np.asarray(masks)
    if prompt_ids is None:
        return _shrinkage_one_group(masks)
    prompt_ids = np.asarray(prompt_ids, dtype=np.int64)
    if len(prompt_ids) != len(masks):
        raise ValueError(
            f"prompt_ids: got {len(prompt_ids)} ids for {len(masks)} masks, expected one each"
        )
    out = masks.copy()
    for prompt_id in np.unique(prompt_ids):
        rows = np.flatnonzero(prompt_ids == prompt_id)
        out[rows] = _shrinkage_one_group(out[rows])
    return out


def _shrinkage_one_group(masks: np.ndarray) -> np.ndarray:
    """``_suppress_object_pw_area_shrinkage_impl``: one prompt group."""
    if len(masks) <= 1:
        return masks.copy()
    return suppress_shrunk_masks(masks, apply_non_overlapping_constraints(masks))


def most_recently_occluded_to_suppress(
    binary: np.ndarray, last_occluded: np.ndarray, threshold: float, *, reverse: bool = False
) -> np.ndarray:
    """Of each pair of masklets overlapping with IoU >= ``threshold``, the one occluded more
    recently is suppressed, provided the other was occluded at some time (last occluded
    > -1) (``Sam3VideoModel._get_objects_to_suppress_based_on_most_recently_occluded``).

    Args:
        binary: bool [N, H, W] masklets of one prompt; last_occluded: int64 [N] frame index
            each was last occluded (-1 never; a large value for objects being removed).
        threshold: the IoU at which two masklets overlap.
        reverse: propagating backwards (then "more recent" is the smaller frame index).

    Returns:
        bool [N]: suppressed.
    """
    n = len(binary)
    if n <= 1:
        return np.zeros(n, dtype=bool)
    overlapping = np.triu(mask_iou(binary, binary) >= _F32(threshold), k=1)
    last_i = np.asarray(last_occluded, np.int64)[:, None]
    last_j = last_i.T
    later = np.greater if not reverse else np.less
    suppress_i = overlapping & later(last_i, last_j) & (last_j > -1)
    suppress_j = overlapping & later(last_j, last_i) & (last_i > -1)
    return suppress_i.any(axis=1) | suppress_j.any(axis=0)
