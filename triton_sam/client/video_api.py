"""``SAM2VideoPredictor``'s prompt and propagation calls, written once for both trackers.

:class:`~triton_sam.client.video.SAM2VideoTritonClient` (the tracker model in Triton) and
:class:`~triton_sam.client.video_local.OnnxVideoPredictor` (the same orchestration
in-process) take upstream's long keyword lists the same way; this base holds those
signatures and their docs, and hands each backend the call's arguments as one typed object.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

StateT = TypeVar("StateT")
Masks = tuple[int, list[int], np.ndarray]  # (frame_idx, obj_ids, logits [K, 1, H, W])


@dataclass(frozen=True)
class PointsPrompt:
    """One object's clicks and/or box on one frame, as the user gave them (not yet arrays)."""

    frame_idx: int
    obj_id: int
    points: object
    labels: object
    box: object
    clear_old_points: bool
    normalize_coords: bool


@dataclass(frozen=True)
class Propagation:
    """Where ``propagate_in_video`` starts, how far it goes (None: upstream's defaults), and
    which way."""

    start_frame_idx: int | None
    max_frame_num_to_track: int | None
    reverse: bool


class VideoPredictorAPI(Generic[StateT]):
    """Upstream's ``add_new_points_or_box`` and ``propagate_in_video``; a subclass says how
    each runs (:meth:`_add_points`, :meth:`_propagate`)."""

    def add_new_points_or_box(
        self,
        state: StateT,
        frame_idx: int,
        obj_id: int,
        points: object = None,
        labels: object = None,
        clear_old_points: bool = True,
        normalize_coords: bool = True,
        box: object = None,
    ) -> Masks:
        """Clicks ((X, Y) pixels, labels 1 = object / 0 = background) and/or a box
        (X0, Y0, X1, Y1) for one object on one frame.

        Returns:
            (frame_idx, obj_ids, float32 logits [K, 1, H, W] of every object at the video's
            resolution; > 0 is the mask).

        Raises:
            FrameIndexError, InputValidationError (naming the field), TrackingLimitError.
        """
        prompt = PointsPrompt(
            frame_idx, obj_id, points, labels, box, clear_old_points, normalize_coords
        )
        return self._add_points(state, prompt)

    def propagate_in_video(
        self,
        state: StateT,
        start_frame_idx: int | None = None,
        max_frame_num_to_track: int | None = None,
        reverse: bool = False,
    ) -> Iterator[Masks]:
        """Track every object through the video; yields (frame_idx, obj_ids, logits
        [K, 1, H, W] at the video's resolution) frame by frame, in upstream's order.

        Over Triton, one request per frame: stop iterating (or call
        :meth:`~triton_sam.client.video.SAM2VideoTritonClient.cancel_propagation` from
        another thread) and nothing past the frame in flight runs on the server; over gRPC
        the request in flight is cancelled too.

        Raises:
            NoPromptsError: no object has prompts. FrameIndexError: a bad start frame.
        """
        yield from self._propagate(
            state, Propagation(start_frame_idx, max_frame_num_to_track, reverse)
        )

    def _add_points(self, state: StateT, prompt: PointsPrompt) -> Masks:
        raise NotImplementedError

    def _propagate(self, state: StateT, run: Propagation) -> Iterator[Masks]:
        raise NotImplementedError


__all__ = ["Masks", "PointsPrompt", "Propagation", "VideoPredictorAPI"]
