"""One frame of one object through the five video graphs (``track_step``'s graph half).

:class:`FrameSteps` runs the graphs of :mod:`..protocol.tracker` through an injected
:class:`GraphRunner` (ORT sessions in-process, BLS calls inside Triton): a frame's features
(cached per session), memory attention, the SAM heads, the memory encoder, a mask used as the
output. The decisions (which frames, which memories, when) are :class:`.tracker.Tracker`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from ..protocol import tracker as protocol
from ..protocol.tracker import TrackingError
from ..resample import antialias_resize
from .config import TrackerConfig
from .frames import decode_frame, preprocess
from .memory import select_memories
from .state import (
    Features,
    FrameOutput,
    ObjectState,
    PointInputs,
    Session,
    from_bfloat16,
    to_bfloat16,
)

COND, NON_COND = "cond_frame_outputs", "non_cond_frame_outputs"
_F32 = np.float32


class GraphRunner(Protocol):
    """Runs one graph: ``run("video_decoder", {name: array}, ["low_res_masks", ...])``."""

    def run(
        self, graph: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]: ...


class FrameSteps:
    """The graph steps of tracking, over the :class:`~.state.Session` each call takes.

    Args:
        runner: executes the graphs.
        config: the variant's tracking settings (from the export).
    """

    def __init__(self, runner: GraphRunner, config: TrackerConfig | None = None) -> None:
        self.runner = runner
        self.config = config or TrackerConfig()
        self.size = self.config.image_size
        self.graph_calls: dict[str, int] = {key: 0 for key in protocol.GRAPHS}

    # -- frames ------------------------------------------------------------------------------
    def features(self, session: Session, frame_idx: int) -> Features:
        """The frame's encoder outputs (cached per session, encoded on a miss)."""
        cached = session.cached_features(frame_idx)
        if cached is not None:
            return cached
        frame = session.frames.get(frame_idx)
        if frame is None:
            raise TrackingError(
                protocol.ERR_FRAME_MISSING,
                f"frame_index: frame {frame_idx} was not uploaded to this session",
                "frame_index",
            )
        if isinstance(frame, bytes):
            frame = decode_frame(frame)
        if frame.shape[:2] != session.video_hw:
            raise TrackingError(
                protocol.ERR_INVALID_INPUT,
                f"frame: frame {frame_idx} is {frame.shape[1]}x{frame.shape[0]}, the video "
                f"{session.video_hw[1]}x{session.video_hw[0]} (W x H)",
                "frame",
            )
        pixels = preprocess(frame, self.size, self.config.preprocessing)
        out = self._run("video_encoder", {"image": pixels})
        features = (out["vision_feats"], out["high_res_feats_0"], out["high_res_feats_1"])
        session.cache_features(frame_idx, features)
        return features

    # -- one frame of one object -------------------------------------------------------------
    def _infer_frame(
        self,
        session: Session,
        obj: ObjectState,
        frame_idx: int,
        is_init: bool,
        points: PointInputs | None,
        reverse: bool,
        *,
        prev_logits: np.ndarray | None = None,
        memory: bool = False,
    ) -> FrameOutput:
        """``track_step`` with point inputs (or none): memory-conditioned features, the SAM
        heads, and (``memory=True``) the memory encoder on the result."""
        vision, high_0, high_1 = self.features(session, frame_idx)
        if is_init:  # directly_add_no_mem_embed: the decoder graph adds it
            pix = vision
        else:
            pix = self._memory_attention(session, obj, frame_idx, vision, reverse)
        num_points = 0 if points is None else len(points.labels)
        multimask = self.config.use_multimask(is_init, num_points)
        # upstream pads once in the prompt encoder, after its own (0, 0, -1) for no points
        if points is None:
            coords = np.zeros((2, 2), _F32)
            labels = np.full(2, -1.0, _F32)
        else:
            coords = np.concatenate([points.coords, np.zeros((1, 2), _F32)]).astype(_F32)
            labels = np.concatenate([points.labels.astype(_F32), [-1.0]]).astype(_F32)
        has_mask = prev_logits is not None
        size = self.config.mask_size
        out = self._run(
            "video_decoder",
            {
                "pix_feat": pix,
                "high_res_feats_0": high_0,
                "high_res_feats_1": high_1,
                "point_coords": coords[None],
                "point_labels": labels[None],
                "mask_input": prev_logits if has_mask else np.zeros((1, 1, size, size), _F32),
                "has_mask_input": np.full((1, 1), float(has_mask), _F32),
                "multimask_output": np.full((1, 1), float(multimask), _F32),
                "add_no_mem_embed": np.full((1, 1), float(is_init), _F32),
            },
        )
        result = FrameOutput(out["low_res_masks"], out["obj_ptr"], out["object_score_logits"])
        if memory:
            result.maskmem = self._encode_memory(
                session, frame_idx, result, from_pts=points is not None
            )
        return result

    def _memory_attention(
        self, session: Session, obj: ObjectState, frame_idx: int, vision: np.ndarray, reverse: bool
    ) -> np.ndarray:
        selection = select_memories(
            self.config,
            frame_idx,
            obj.outputs[COND],
            obj.outputs[NON_COND],
            session.num_frames,
            reverse=reverse,
        )
        memory = np.stack([from_bfloat16(o.maskmem) for o in selection.memories], axis=1)
        hidden = self.config.hidden_dim
        pointers = [o.obj_ptr for o in selection.pointers]
        obj_ptrs = np.stack(pointers, axis=1) if pointers else np.zeros((1, 0, hidden), _F32)
        out = self._run(
            "memory_attention",
            {
                "vision_feats": vision,
                "memory": memory,
                "memory_tpos": np.array([selection.memory_tpos], np.int64),
                "obj_ptrs": obj_ptrs,
                "obj_ptr_tpos": selection.pointer_tpos[None],
            },
        )
        return out["pix_feat"]

    def _encode_memory(
        self, session: Session, frame_idx: int, out: FrameOutput, *, from_pts: bool
    ) -> np.ndarray:
        vision = self.features(session, frame_idx)[0]
        result = self._run(
            "memory_encoder",
            {
                "vision_feats": vision,
                "low_res_masks": out.pred_masks,
                "object_score_logits": out.object_score_logits,
                "is_mask_from_pts": np.full((1, 1), float(from_pts), _F32),
            },
        )
        # upstream keeps memories in bfloat16
        return to_bfloat16(result["maskmem_features"])

    def _mask_as_output(self, session: Session, frame_idx: int, mask: np.ndarray) -> FrameOutput:
        """``_use_mask_as_output``: the mask itself (logits -10 / +10, downsampled with
        antialias) with the pointer and score of the ``mask_prompt`` graph."""
        vision = self.features(session, frame_idx)[0]
        out = self._run("mask_prompt", {"vision_feats": vision, "mask": mask})
        high_res = mask * _F32(protocol.MASK_AS_OUTPUT_SCALE) + _F32(protocol.MASK_AS_OUTPUT_BIAS)
        low_res = antialias_resize(high_res, (self.config.mask_size,) * 2)
        result = FrameOutput(low_res, out["obj_ptr"], out["object_score_logits"])
        if self.config.mask_prompt_memory:  # upstream keeps memories in bfloat16
            result.maskmem = to_bfloat16(out["maskmem_features"])
        return result

    def _run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.graph_calls[graph] += 1
        names = [name for name, _, _ in protocol.GRAPHS[graph][1]]
        if graph == "mask_prompt" and self.config.mask_prompt_memory:
            names.append("maskmem_features")
        return self.runner.run(graph, inputs, names)
