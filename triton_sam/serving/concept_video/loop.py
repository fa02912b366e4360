"""One frame of concept tracking, and a propagation over frames, with the detector's
results and the tracker's steps injected (``Sam3VideoModel.forward`` /
``_det_track_one_frame`` and ``propagate_in_video_iterator``).

The serving model implements :class:`TrackerSteps` with the SAM3 tracker's graphs (BLS calls)
and hands in each frame's detections from the concept graphs; tests implement it with
synthetic masklets. Nothing here runs a network.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .detections import Detections, merge_detections
from .hotstart import HotstartBuffer
from .planning import FramePlan, frame_masks, plan_frame, record_tracker_scores
from .results import PackedFrameResult, postprocess_frame
from .settings import ConceptVideoSettings
from .state import ObjectBook


class TrackerSteps(Protocol):
    """The tracker operations one frame needs, in the order they are called."""

    def propagate(
        self, frame_idx: int, obj_ids: Sequence[int], reverse: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """Propagate every tracked object to ``frame_idx`` without encoding a memory.

        Returns:
            (float32 [K, H, W] low-resolution logits, float32 [K] object score logits),
            rows in ``obj_ids`` order.
        """
        ...

    def encode_memories(
        self,
        frame_idx: int,
        obj_ids: Sequence[int],
        masks: np.ndarray,
        object_scores: np.ndarray,
        conditioning_obj_ids: set[int],
    ) -> None:
        """Encode this frame's memory of each tracked object from ``masks`` [K, 1, H, W]
        and ``object_scores`` [K, 1, 1]; objects in ``conditioning_obj_ids`` keep this frame
        as a conditioning memory (reconditioned)."""
        ...

    def add_objects(
        self, frame_idx: int, obj_ids: Sequence[int], masks: np.ndarray, reverse: bool
    ) -> None:
        """Start tracking new objects from bool [N, H, W] mask prompts on ``frame_idx``."""
        ...

    def remove_objects(self, obj_ids: Sequence[int]) -> None:
        """Stop tracking these objects (their memories are dropped)."""
        ...


@dataclass
class FrameOutput:
    """One frame's raw answer (``Sam3VideoSegmentationOutput``).

    Attributes:
        frame_idx: the frame.
        obj_id_to_mask: object id -> float32 [h, w] low-resolution logits.
        obj_id_to_score: detection probabilities of every object so far.
        obj_id_to_tracker_score: this frame's tracker scores.
        removed_obj_ids: every object removed by hot-start so far.
        suppressed_obj_ids: objects hidden on this frame.
        plan: the frame's plan (what changed).
    """

    frame_idx: int
    obj_id_to_mask: dict[int, np.ndarray]
    obj_id_to_score: dict[int, float]
    obj_id_to_tracker_score: dict[int, float]
    removed_obj_ids: set[int]
    suppressed_obj_ids: set[int]
    plan: FramePlan


def track_frame(
    book: ObjectBook,
    frame_idx: int,
    detections: Mapping[int, Detections],
    tracker: TrackerSteps,
    settings: ConceptVideoSettings,
    *,
    mask_hw: tuple[int, int],
    reverse: bool = False,
    streaming: bool = False,
    upstream_rows: bool = True,
) -> tuple[FrameOutput, ObjectBook]:
    """Detect-and-track one frame (``Sam3VideoModel._det_track_one_frame`` + ``forward``).

    Args:
        book: the session's bookkeeping before this frame (not modified).
        frame_idx: the frame.
        detections: prompt id -> that prompt's detections on this frame
            (:func:`.detections.select_detections`), prompts in the order they were added.
        tracker: the tracker's steps.
        settings: the thresholds.
        mask_hw: (h, w) of the low-resolution masks.
        reverse / streaming: as upstream.
        upstream_rows: give the propagated masks and scores to the session's ids after this
            frame's changes, as upstream does (see :func:`.planning.frame_masks`); False
            gives them to the objects they were propagated for.

    Returns:
        (the frame's output, the session's bookkeeping after it).
    """
    merged = merge_detections(detections, mask_hw)
    tracked = list(book.obj_ids)
    if tracked:
        trk_masks, trk_scores = tracker.propagate(frame_idx, tracked, reverse)
    else:
        trk_masks, trk_scores = np.zeros((0, *mask_hw), np.float32), np.zeros(0, np.float32)
    plan = plan_frame(
        book, frame_idx, merged, trk_masks, trk_scores, settings,
        reverse=reverse, streaming=streaming,
    )  # fmt: skip
    if tracked:
        tracker.encode_memories(
            frame_idx, tracked, plan.memory_masks, plan.memory_object_scores,
            plan.reconditioned_obj_ids,
        )  # fmt: skip
    if plan.new_obj_ids:
        tracker.add_objects(
            frame_idx, plan.new_obj_ids, merged.masks[plan.new_det_inds] >= 0.5, reverse
        )
    if plan.removed_obj_ids:
        tracker.remove_objects(sorted(plan.removed_obj_ids))
    new_book = plan.book
    rows = new_book.obj_ids if upstream_rows else plan.tracked_obj_ids
    output = FrameOutput(
        frame_idx=frame_idx,
        obj_id_to_mask=frame_masks(plan, merged, rows),
        obj_id_to_score=dict(new_book.obj_id_to_score),
        obj_id_to_tracker_score=dict(record_tracker_scores(plan, frame_idx, trk_scores, rows)),
        removed_obj_ids=set(new_book.removed_obj_ids),
        suppressed_obj_ids=set(new_book.suppressed_obj_ids[frame_idx]),
        plan=plan,
    )
    return output, new_book


def processing_order(
    num_frames: int, start_frame_idx: int = 0, max_frames: int | None = None,
    *, reverse: bool = False,
) -> tuple[range, int]:  # fmt: skip
    """The frames a propagation visits and its last frame
    (``Sam3VideoModel._get_processing_order``; in reverse it starts at the frame *before*
    ``start_frame_idx``, as upstream does)."""
    if max_frames is None:
        max_frames = num_frames
    if reverse:
        end = max(start_frame_idx - max_frames, 0)
        return range(start_frame_idx - 1, end - 1, -1), end
    end = min(start_frame_idx + max_frames, num_frames - 1)
    return range(start_frame_idx, end + 1), end


@dataclass
class FrameStep:
    """One processed frame of a propagation and what it released.

    Attributes:
        frame_idx: the frame just processed (tracked and planned).
        processed: frames processed so far in this propagation (this one included).
        book: the session's bookkeeping after this frame, consistent with the tracker's
            state (its memories include this frame): what a caller commits when it stops
            between frames.
        released: (raw output, answer) of each frame the hold-back released now, oldest
            first; empty while answers are held back ``hotstart_delay`` frames.
    """

    frame_idx: int
    processed: int
    book: ObjectBook
    released: list[tuple[FrameOutput, PackedFrameResult]]


def propagate_steps(
    book: ObjectBook,
    frames: range,
    end_frame_idx: int,
    detect: Callable[[int], Mapping[int, Detections]],
    tracker: TrackerSteps,
    settings: ConceptVideoSettings,
    *,
    mask_hw: tuple[int, int],
    video_hw: tuple[int, int],
    reverse: bool = False,
    upstream_rows: bool = True,
) -> Iterator[FrameStep]:
    """Track over ``frames``, one step per processed frame, answering each frame once no
    hot-start removal can hide more of it (``propagate_in_video_iterator`` followed by
    ``postprocess_outputs`` on each frame it yields, at the moment it yields it).

    A step is handed back after every frame, answered or not, because the tracker's memories
    move on every frame while answers trail by ``hotstart_delay``: a caller that stops
    between steps (a cancel) keeps the bookkeeping of the last step, which matches the
    tracker, and drops the answers still held (a later propagation re-answers them).

    Args:
        book: the session's bookkeeping at the start (not modified).
        frames / end_frame_idx: from :func:`processing_order`.
        detect: frame -> its detections per prompt.
        tracker: the tracker's steps; settings: the thresholds.
        mask_hw: low-resolution mask size; video_hw: (H, W) of the frames.
        reverse / upstream_rows: as :func:`track_frame`.

    Yields:
        One :class:`FrameStep` per frame of ``frames``, in processing order.
    """
    buffer: HotstartBuffer[FrameOutput] = HotstartBuffer(settings.hotstart_delay, end_frame_idx)
    for processed, frame_idx in enumerate(frames, start=1):
        output, book = track_frame(
            book, frame_idx, detect(frame_idx), tracker, settings,
            mask_hw=mask_hw, reverse=reverse, upstream_rows=upstream_rows,
        )  # fmt: skip
        if settings.hotstart_delay > 0:
            book.hotstart_removed_obj_ids.update(output.removed_obj_ids)
        released = []
        for held in buffer.push(frame_idx, output):
            hidden = held.suppressed_obj_ids | book.hotstart_removed_obj_ids
            result = postprocess_frame(
                held.frame_idx, held.obj_id_to_mask, held.obj_id_to_score,
                held.obj_id_to_tracker_score, book.obj_id_to_prompt_id, hidden, video_hw,
            )  # fmt: skip
            released.append((held, result))
        yield FrameStep(frame_idx, processed, book, released)


def propagate(
    book: ObjectBook,
    frames: range,
    end_frame_idx: int,
    detect: Callable[[int], Mapping[int, Detections]],
    tracker: TrackerSteps,
    settings: ConceptVideoSettings,
    *,
    mask_hw: tuple[int, int],
    video_hw: tuple[int, int],
    reverse: bool = False,
    upstream_rows: bool = True,
) -> Iterator[tuple[FrameOutput, PackedFrameResult, ObjectBook]]:
    """The answers of :func:`propagate_steps` alone, as upstream's iterator yields them.

    Yields:
        (raw output, answer, the bookkeeping after the frame that released it), frames in
        processing order, each ``hotstart_delay`` frames late (all at the end).
    """
    for step in propagate_steps(
        book, frames, end_frame_idx, detect, tracker, settings,
        mask_hw=mask_hw, video_hw=video_hw, reverse=reverse, upstream_rows=upstream_rows,
    ):  # fmt: skip
        for output, result in step.released:
            yield output, result, step.book
