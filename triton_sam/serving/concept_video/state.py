"""What a concept-tracking session remembers about its objects between frames.

The fields of ``Sam3VideoInferenceSession`` that the orchestration reads and writes (not the
tracker's memories, which the tracker keeps, nor the frames). Names are upstream's, so a
reader can follow both side by side.
"""

from __future__ import annotations

from collections import defaultdict
from copy import deepcopy
from dataclasses import dataclass, field

# ``obj_id_to_score`` of an object removed by hot-start: kept, but far below any threshold.
REMOVED_SCORE = -1e4


@dataclass
class ObjectBook:
    """Per-object bookkeeping of one session (``Sam3VideoInferenceSession``'s fields).

    Attributes:
        obj_ids: the tracked objects, in the tracker's order (rows of its masks).
        obj_id_to_prompt_id: the prompt that detected each object (never changes).
        obj_id_to_score: detection probability at birth (``REMOVED_SCORE`` once removed).
        obj_id_to_tracker_score_frame_wise: frame -> object -> sigmoid of the tracker's
            object score that frame (the detection probability on the birth frame).
        obj_id_to_last_occluded: frame each object was last empty or suppressed (absent:
            never).
        max_obj_id: the largest id issued (-1 before the first); ids are never reused.
        obj_first_frame_idx: the frame each object was born on.
        unmatched_frame_inds: frames on which each object was non-empty and unmatched.
        trk_keep_alive: each object's keep-alive counter.
        overlap_pair_to_frame_inds: (earlier object, later object) -> frames on which one
            detection matched both.
        removed_obj_ids: objects removed by hot-start (their answers are hidden).
        suppressed_obj_ids: frame -> objects hidden on that frame (long unmatched).
        hotstart_removed_obj_ids: removed ids gathered while answers are held back
            (``propagate_in_video_iterator``), hidden in every answer after.
    """

    obj_ids: list[int] = field(default_factory=list)
    obj_id_to_prompt_id: dict[int, int] = field(default_factory=dict)
    obj_id_to_score: dict[int, float] = field(default_factory=dict)
    obj_id_to_tracker_score_frame_wise: defaultdict[int, dict[int, float]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    obj_id_to_last_occluded: dict[int, int] = field(default_factory=dict)
    max_obj_id: int = -1
    obj_first_frame_idx: dict[int, int] = field(default_factory=dict)
    unmatched_frame_inds: defaultdict[int, list[int]] = field(
        default_factory=lambda: defaultdict(list)
    )
    trk_keep_alive: dict[int, int] = field(default_factory=dict)
    overlap_pair_to_frame_inds: defaultdict[tuple[int, int], list[int]] = field(
        default_factory=lambda: defaultdict(list)
    )
    removed_obj_ids: set[int] = field(default_factory=set)
    suppressed_obj_ids: defaultdict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    hotstart_removed_obj_ids: set[int] = field(default_factory=set)

    def copy(self) -> ObjectBook:
        """A deep copy: a frame's plan is made on a copy and committed whole, as upstream
        builds ``tracker_metadata_new`` from deep copies and assigns it at the end."""
        return deepcopy(self)
