""":class:`.loop.TrackerSteps` over the SAM3 tracker's graphs: what ``Sam3VideoModel`` asks
of its ``Sam3TrackerVideoModel`` on each frame, made of the tracking loop's graph steps
(:class:`~triton_sam.serving.tracking.frame_steps.FrameSteps`: the same graphs, memory
selection and bfloat16 memories as the tracker family's own loop).

The tracker calls of one frame, as upstream makes them:

- ``run_tracker_propagation``: ``tracker_model(session, frame_idx, run_mem_encoder=False)``:
  every object on the frame from its memories; the output is stored as a non-conditioning
  output with no memory yet.
- ``_tracker_update_memories``: one memory-encoder run on the planned masks (288x288 logits,
  passed as upstream's "high-res" masks) and scores ±10, ``is_mask_from_pts=False``; a
  reconditioned object's output moves to the conditioning outputs first.
- ``_tracker_add_new_objects``: each new object's detection mask (bool, 288x288) as a mask
  input stored in the session's float dtype, i.e. 0/1, which ``_use_mask_as_output`` resizes
  to 1008 (antialiased bilinear, *not* thresholded again) and runs as a mask prompt with its
  memory (a conditioning frame).
- ``session.remove_object``: the object's state is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..protocol import tracker as protocol
from ..protocol.tracker import TrackingError
from ..resample import antialias_resize
from ..tracking.frame_steps import COND, NON_COND, FrameSteps
from ..tracking.state import FrameOutput, ObjectState, Session, to_bfloat16

_F32 = np.float32


class GraphTrackerSteps(FrameSteps):
    """The tracker's steps for one concept session on a graph runner.

    Args:
        runner / config: as :class:`FrameSteps` (SAM3's graphs and ``TrackerConfig``).
        session: the tracker session (its frames uploaded; objects are added here).
    """

    def __init__(self, runner, config, session: Session) -> None:
        super().__init__(runner, config)
        self.session = session

    def propagate(
        self, frame_idx: int, obj_ids: Sequence[int], reverse: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every object on ``frame_idx`` without a memory: (float32 [K, 288, 288] logits,
        float32 [K] object score logits), rows in ``obj_ids`` order."""
        masks, scores = [], []
        for obj_id in obj_ids:
            obj = self.session.objects[obj_id]
            out = obj.outputs[COND].get(frame_idx)
            if out is None:
                out = self._infer_frame(self.session, obj, frame_idx, False, None, reverse)
                obj.outputs[NON_COND][frame_idx] = out
                obj.frames_tracked[frame_idx] = reverse
            masks.append(out.pred_masks[0, 0])
            scores.append(out.object_score_logits.reshape(()))
        return np.stack(masks).astype(_F32), np.asarray(scores, _F32)

    def encode_memories(
        self,
        frame_idx: int,
        obj_ids: Sequence[int],
        masks: np.ndarray,
        object_scores: np.ndarray,
        conditioning_obj_ids: set[int],
    ) -> None:
        """This frame's memory of each object from ``masks`` [K, 1, 288, 288] and
        ``object_scores`` [K, 1, 1]; reconditioned objects keep the frame as conditioning."""
        vision = self.features(self.session, frame_idx)[0]
        for row, obj_id in enumerate(obj_ids):
            obj = self.session.objects[obj_id]
            if obj_id in conditioning_obj_ids and frame_idx in obj.outputs[NON_COND]:
                obj.outputs[COND][frame_idx] = obj.outputs[NON_COND].pop(frame_idx)
            result = self._run(
                "memory_encoder",
                {
                    "vision_feats": vision,
                    "low_res_masks": np.asarray(masks[row : row + 1], _F32),
                    "object_score_logits": np.asarray(object_scores[row], _F32).reshape(1, 1),
                    "is_mask_from_pts": np.zeros((1, 1), _F32),
                },
            )
            memory = to_bfloat16(result["maskmem_features"])  # upstream keeps bfloat16
            for key in (COND, NON_COND):
                out = obj.outputs[key].get(frame_idx)
                if out is not None:
                    out.maskmem = memory

    def add_objects(
        self, frame_idx: int, obj_ids: Sequence[int], masks: np.ndarray, reverse: bool
    ) -> None:
        """New objects from bool [N, 288, 288] mask prompts on ``frame_idx`` (conditioning
        outputs with their memories)."""
        size = self.config.image_size
        for obj_id, mask in zip(obj_ids, masks, strict=True):
            full = np.asarray(mask, _F32)[None, None]
            full = antialias_resize(full, (size, size))  # upstream: no threshold after it
            obj = ObjectState()
            obj.mask_inputs[frame_idx] = full
            obj.outputs[COND][frame_idx] = self._mask_output(frame_idx, full)
            self.session.objects[obj_id] = obj

    def _mask_output(self, frame_idx: int, full: np.ndarray) -> FrameOutput:
        out = self._mask_as_output(self.session, frame_idx, full)
        if out.maskmem is None:
            # upstream encodes a new object's memory from its mask prompt on its birth frame
            raise TrackingError(
                protocol.ERR_INTERNAL,
                "config.mask_prompt_memory: got False; expected True (SAM3's mask prompt graph "
                "gives the memory)",
                "mask_prompt_memory",
            )
        return out

    def remove_objects(self, obj_ids: Sequence[int]) -> None:
        """Drop these objects and their memories."""
        for obj_id in obj_ids:
            self.session.objects.pop(obj_id, None)
