"""Per-session tracking state (dependency-free, numpy only).

Mirrors ``SAM2VideoPredictor``'s ``inference_state``: per object, the point/mask inputs per
frame, the conditioning and non-conditioning outputs (the memory bank), the temporary outputs
of prompts not yet propagated, and which frames were tracked in which direction. Frames are
kept decoded (uint8) and their encoder features in a small LRU, recomputed on a miss (upstream
keeps only the most recent frame's features).

Sizes per object and frame: memory features 512 KiB (bfloat16, as upstream stores them),
low-res logits 256 KiB, pointer 1 KiB.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np


def to_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even like torch's
    ``.to(torch.bfloat16)``. NaN stays NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def from_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32 (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


@dataclass
class FrameOutput:
    """One object's output on one frame (upstream's "compact" current_out).

    Attributes:
        pred_masks: float32 [1, 1, 256, 256] low-res logits (NO_OBJ_SCORE where absent).
        obj_ptr: float32 [1, 256].
        object_score_logits: float32 [1, 1].
        maskmem: bfloat16 bits (uint16) [1, 64, 64, 64], or None until the memory encoder
            ran (prompted frames are encoded when propagation starts).
    """

    pred_masks: np.ndarray
    obj_ptr: np.ndarray
    object_score_logits: np.ndarray
    maskmem: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        arrays = (self.pred_masks, self.obj_ptr, self.object_score_logits, self.maskmem)
        return sum(a.nbytes for a in arrays if a is not None)


@dataclass
class PointInputs:
    """Clicks (and box corners) of one object on one frame, in the model input frame.

    Attributes:
        coords: float32 [N, 2], (X, Y) in the image_size square.
        labels: int32 [N]: 1 foreground, 0 background, 2/3 box corners.
    """

    coords: np.ndarray
    labels: np.ndarray


def _outputs() -> dict[str, dict[int, FrameOutput]]:
    return {"cond_frame_outputs": {}, "non_cond_frame_outputs": {}}


@dataclass
class ObjectState:
    """One object's inputs and outputs (upstream's ``*_per_obj`` entries)."""

    point_inputs: dict[int, PointInputs] = field(default_factory=dict)
    mask_inputs: dict[int, np.ndarray] = field(default_factory=dict)  # float32 [1,1,S,S]
    outputs: dict[str, dict[int, FrameOutput]] = field(default_factory=_outputs)
    temp_outputs: dict[str, dict[int, FrameOutput]] = field(default_factory=_outputs)
    frames_tracked: dict[int, bool] = field(default_factory=dict)  # frame -> reverse

    @property
    def nbytes(self) -> int:
        total = sum(m.nbytes for m in self.mask_inputs.values())
        total += sum(p.coords.nbytes + p.labels.nbytes for p in self.point_inputs.values())
        for store in (self.outputs, self.temp_outputs):
            total += sum(o.nbytes for outs in store.values() for o in outs.values())
        return total

    def clear(self) -> None:
        """Drop every input and output (``_reset_tracking_results`` for this object)."""
        self.point_inputs.clear()
        self.mask_inputs.clear()
        for store in (self.outputs, self.temp_outputs):
            for outs in store.values():
                outs.clear()
        self.frames_tracked.clear()


Features = tuple[np.ndarray, np.ndarray, np.ndarray]  # vision_feats, high_res_feats_0/1


class Session:
    """One video or volume: its frames, a feature LRU, and the objects being tracked.

    Args:
        num_frames: frames in the video.
        video_hw: (H, W) of the original frames.
        feature_cache_frames: encoded frames kept (LRU, at least 1).
    """

    def __init__(self, num_frames: int, video_hw: tuple[int, int], feature_cache_frames: int = 4):
        self.num_frames = int(num_frames)
        self.video_hw = (int(video_hw[0]), int(video_hw[1]))
        # uint8 [H, W, C] pixels, or a frame's encoded bytes (decoded when encoded)
        self.frames: dict[int, np.ndarray | bytes] = {}
        self.features: OrderedDict[int, Features] = OrderedDict()
        self.feature_cache_frames = max(1, int(feature_cache_frames))
        self.objects: OrderedDict[int, ObjectState] = OrderedDict()  # obj_id -> state

    @property
    def obj_ids(self) -> list[int]:
        """Object ids in the order they were added (upstream's obj_idx order)."""
        return list(self.objects)

    @property
    def nbytes(self) -> int:
        """Bytes held: frames, cached features, and every object's inputs and outputs."""
        total = sum(len(f) if isinstance(f, bytes) else f.nbytes for f in self.frames.values())
        total += sum(a.nbytes for feats in self.features.values() for a in feats)
        return total + sum(o.nbytes for o in self.objects.values())

    def cache_features(self, frame_idx: int, features: Features) -> None:
        self.features[frame_idx] = features
        self.features.move_to_end(frame_idx)
        while len(self.features) > self.feature_cache_frames:
            self.features.popitem(last=False)

    def cached_features(self, frame_idx: int) -> Features | None:
        features = self.features.get(frame_idx)
        if features is not None:
            self.features.move_to_end(frame_idx)
        return features
