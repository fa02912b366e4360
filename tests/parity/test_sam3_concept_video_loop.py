"""Concept tracking's propagation (``triton_sam.serving.concept_video.loop``) against
transformers' own ``Sam3VideoModel.propagate_in_video_iterator`` / ``forward`` +
``Sam3VideoProcessor.postprocess_outputs`` (transformers 5.23), driven by the same synthetic
detector and tracker (``tests/concept_video_support.py``): the tracker is called the same
way (memory-encoder inputs included), and every answered frame has the same ids, scores,
boxes and masks, forwards, in reverse and streamed.

Tolerances: none (see ``test_sam3_concept_video_steps.py``) except the tracker scores'
sigmoid, compared to 1 float32 ulp (|d| <= 1.2e-7).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from concept_video_support import (
    FRAMES,
    MASK_HW,
    SETTINGS,
    VIDEO_HW,
    UpstreamRun,
    World,
    WorldTracker,
)

from triton_sam.serving.concept_video.loop import (
    processing_order,
    propagate,
    propagate_steps,
    track_frame,
)
from triton_sam.serving.concept_video.results import postprocess_frame
from triton_sam.serving.concept_video.settings import ConceptVideoSettings
from triton_sam.serving.concept_video.state import ObjectBook
from triton_sam.serving.masks import decode_rle

SIGMOID_ATOL = 1.2e-7  # one float32 ulp at values in [0.5, 1)


@functools.cache
def _run_both(world_seed: int, settings: ConceptVideoSettings = SETTINGS, reverse=False):
    """Upstream's and our propagation over one world (cached: several tests read the
    default run; the results are only read)."""
    world = World.build(world_seed)
    theirs_tracker = WorldTracker(world)
    up = UpstreamRun(world, theirs_tracker, settings)
    start = FRAMES - 1 if reverse else 0
    theirs = list(up.run(reverse=reverse, start=start + (1 if reverse else 0)))
    ours_tracker = WorldTracker(world)
    frames, end = processing_order(FRAMES, start + (1 if reverse else 0), reverse=reverse)
    ours = list(
        propagate(
            ObjectBook(), frames, end, world.detections, ours_tracker, settings,
            mask_hw=MASK_HW, video_hw=VIDEO_HW, reverse=reverse,
        )
    )  # fmt: skip
    return theirs, ours, up, theirs_tracker.calls, ours_tracker.calls


def _normalised(calls: list) -> list:
    """Tracker calls with consecutive single removals merged (upstream removes one by one,
    in set order; ours removes the frame's removals at once, sorted)."""
    out = []
    for call in calls:
        if call[0] == "remove" and out and out[-1][0] == "remove":
            out[-1] = ("remove", sorted(out[-1][1] + call[1]))
        else:
            out.append((call[0], *call[1:]) if call[0] != "remove" else ("remove", sorted(call[1])))
    return out


def _assert_calls_equal(theirs: list, ours: list) -> None:
    theirs, ours = _normalised(theirs), _normalised(ours)
    assert [c[:3] if c[0] != "remove" else c for c in ours] == [
        c[:3] if c[0] != "remove" else c for c in theirs
    ]
    for a, b in zip(ours, theirs, strict=True):
        for x, y in zip(a[3:], b[3:], strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize(
    "world_seed, overrides, reverse",
    [
        (0, {}, False),
        (1, {"recondition_on_trk_masks": False}, False),
        (2, {"suppress_unmatched_only_within_hotstart": False, "min_trk_keep_alive": -2}, False),
        (3, {"decrease_trk_keep_alive_for_empty_masklets": True}, True),
        (4, {"suppress_overlapping_based_on_recent_occlusion_threshold": 0.0}, False),
    ],
)
def test_propagation_matches_upstream_frame_by_frame(world_seed, overrides, reverse) -> None:
    settings = ConceptVideoSettings(**{**vars(SETTINGS), **overrides})
    theirs, ours, up, their_calls, our_calls = _run_both(world_seed, settings, reverse)
    _assert_calls_equal(their_calls, our_calls)
    assert len(ours) == len(theirs) == FRAMES  # reverse starts at FRAMES: FRAMES - 1 .. 0
    for (their_out, their_answer), (our_out, our_answer, _) in zip(theirs, ours, strict=True):
        assert our_out.frame_idx == their_out.frame_idx
        assert set(our_out.obj_id_to_mask) == set(their_out.obj_id_to_mask)
        for obj_id, mask in their_out.obj_id_to_mask.items():
            np.testing.assert_array_equal(our_out.obj_id_to_mask[obj_id], mask[0].numpy())
        assert our_out.obj_id_to_score == their_out.obj_id_to_score
        assert our_out.obj_id_to_tracker_score.keys() == their_out.obj_id_to_tracker_score.keys()
        for obj_id, score in their_out.obj_id_to_tracker_score.items():
            assert abs(our_out.obj_id_to_tracker_score[obj_id] - score) <= SIGMOID_ATOL
        assert our_out.removed_obj_ids == their_out.removed_obj_ids
        assert our_out.suppressed_obj_ids == their_out.suppressed_obj_ids
        np.testing.assert_array_equal(our_answer.object_ids, their_answer["object_ids"].numpy())
        np.testing.assert_array_equal(our_answer.scores, their_answer["scores"].numpy())
        np.testing.assert_array_equal(our_answer.boxes, their_answer["boxes"].numpy())
        np.testing.assert_array_equal(our_answer.masks, their_answer["masks"].numpy())
    # the session's bookkeeping at the end, field by field
    book, session = ours[-1][2], up.session
    assert book.obj_ids == session.obj_ids
    assert book.max_obj_id == session.max_obj_id
    assert book.obj_first_frame_idx == session.obj_first_frame_idx
    assert dict(book.unmatched_frame_inds) == dict(session.unmatched_frame_inds)
    assert book.trk_keep_alive == session.trk_keep_alive
    assert dict(book.overlap_pair_to_frame_inds) == dict(session.overlap_pair_to_frame_inds)
    assert book.removed_obj_ids == session.removed_obj_ids
    assert book.hotstart_removed_obj_ids == session.hotstart_removed_obj_ids
    assert book.obj_id_to_prompt_id == session.obj_id_to_prompt_id
    assert book.obj_id_to_last_occluded == {
        k: int(v) for k, v in session.obj_id_to_last_occluded.items()
    }


def test_streamed_frames_match_upstream_forward() -> None:
    """Frames streamed one by one (``Sam3VideoModel.forward(frame=...)``): hot-start keeps
    its counts but removes nothing, answers are not held back."""
    world = World.build(5)
    their_tracker, our_tracker = WorldTracker(world), WorldTracker(world)
    up = UpstreamRun(world, their_tracker, streamed=True)
    theirs = list(up.stream())
    book = ObjectBook()
    for frame, (their_out, their_answer) in enumerate(theirs):
        out, book = track_frame(
            book, frame, world.detections(frame), our_tracker, SETTINGS,
            mask_hw=MASK_HW, streaming=True,
        )  # fmt: skip
        answer = postprocess_frame(
            frame, out.obj_id_to_mask, out.obj_id_to_score, out.obj_id_to_tracker_score,
            book.obj_id_to_prompt_id, out.suppressed_obj_ids, VIDEO_HW,
        )  # fmt: skip
        assert out.removed_obj_ids == their_out.removed_obj_ids == set()
        np.testing.assert_array_equal(answer.object_ids, their_answer["object_ids"].numpy())
        np.testing.assert_array_equal(answer.masks, their_answer["masks"].numpy())
        np.testing.assert_array_equal(answer.boxes, their_answer["boxes"].numpy())
    _assert_calls_equal(their_tracker.calls, our_tracker.calls)
    assert dict(book.overlap_pair_to_frame_inds) == dict(up.session.overlap_pair_to_frame_inds)
    assert book.overlap_pair_to_frame_inds  # duplicates were seen, and kept
    assert book.obj_ids == up.session.obj_ids


def test_the_world_exercises_every_heuristic() -> None:
    """The scenario cannot pass vacuously: each heuristic fires in upstream's own run."""
    theirs, ours, up, their_calls, _ = _run_both(0)
    plans = up.plans
    removed = set().union(*(p["obj_ids_newly_removed"] for p in plans))
    duplicates = {b for (_, b), frames in up.session.overlap_pair_to_frame_inds.items()
                  if len(frames) >= SETTINGS.hotstart_dup_thresh}  # fmt: skip
    assert duplicates & removed, "a duplicate removed"
    assert removed - duplicates, "an unmatched object removed"
    assert sum(p["num_obj_dropped_due_to_limit"] for p in plans) > 0, "the object limit cut"
    assert any(p["reconditioned_obj_ids"] for p in plans), "a reconditioning"
    suppressed_rows = sum(
        int((call[3].reshape(len(call[3]), -1) == -10).all(axis=1).sum())
        for call in their_calls if call[0] == "memory"
    )  # fmt: skip
    assert suppressed_rows > 0, "a masklet suppressed as the more recently occluded"
    births = [p["new_det_obj_ids"] for p in plans]
    assert any(births[5:]), "objects picked up after the first frames"
    prompts = {up.session.obj_id_to_prompt_id.get(o) for o in up.session.obj_ids}
    assert prompts == {0, 1}, "objects of both prompts tracked"
    assert any(len(answer["object_ids"]) >= 4 for _, answer in theirs)


def test_answers_encode_as_coco_rle() -> None:
    _, ours, _, _, _ = _run_both(0)
    answer = ours[-1][1]
    assert len(answer.object_ids) >= 3
    for mask, counts in zip(answer.masks, answer.rle(), strict=True):
        np.testing.assert_array_equal(decode_rle(counts, VIDEO_HW), mask)


def test_steps_hand_back_the_book_after_every_frame() -> None:
    """A propagation stopped between frames (a cancel) and resumed from the next frame with
    the last step's bookkeeping calls the tracker exactly as one uninterrupted run and ends
    with the same bookkeeping: the book of every step matches the tracker's state, although
    answers trail by ``hotstart_delay`` frames."""
    world = World.build(0)
    whole_tracker, split_tracker = WorldTracker(world), WorldTracker(world)
    frames, end = processing_order(FRAMES)
    kw = dict(mask_hw=MASK_HW, video_hw=VIDEO_HW)
    whole = list(propagate_steps(ObjectBook(), frames, end, world.detections, whole_tracker,
                                 SETTINGS, **kw))  # fmt: skip
    assert [s.frame_idx for s in whole] == list(frames)
    assert [s.processed for s in whole] == list(range(1, FRAMES + 1))
    released = [len(s.released) for s in whole]
    delay = SETTINGS.hotstart_delay
    assert released == [0] * (delay - 1) + [1] * (FRAMES - delay) + [delay]
    # the answers are upstream's (checked above through propagate, which reads these steps)
    flat = [r.frame_idx for s in whole for r, _ in s.released]
    assert flat == list(frames)

    stop = 11  # frames 0..10 processed, then a cancel
    first = propagate_steps(ObjectBook(), frames, end, world.detections, split_tracker,
                            SETTINGS, **kw)  # fmt: skip
    steps = [next(first) for _ in range(stop)]
    first.close()
    assert sum(len(s.released) for s in steps) == stop - delay + 1  # the rest held, dropped
    rest_frames, rest_end = processing_order(FRAMES, stop)
    rest = list(propagate_steps(steps[-1].book, rest_frames, rest_end, world.detections,
                                split_tracker, SETTINGS, **kw))  # fmt: skip
    _assert_calls_equal(whole_tracker.calls, split_tracker.calls)
    assert rest[-1].book == whole[-1].book
