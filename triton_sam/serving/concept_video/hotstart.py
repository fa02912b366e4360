"""Hot-start: remove objects that were unmatched or duplicated soon after their birth, keep
the keep-alive counters, and hold answers back so removals can still hide them.

Mirrors ``Sam3VideoModel._process_hotstart`` and the output buffer of
``Sam3VideoModel.propagate_in_video_iterator``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Generic, TypeVar

from .settings import ConceptVideoSettings
from .state import ObjectBook

T = TypeVar("T")


def process_hotstart(
    book: ObjectBook,
    frame_idx: int,
    *,
    reverse: bool,
    det_to_matched_obj_ids: Mapping[int, Sequence[int]],
    new_obj_ids: Sequence[int],
    empty_obj_ids: Sequence[int],
    unmatched_obj_ids: Sequence[int],
    settings: ConceptVideoSettings,
    streaming: bool = False,
) -> set[int]:
    """Update the hot-start bookkeeping of ``book`` for one frame and decide removals
    (``Sam3VideoModel._process_hotstart``). ``book`` is modified in place (pass a copy).

    1. New objects are born this frame with ``init_trk_keep_alive``; matched objects gain
       one keep-alive (up to the max), unmatched ones lose one (down to the min).
    2. An object born within ``hotstart_delay`` frames of this one that has been unmatched
       on ``hotstart_unmatch_thresh`` frames is removed; with
       ``suppress_unmatched_only_within_hotstart`` off, one whose keep-alive fell to 0 is
       hidden on this frame.
    3. When one detection matches several objects, each later-born one counts a frame of
       overlap with the earliest-born; a later object born within the delay that overlapped
       on ``hotstart_dup_thresh`` frames is removed.
    Streaming (frames arriving one by one, no look-ahead) keeps the counts but removes
    nothing, as upstream does.

    Args:
        book: the session's bookkeeping (modified).
        frame_idx: this frame; reverse: propagating backwards.
        det_to_matched_obj_ids / empty_obj_ids / unmatched_obj_ids: the association's.
        new_obj_ids: ids issued to this frame's new objects.
        settings: hot-start thresholds.
        streaming: frames are streamed (no removals).

    Returns:
        The ids newly removed on this frame (also added to ``book.removed_obj_ids``).
    """
    first_frame = book.obj_first_frame_idx
    keep_alive = book.trk_keep_alive
    suppressed = book.suppressed_obj_ids[frame_idx]
    newly_removed: set[int] = set()
    hotstart_diff = (
        frame_idx - settings.hotstart_delay if not reverse else frame_idx + settings.hotstart_delay
    )

    def within_hotstart(obj_id: int) -> bool:
        born = first_frame[obj_id]
        return (born > hotstart_diff and not reverse) or (born < hotstart_diff and reverse)

    for obj_id in new_obj_ids:
        first_frame.setdefault(obj_id, frame_idx)
        keep_alive[int(obj_id)] = settings.init_trk_keep_alive
    matched = {int(o) for objs in det_to_matched_obj_ids.values() for o in objs}
    for obj_id in matched:
        keep_alive[obj_id] = min(settings.max_trk_keep_alive, keep_alive[obj_id] + 1)
    for obj_id in unmatched_obj_ids:
        book.unmatched_frame_inds[obj_id].append(frame_idx)
        keep_alive[int(obj_id)] = max(settings.min_trk_keep_alive, keep_alive[int(obj_id)] - 1)
    if settings.decrease_trk_keep_alive_for_empty_masklets:
        for obj_id in empty_obj_ids:
            keep_alive[int(obj_id)] = max(settings.min_trk_keep_alive, keep_alive[int(obj_id)] - 1)

    if not streaming:
        for obj_id, frames in book.unmatched_frame_inds.items():
            if obj_id in book.removed_obj_ids or obj_id in newly_removed:
                continue
            if len(frames) >= settings.hotstart_unmatch_thresh and within_hotstart(obj_id):
                newly_removed.add(obj_id)
            if (
                keep_alive[obj_id] <= 0
                and not settings.suppress_unmatched_only_within_hotstart
                and obj_id not in book.removed_obj_ids
                and obj_id not in newly_removed
            ):
                suppressed.add(obj_id)

    for objs in det_to_matched_obj_ids.values():
        if len(objs) < 2:
            continue  # only a detection matched by several objects marks duplicates
        pick = min if not reverse else max
        earliest = pick(objs, key=lambda o: first_frame[o])
        for obj_id in objs:
            if obj_id != earliest:
                book.overlap_pair_to_frame_inds[(earliest, obj_id)].append(frame_idx)

    if not streaming:
        for (_, obj_id), frames in book.overlap_pair_to_frame_inds.items():
            if obj_id in book.removed_obj_ids or obj_id in newly_removed:
                continue
            if within_hotstart(obj_id) and len(frames) >= settings.hotstart_dup_thresh:
                newly_removed.add(obj_id)

    book.removed_obj_ids.update(newly_removed)
    return newly_removed


class HotstartBuffer(Generic[T]):
    """Holds each frame's answer back ``hotstart_delay`` frames, so that an object removed by
    hot-start within that time is hidden on every frame it was ever answered on (the buffer
    of ``Sam3VideoModel.propagate_in_video_iterator``).

    Args:
        delay: ``hotstart_delay`` (0: every answer at once).
        end_frame_idx: the last frame of this propagation: everything held is released then.
    """

    def __init__(self, delay: int, end_frame_idx: int) -> None:
        self.delay = delay
        self.end_frame_idx = end_frame_idx
        self._held: list[T] = []

    def push(self, frame_idx: int, answer: T) -> list[T]:
        """Add this frame's answer; returns the answers now released, oldest first."""
        if self.delay <= 0:
            return [answer]
        self._held.append(answer)
        if frame_idx == self.end_frame_idx:
            released, self._held = self._held, []
        elif len(self._held) >= self.delay:
            released, self._held = self._held[:1], self._held[1:]
        else:
            released = []
        return released

    def held(self) -> Iterable[T]:
        """The answers held now (an interrupted propagation can release or drop them)."""
        return tuple(self._held)
