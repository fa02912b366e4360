"""Concept tracking's orchestration (``triton_sam.serving.concept_video``) against
transformers' own implementation of each step (``Sam3VideoModel``, ``Sam3VideoProcessor``,
transformers 5.23), on seeded synthetic inputs. No network runs: the detector's and the
tracker's outputs are synthetic (``tests/concept_video_support.py``), and upstream's methods
are called for real on them.

Tolerances: none except where stated. Every step is integer bookkeeping, comparisons of
float32 values computed by the same float32 operations, or ``where``/``argmax`` selections,
so the results are compared exactly (masks, ids, counters). Whole propagations are in
``test_sam3_concept_video_loop.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from concept_video_support import (
    MASK_HW,
    SETTINGS,
    VIDEO_HW,
    box_logits,
    upstream_model,
    upstream_processor,
)
from transformers.models.sam3_video import modeling_sam3_video as upstream

from triton_sam.serving.concept_video import mask_ops
from triton_sam.serving.concept_video.association import Association, associate
from triton_sam.serving.concept_video.detections import Detections, select_detections
from triton_sam.serving.concept_video.hotstart import process_hotstart
from triton_sam.serving.concept_video.planning import FramePlan, frame_masks
from triton_sam.serving.concept_video.results import postprocess_frame
from triton_sam.serving.concept_video.settings import ConceptVideoSettings
from triton_sam.serving.concept_video.state import ObjectBook


def _random_masks(rng: np.random.Generator, n: int) -> np.ndarray:
    boxes = rng.uniform(0, 24, (n, 2))
    sizes = rng.uniform(2, 14, (n, 2))
    masks = [
        box_logits((x, y, x + w, y + h), rng) for (x, y), (w, h) in zip(boxes, sizes, strict=True)
    ]
    return np.stack(masks) if masks else np.zeros((0, *MASK_HW), np.float32)


@pytest.mark.parametrize("seed", range(4))
def test_mask_ops_match_upstream(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b = _random_masks(rng, 7), _random_masks(rng, 5)
    a[2] = -5  # an empty mask: IoU 0 with everything
    model = upstream_model()
    t = torch.from_numpy
    np.testing.assert_array_equal(
        mask_ops.mask_iou(a > 0, b > 0), upstream.mask_iou(t(a > 0), t(b > 0)).numpy()
    )
    np.testing.assert_array_equal(
        mask_ops.apply_non_overlapping_constraints(a[:, None]),
        model._apply_non_overlapping_constraints(t(a[:, None])).numpy(),
    )
    prompts = [0, 1, 0, 0, 1, 1, 0]
    ours = mask_ops.suppress_object_pw_area_shrinkage(a[:, None], prompts)
    theirs = model._suppress_object_pw_area_shrinkage(t(a[:, None]).clone(), prompts).numpy()
    np.testing.assert_array_equal(ours, theirs)
    last = rng.integers(-1, 6, 7)
    for reverse in (False, True):
        for threshold in (0.05, 0.3):
            model.suppress_overlapping_based_on_recent_occlusion_threshold = threshold
            np.testing.assert_array_equal(
                mask_ops.most_recently_occluded_to_suppress(
                    a > 0, last, threshold, reverse=reverse
                ),
                model._get_objects_to_suppress_based_on_most_recently_occluded(
                    t(a > 0), t(last), list(range(7)), reverse
                ).numpy(),
            )


class _Detector:
    """A detector network stand-in for ``Sam3VideoModel.run_detection``."""

    def __init__(self, logits, presence, masks, boxes) -> None:
        self.out = dict(pred_logits=logits, presence_logits=presence, pred_masks=masks,
                        pred_boxes=boxes)  # fmt: skip

    def get_text_features(self, **_):
        return None

    def __call__(self, **_):
        return type("Out", (), self.out)


class _TorchvisionNms:
    """``cv-utils``' ``generic_nms`` for rectangular masks: torchvision's box NMS, an
    independent greedy NMS (mask IoU = box IoU for axis-aligned rectangles)."""

    def __init__(self, boxes: torch.Tensor) -> None:
        self.boxes = boxes

    def generic_nms(self, ious, probs, iou_threshold, use_iou_matrix):
        from torchvision.ops import box_iou, nms

        valid = [i for i in range(len(self.boxes)) if self.valid[i]]
        boxes = self.boxes[valid]
        assert torch.allclose(box_iou(boxes, boxes), ious, atol=1e-6)
        return nms(boxes, probs, iou_threshold)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("with_kernel", [False, True])
def test_detections_match_run_detection(monkeypatch, seed: int, with_kernel: bool) -> None:
    rng = np.random.default_rng(seed)
    queries = 24
    corners = rng.integers(0, 20, (queries, 2))
    sizes = rng.integers(3, 12, (queries, 2))
    boxes_px = np.concatenate([corners, corners + sizes], 1).astype(np.float32)
    h, w = MASK_HW
    ys, xs = np.mgrid[0:h, 0:w]
    masks = np.stack(
        [np.where((xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1), 3.0, -3.0)
         for x0, y0, x1, y1 in boxes_px]
    ).astype(np.float32)  # fmt: skip
    logits = rng.normal(0.5, 1.5, queries).astype(np.float32)
    presence = np.float32([[1.2]])
    kernel = False
    if with_kernel:
        kernel = _TorchvisionNms(torch.from_numpy(boxes_px))
    monkeypatch.setattr(upstream, "cv_utils_kernel", kernel)
    model = upstream_model()
    model.detector_model = _Detector(
        torch.from_numpy(logits[None]), torch.from_numpy(presence),
        torch.from_numpy(masks[None]), torch.from_numpy(boxes_px[None] / 32),
    )  # fmt: skip
    probs = torch.from_numpy(logits).sigmoid() * torch.from_numpy(presence[0]).sigmoid()
    if with_kernel:
        kernel.valid = (probs > SETTINGS.score_threshold_detection).numpy()
    session = upstream.Sam3VideoInferenceSession()
    session.add_prompt("cat")
    session.prompt_input_ids[0] = session.prompt_attention_masks[0] = None
    theirs = model.run_detection(session, vision_embeds=None)[0]
    settings = ConceptVideoSettings(use_nms=with_kernel)
    ours = select_detections(probs.numpy(), boxes_px / 32, masks, 0, settings)
    np.testing.assert_array_equal(ours.scores, theirs["scores"].numpy())
    np.testing.assert_array_equal(ours.masks, theirs["mask"].numpy())
    np.testing.assert_array_equal(ours.boxes, theirs["bbox"].numpy())
    survivors = int((probs > SETTINGS.score_threshold_detection).sum())
    assert (len(ours) < survivors) == with_kernel  # NMS removed some exactly when it ran


@pytest.mark.parametrize("seed", range(6))
def test_association_matches_upstream(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_det, n_trk = [(6, 5), (0, 4), (5, 0), (8, 8), (3, 6), (6, 3)][seed]
    trk = _random_masks(rng, n_trk)
    det = _random_masks(rng, n_det)
    # detections that re-find some masklets (high IoU) so every branch is taken
    for d in range(min(n_det, n_trk) // 2):
        det[d] = trk[d] + rng.normal(0, 0.3, MASK_HW).astype(np.float32)
    if n_trk:
        trk[-1] = -3  # an empty masklet
    det_scores = rng.uniform(0.5, 1.0, n_det).astype(np.float32)
    det_prompts = rng.integers(0, 2, n_det)
    trk_prompts = rng.integers(0, 2, n_trk)
    trk_ids = sorted(rng.choice(40, n_trk, replace=False).tolist())
    t = torch.from_numpy
    theirs = upstream_model()._associate_det_trk(
        t(det), t(det_scores), t(trk), trk_ids, t(det_prompts), t(trk_prompts)
    )
    ours = associate(det, det_scores, det_prompts, trk, trk_ids, trk_prompts, SETTINGS)
    assert (
        ours.new_det_inds, ours.unmatched_obj_ids, ours.det_to_matched_obj_ids,
        ours.obj_to_recondition_det, ours.empty_obj_ids,
    ) == theirs  # fmt: skip


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("streaming", [False, True])
def test_hotstart_matches_upstream(seed: int, reverse: bool, streaming: bool) -> None:
    """Random association outcomes over 30 frames, births on every frame so that objects
    are born exactly ``hotstart_delay`` frames before a removal decision (the boundary)."""
    rng = np.random.default_rng(seed)
    settings = ConceptVideoSettings(
        hotstart_delay=4, hotstart_unmatch_thresh=2, hotstart_dup_thresh=2,
        suppress_unmatched_only_within_hotstart=bool(seed % 2), init_trk_keep_alive=2,
        max_trk_keep_alive=3, decrease_trk_keep_alive_for_empty_masklets=True,
    )  # fmt: skip
    model = upstream_model(settings)
    session = upstream.Sam3VideoInferenceSession()
    book = ObjectBook()
    alive: list[int] = []
    frames = range(29, -1, -1) if reverse else range(30)
    for frame in frames:
        new = list(range(book.max_obj_id + 1, book.max_obj_id + 1 + int(rng.integers(0, 2))))
        book.max_obj_id += len(new)
        picks = [o for o in alive if rng.random() < 0.6]
        matched = {d: sorted(rng.choice(picks, int(rng.integers(1, 3)), replace=False).tolist())
                   for d in range(len(picks) // 2)} if len(picks) >= 2 else {}  # fmt: skip
        rest = [o for o in alive if o not in {x for v in matched.values() for x in v}]
        unmatched = [o for o in rest if rng.random() < 0.5]
        empty = [o for o in rest if o not in unmatched]
        metadata = {
            "obj_first_frame_idx": session.obj_first_frame_idx,
            "unmatched_frame_inds": session.unmatched_frame_inds,
            "trk_keep_alive": session.trk_keep_alive,
            "overlap_pair_to_frame_inds": session.overlap_pair_to_frame_inds,
            "removed_obj_ids": session.removed_obj_ids,
            "suppressed_obj_ids": session.suppressed_obj_ids,
        }
        theirs, _ = model._process_hotstart(
            session, frame, reverse, matched, new, empty, unmatched, metadata, streaming
        )
        ours = process_hotstart(
            book, frame, reverse=reverse, det_to_matched_obj_ids=matched, new_obj_ids=new,
            empty_obj_ids=empty, unmatched_obj_ids=unmatched, settings=settings,
            streaming=streaming,
        )  # fmt: skip
        assert ours == theirs, frame
        assert book.trk_keep_alive == session.trk_keep_alive
        assert dict(book.unmatched_frame_inds) == dict(session.unmatched_frame_inds)
        assert dict(book.overlap_pair_to_frame_inds) == dict(session.overlap_pair_to_frame_inds)
        assert book.suppressed_obj_ids[frame] == session.suppressed_obj_ids[frame]
        alive = [o for o in alive + new if o not in book.removed_obj_ids]
    assert bool(book.removed_obj_ids) != streaming  # removals happen, never when streaming


@pytest.mark.parametrize("extent", [16, 28])  # contested pixels: a few (gathered), most (dense)
def test_postprocess_matches_processor_on_ties_and_zero_scores(extent: int) -> None:
    """Three overlapping objects of one prompt (two with the same tracker score, one with
    none: score 0 keeps no pixel), one of another prompt, one hidden, one empty."""
    rng = np.random.default_rng(7)
    masks = {o: box_logits((o - 3, 2, extent + o - 3, extent + 2), rng) for o in (3, 5, 8, 9, 11)}
    masks[12] = np.full(MASK_HW, -3.0, np.float32)
    scores = {o: float(s) for o, s in zip(masks, rng.uniform(0.5, 1, len(masks)), strict=True)}
    tracker = {3: 0.9, 5: 0.9, 9: 0.4, 11: 0.7}
    prompts = {3: 0, 5: 0, 8: 0, 9: 1, 11: 0, 12: 1}
    hidden = {11}
    session = upstream.Sam3VideoInferenceSession(video_height=VIDEO_HW[0], video_width=VIDEO_HW[1])
    session.obj_id_to_prompt_id = dict(prompts)
    session.prompts = {0: "cat", 1: "dog"}
    session.hotstart_removed_obj_ids = hidden
    out = dict(
        obj_id_to_mask={o: torch.from_numpy(m)[None] for o, m in masks.items()},
        obj_id_to_score=scores, obj_id_to_tracker_score=tracker, suppressed_obj_ids=set(),
    )  # fmt: skip
    theirs = upstream_processor().postprocess_outputs(session, out)
    ours = postprocess_frame(0, masks, scores, tracker, prompts, hidden, VIDEO_HW)
    np.testing.assert_array_equal(ours.object_ids, theirs["object_ids"].numpy())
    np.testing.assert_array_equal(ours.scores, theirs["scores"].numpy())
    np.testing.assert_array_equal(ours.boxes, theirs["boxes"].numpy())
    np.testing.assert_array_equal(ours.masks, theirs["masks"].numpy())
    assert ours.object_ids.tolist() == [3, 5, 8, 9]
    assert not ours.masks[2].any()  # object 8 has no tracker score: no pixel


def test_frame_masks_rows_upstream_and_true_owners() -> None:
    """``build_outputs`` zips the propagated rows with the session's ids *after* the frame's
    changes: with object 1 removed and 3 added, upstream answers object 2 with object 1's
    row. ``frame_masks`` reproduces that for parity, or gives each row to its owner."""
    rng = np.random.default_rng(3)
    rows = _random_masks(rng, 3)  # propagated for objects 0, 1, 2
    det = _random_masks(rng, 1)
    session = upstream.Sam3VideoInferenceSession()
    for obj_id in (0, 1, 2, 3):  # as the execution phase leaves it: 3 added, then 1 removed
        session.obj_id_to_idx(obj_id)
    session.obj_id_to_prompt_id = {0: 0, 1: 0, 2: 0, 3: 0}
    session.remove_object(1)
    plan_dict = {"new_det_out_inds": [0], "new_det_obj_ids": [3]}
    theirs = upstream_model().build_outputs(
        session, {"mask": torch.from_numpy(det)}, torch.from_numpy(rows), plan_dict
    )
    plan = FramePlan(
        tracked_obj_ids=[0, 1, 2], association=Association(), new_det_inds=[0],
        new_obj_ids=[3], masks=rows,
    )  # fmt: skip
    plan.book.obj_ids = list(session.obj_ids)
    detections = Detections(det, np.ones(1, np.float32), np.zeros((1, 4), np.float32),
                            np.zeros(1, np.int64))  # fmt: skip
    ours = frame_masks(plan, detections, plan.book.obj_ids)
    assert ours.keys() == theirs.keys() == {0, 2, 3}
    for obj_id, mask in theirs.items():
        np.testing.assert_array_equal(ours[obj_id], mask[0].numpy())
    np.testing.assert_array_equal(theirs[2][0].numpy(), rows[1])  # upstream's shift
    owners = frame_masks(plan, detections, plan.tracked_obj_ids)
    assert owners.keys() == {0, 1, 2, 3}
    for row, obj_id in enumerate((0, 1, 2)):
        np.testing.assert_array_equal(owners[obj_id], rows[row])
