"""The tracking orchestration: ``SAM2VideoPredictor``'s logic over an injected graph runner.

Dependency-free (numpy only). The runner executes the five graphs of
:mod:`.protocol` (``run(graph, inputs, output_names) -> outputs``, batch dim included): ORT
sessions in-process (:mod:`.runners`), BLS calls inside Triton (the tracker model). Every
decision upstream makes in Python (conditioning or not, which memories, multimask or not,
when to encode a memory) is made here, in upstream's order, so the two agree step by step.

Coordinates: points and boxes in (X, Y) pixels of the original frame; masks returned as
low-res logits [K, 1, 256, 256] for the K objects in ``session.obj_ids`` order (upsample them
to the frame with ``resample.bilinear``, as upstream does); NO_OBJ_SCORE for an object with
no output on that frame.

One loop for both families: the differences are ``TrackerConfig`` data (SAM3 from
``export.sam3_video.tracker_config``: sizes, preprocessing, ``forward_on_prompt``). Per-frame
use from Python (what a caller building on the tracker, e.g. concept tracking, calls)::

    runner = OnnxRuntimeRunner(graphs_dir, keys=protocol.SAM3_GRAPH_KEYS)  # or BLS in Triton
    tracker = Tracker(runner, TrackerConfig.from_json(config_json))
    session = Session(num_frames, (H, W)); session.frames[i] = uint8 [H, W, 3]
    tracker.add_new_points_or_box(session, frame, obj_id, points, labels, box=box)
    for frame in tracker.processing_order(session):   # runs preflight
        obj_ids, logits, scores = tracker.track(session, frame)   # one frame, every object
"""

from __future__ import annotations

import numpy as np

from ..protocol import tracker as protocol
from ..protocol.tracker import TrackingError
from ..resample import antialias_resize
from .frame_steps import COND, NON_COND, FrameSteps, GraphRunner
from .prompts import point_inputs
from .state import FrameOutput, ObjectState, PointInputs, Session

__all__ = ["COND", "NON_COND", "GraphRunner", "Tracker"]
_F32 = np.float32


class Tracker(FrameSteps):
    """Stateless over sessions: every call takes the :class:`Session` it acts on.

    Args:
        runner: executes the graphs.
        config: the variant's tracking settings (from the export).
    """

    # -- prompts -----------------------------------------------------------------------------
    def add_new_points_or_box(
        self,
        session: Session,
        frame_idx: int,
        obj_id: int,
        points: np.ndarray | None = None,
        labels: np.ndarray | None = None,
        *,
        clear_old_points: bool = True,
        normalize_coords: bool = True,
        box: np.ndarray | None = None,
    ) -> tuple[int, list[int], np.ndarray]:
        """Clicks and/or a box on a frame (``SAM2VideoPredictor.add_new_points_or_box``).

        Args:
            points: [N, 2] (X, Y) pixels of the original frame; labels: [N] (1 / 0).
            clear_old_points: replace this object's earlier clicks on the frame.
            normalize_coords: coordinates are pixels (True) or already divided by the
                frame's width and height (False), as upstream.
            box: [4] (X0, Y0, X1, Y1) pixels; placed first as corners labelled 2 and 3.

        Returns:
            (frame_idx, obj_ids, low-res logits [K, 1, 256, 256] of every object).
        """
        self._check_frame(session, frame_idx)
        new = point_inputs(session.video_hw, points, labels, box, normalize_coords, self.size)
        if box is not None and not clear_old_points:
            raise TrackingError(
                protocol.ERR_INVALID_INPUT,
                "box: cannot add a box without clearing old points (a box must come before "
                "any click); use clear_old_points=True",
                "box",
            )
        obj = self._object(session, obj_id, create=True)
        old = None if clear_old_points else obj.point_inputs.get(frame_idx)
        if old is not None:
            new = PointInputs(
                np.concatenate([old.coords, new.coords]), np.concatenate([old.labels, new.labels])
            )
        obj.point_inputs[frame_idx] = new
        obj.mask_inputs.pop(frame_idx, None)
        if self.config.forward_on_prompt:
            return self._forward_on_prompt(session, frame_idx, obj_id)
        is_init, reverse, key = self._prompt_kind(obj, frame_idx)
        prev = obj.temp_outputs[key].get(frame_idx)
        if prev is None:
            prev = obj.outputs[COND].get(frame_idx) or obj.outputs[NON_COND].get(frame_idx)
        prev_logits = None
        if prev is not None:
            limit = protocol.MASK_INPUT_LIMIT
            prev_logits = np.clip(prev.pred_masks, -limit, limit).astype(_F32)
        out = self._infer_frame(
            session, obj, frame_idx, is_init, new, reverse, prev_logits=prev_logits
        )
        obj.temp_outputs[key][frame_idx] = out
        return frame_idx, session.obj_ids, self.consolidate(session, frame_idx, key == COND)

    def add_new_mask(
        self, session: Session, frame_idx: int, obj_id: int, mask: np.ndarray
    ) -> tuple[int, list[int], np.ndarray]:
        """A binary mask [H, W] (any size; the original frame's in practice) on a frame
        (``SAM2VideoPredictor.add_new_mask``)."""
        self._check_frame(session, frame_idx)
        mask = np.asarray(mask)
        if mask.ndim != 2 or 0 in mask.shape:
            raise TrackingError(
                protocol.ERR_INVALID_INPUT, f"mask: got shape {mask.shape}; expected [H, W]", "mask"
            )
        obj = self._object(session, obj_id, create=True)
        full = mask.astype(bool).astype(_F32)[None, None]
        if full.shape[-2:] != (self.size, self.size):
            full = antialias_resize(full, (self.size, self.size))
            full = (full >= 0.5).astype(_F32)
        obj.mask_inputs[frame_idx] = full
        obj.point_inputs.pop(frame_idx, None)
        if self.config.forward_on_prompt:
            return self._forward_on_prompt(session, frame_idx, obj_id)
        _, _, key = self._prompt_kind(obj, frame_idx)
        obj.temp_outputs[key][frame_idx] = self._mask_as_output(session, frame_idx, full)
        return frame_idx, session.obj_ids, self.consolidate(session, frame_idx, key == COND)

    def clear_all_prompts_in_frame(
        self, session: Session, frame_idx: int, obj_id: int, *, need_output: bool = True
    ) -> tuple[int, list[int], np.ndarray] | None:
        """``SAM2VideoPredictor.clear_all_prompts_in_frame``."""
        self._check_frame(session, frame_idx)
        obj = self._object(session, obj_id, create=True)
        obj.point_inputs.pop(frame_idx, None)
        obj.mask_inputs.pop(frame_idx, None)
        obj.temp_outputs[COND].pop(frame_idx, None)
        obj.temp_outputs[NON_COND].pop(frame_idx, None)
        out = obj.outputs[COND].pop(frame_idx, None)
        if out is not None:  # no longer a conditioning frame: downgraded
            obj.outputs[NON_COND][frame_idx] = out
            obj.frames_tracked.pop(frame_idx, None)
        if not need_output:
            return None
        is_cond = any(frame_idx in o.temp_outputs[COND] for o in session.objects.values())
        return frame_idx, session.obj_ids, self.consolidate(session, frame_idx, is_cond)

    def remove_object(
        self, session: Session, obj_id: int, *, strict: bool = False
    ) -> tuple[list[int], list[tuple[int, np.ndarray]]]:
        """``SAM2VideoPredictor.remove_object``: (remaining ids, [(frame, masks)] of the
        frames where the removed object had prompts)."""
        if obj_id not in session.objects:
            if strict:
                raise TrackingError(
                    protocol.ERR_OBJECT_NOT_FOUND,
                    f"object_id: {obj_id} is not in this session (objects: {session.obj_ids})",
                    "object_id",
                )
            return session.obj_ids, []
        if len(session.objects) == 1:
            self.reset_state(session)
            return session.obj_ids, []
        obj = session.objects[obj_id]
        frames = set(obj.point_inputs) | set(obj.mask_inputs)
        for frame_idx in frames:
            self.clear_all_prompts_in_frame(session, frame_idx, obj_id, need_output=False)
        del session.objects[obj_id]
        updated = []
        for frame_idx in frames:
            is_cond = any(frame_idx in o.temp_outputs[COND] for o in session.objects.values())
            updated.append((frame_idx, self.consolidate(session, frame_idx, is_cond)))
        return session.obj_ids, updated

    def reset_state(self, session: Session) -> None:
        """Remove every object, prompt and result (frames and features stay)."""
        session.objects.clear()

    # -- propagation -------------------------------------------------------------------------
    def preflight(self, session: Session) -> int:
        """``propagate_in_video_preflight``: encode the prompted frames' memories and move
        them into the memory bank. Idempotent. Returns the earliest conditioning frame."""
        if not session.objects:
            raise TrackingError(
                protocol.ERR_NO_PROMPTS,
                "no points, box or mask for any object; add prompts before propagating",
            )
        for obj_id, obj in session.objects.items():
            for key in (NON_COND, COND):
                for frame_idx, out in obj.temp_outputs[key].items():
                    if out.maskmem is None:
                        out.maskmem = self._encode_memory(session, frame_idx, out, from_pts=True)
                    obj.outputs[key][frame_idx] = out
                obj.temp_outputs[key].clear()
            if not obj.outputs[COND]:
                raise TrackingError(
                    protocol.ERR_NO_PROMPTS,
                    f"object_id: object {obj_id} has no points, box or mask on any frame",
                    "object_id",
                )
            for frame_idx in obj.outputs[COND]:
                obj.outputs[NON_COND].pop(frame_idx, None)
        return min(t for o in session.objects.values() for t in o.outputs[COND])

    def processing_order(
        self,
        session: Session,
        start_frame_idx: int | None = None,
        max_frame_num_to_track: int | None = None,
        reverse: bool = False,
    ) -> list[int]:
        """The frames ``propagate_in_video`` visits, in order (runs :meth:`preflight`)."""
        start = self.preflight(session)
        if start_frame_idx is not None:
            self._check_frame(session, start_frame_idx, "start_frame_idx")
            start = start_frame_idx
        count = session.num_frames if max_frame_num_to_track is None else max_frame_num_to_track
        if count < 0:
            raise TrackingError(
                protocol.ERR_INVALID_INPUT,
                f"max_frame_num_to_track: got {count}, expected >= 0",
                "max_frame_num_to_track",
            )
        if reverse:
            end = max(start - count, 0)
            return list(range(start, end - 1, -1)) if start > 0 else []
        end = min(start + count, session.num_frames - 1)
        return list(range(start, end + 1))

    def track(
        self, session: Session, frame_idx: int, reverse: bool = False
    ) -> tuple[list[int], np.ndarray, np.ndarray]:
        """One step of ``propagate_in_video``: every object on ``frame_idx``.

        Returns:
            (obj_ids, low-res logits [K, 1, 256, 256], object score logits [K]).
        """
        self._check_frame(session, frame_idx)
        self.preflight(session)  # a no-op unless prompts were added since the last call
        masks, scores = [], []
        for obj in session.objects.values():
            out = obj.outputs[COND].get(frame_idx)
            if out is None:
                out = self._infer_frame(session, obj, frame_idx, False, None, reverse, memory=True)
                obj.outputs[NON_COND][frame_idx] = out
                obj.frames_tracked[frame_idx] = reverse
            elif not self.config.forward_on_prompt:  # transformers never marks a cond frame
                obj.frames_tracked[frame_idx] = reverse
            masks.append(out.pred_masks)
            scores.append(out.object_score_logits.reshape(-1))
        return session.obj_ids, np.concatenate(masks), np.concatenate(scores)

    def consolidate(self, session: Session, frame_idx: int, is_cond: bool) -> np.ndarray:
        """Every object's latest low-res logits on a frame, NO_OBJ_SCORE where it has none
        (``_consolidate_temp_output_across_obj``)."""
        size = self.config.mask_size
        masks = np.full((len(session.objects), 1, size, size), protocol.NO_OBJ_SCORE, _F32)
        for i, out in enumerate(self._latest(session, frame_idx, is_cond)):
            if out is not None:
                masks[i] = out.pred_masks[0]
        return masks

    def object_scores(self, session: Session, frame_idx: int, is_cond: bool) -> np.ndarray:
        """Every object's latest object score logit on a frame (> 0: present), NaN where it
        has no output; float32 [K], the objects of :meth:`consolidate`."""
        scores = np.full(len(session.objects), np.nan, _F32)
        for i, out in enumerate(self._latest(session, frame_idx, is_cond)):
            if out is not None:
                scores[i] = out.object_score_logits.reshape(-1)[0]
        return scores

    def _latest(self, session: Session, frame_idx: int, is_cond: bool) -> list[FrameOutput | None]:
        key = COND if is_cond else NON_COND
        latest = []
        for obj in session.objects.values():
            out = obj.temp_outputs[key].get(frame_idx)
            if out is None:
                out = obj.outputs[COND].get(frame_idx) or obj.outputs[NON_COND].get(frame_idx)
            latest.append(out)
        return latest

    def _forward_on_prompt(
        self, session: Session, frame_idx: int, prompted: int
    ) -> tuple[int, list[int], np.ndarray]:
        """A prompt as ``Sam3TrackerVideoModel.forward(session, frame_idx)`` runs it (see
        ``TrackerConfig.forward_on_prompt``): every object on the frame, then the memories of
        those that ran, encoded together."""
        ran: list[FrameOutput] = []
        masks = []
        for obj_id, obj in session.objects.items():
            cond = obj.outputs[COND].get(frame_idx)
            if obj_id == prompted:
                is_init = frame_idx not in obj.frames_tracked
                mask = obj.mask_inputs.get(frame_idx)
                if mask is not None:  # its memory comes with it (mask_prompt_memory)
                    out = self._mask_as_output(session, frame_idx, mask)
                else:
                    points = obj.point_inputs[frame_idx]
                    out = self._infer_frame(session, obj, frame_idx, is_init, points, False)
                obj.outputs[COND if is_init else NON_COND][frame_idx] = out
                ran.append(out)
            elif cond is not None:  # cached, not run again
                is_init, out = True, cond
            else:  # tracked on this frame from its memory
                is_init = False
                out = self._infer_frame(session, obj, frame_idx, False, None, False)
                obj.outputs[NON_COND][frame_idx] = out
                ran.append(out)
            if not is_init:
                obj.frames_tracked[frame_idx] = False
            masks.append(out.pred_masks)
        # One batched memory encoding upstream, with one is_mask_from_pts for the batch: true
        # because the prompted object is in it.
        for out in ran:
            if out.maskmem is None:
                out.maskmem = self._encode_memory(session, frame_idx, out, from_pts=True)
        return frame_idx, session.obj_ids, np.concatenate(masks)

    # -- helpers ---------------------------------------------------------------------------------
    def _prompt_kind(self, obj: ObjectState, frame_idx: int) -> tuple[bool, bool, str]:
        """(is_init_cond_frame, reverse, storage key) of a prompt on this frame."""
        is_init = frame_idx not in obj.frames_tracked
        reverse = False if is_init else obj.frames_tracked[frame_idx]
        is_cond = is_init or self.config.add_all_frames_to_correct_as_cond
        return is_init, reverse, COND if is_cond else NON_COND

    def _object(self, session: Session, obj_id: int, *, create: bool) -> ObjectState:
        obj = session.objects.get(obj_id)
        if obj is None:
            if not create:
                raise TrackingError(
                    protocol.ERR_OBJECT_NOT_FOUND,
                    f"object_id: {obj_id} is not in this session (objects: {session.obj_ids})",
                    "object_id",
                )
            if len(session.objects) >= protocol.MAX_OBJECTS:
                raise TrackingError(
                    protocol.ERR_LIMIT,
                    f"object_id: at most {protocol.MAX_OBJECTS} objects per session",
                    "object_id",
                )
            obj = session.objects[obj_id] = ObjectState()
        return obj

    @staticmethod
    def _check_frame(session: Session, frame_idx: int, field: str = "frame_index") -> None:
        if not 0 <= frame_idx < session.num_frames:
            raise TrackingError(
                protocol.ERR_FRAME_OUT_OF_RANGE,
                f"{field}: got {frame_idx}, expected 0..{session.num_frames - 1}",
                field,
            )
