"""Which memories and object pointers a frame attends to (dependency-free, numpy only).

The selection half of ``SAM2Base._prepare_memory_conditioned_features``, kept apart from the
tensor half (the ``memory_attention`` graph) so it can be read, tested and reused on its own.
The frame outputs are opaque here: whatever the caller stores per frame.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import TrackerConfig


@dataclass(frozen=True)
class Selection:
    """What one frame attends to, in upstream's concatenation order.

    Attributes:
        memories: frame outputs whose spatial memory is attended: conditioning frames first
            (in the order they were added), then recent frames from the farthest to the
            nearest.
        memory_tpos: t_pos of each memory (0 for conditioning frames, 1..num_maskmem-1).
        pointers: frame outputs whose object pointer is attended.
        pointer_tpos: float32 [len(pointers)], each pointer's temporal offset divided by
            (max pointers - 1), as upstream feeds ``get_1d_sine_pe``.
    """

    memories: list[Any]
    memory_tpos: list[int]
    pointers: list[Any]
    pointer_tpos: np.ndarray


def select_closest_cond_frames(
    frame_idx: int, cond_outputs: Mapping[int, Any], max_cond_frames: int
) -> tuple[dict[int, Any], dict[int, Any]]:
    """``sam2.modeling.sam2_utils.select_closest_cond_frames``: (selected, unselected)."""
    if max_cond_frames == -1 or len(cond_outputs) <= max_cond_frames:
        return dict(cond_outputs), {}
    if max_cond_frames < 2:
        raise ValueError("max_cond_frames_in_attn: expected -1 or >= 2")
    selected: dict[int, Any] = {}
    before = max((t for t in cond_outputs if t < frame_idx), default=None)
    if before is not None:
        selected[before] = cond_outputs[before]
    after = min((t for t in cond_outputs if t >= frame_idx), default=None)
    if after is not None:
        selected[after] = cond_outputs[after]
    remaining = max_cond_frames - len(selected)
    closest = sorted(
        (t for t in cond_outputs if t not in selected), key=lambda t: abs(t - frame_idx)
    )
    selected.update((t, cond_outputs[t]) for t in closest[:remaining])
    unselected = {t: v for t, v in cond_outputs.items() if t not in selected}
    return selected, unselected


def select_memories(
    config: TrackerConfig,
    frame_idx: int,
    cond_outputs: Mapping[int, Any],
    non_cond_outputs: Mapping[int, Any],
    num_frames: int,
    *,
    reverse: bool = False,
) -> Selection:
    """The memories and pointers frame ``frame_idx`` attends to (not an initial
    conditioning frame), exactly as upstream picks them in eval mode.

    Args:
        config: the variant's tracking settings.
        frame_idx: the frame being tracked.
        cond_outputs / non_cond_outputs: one object's outputs by frame index (insertion order
            matters: it is the attention's key order).
        num_frames: frames in the video.
        reverse: tracking backwards in time.

    Raises:
        ValueError: no conditioning frame (upstream asserts one).
    """
    if not cond_outputs:
        raise ValueError("no conditioning frame: add points, a box or a mask first")
    selected, unselected = select_closest_cond_frames(
        frame_idx, cond_outputs, config.max_cond_frames_in_attn
    )
    memories = [(0, out) for out in selected.values()]
    stride = config.memory_temporal_stride_for_eval
    for t_pos in range(1, config.num_maskmem):
        t_rel = config.num_maskmem - t_pos  # frames before (after, in reverse) this one
        if t_rel == 1:
            prev = frame_idx + 1 if reverse else frame_idx - 1
        elif not reverse:
            prev = ((frame_idx - 2) // stride) * stride - (t_rel - 2) * stride
        else:
            prev = -(-(frame_idx + 2) // stride) * stride + (t_rel - 2) * stride
        out = non_cond_outputs.get(prev, unselected.get(prev))
        memories.append((t_pos, out))
    memories = [(t_pos, out) for t_pos, out in memories if out is not None]

    max_ptrs = min(num_frames, config.max_obj_ptrs_in_encoder)
    if config.only_obj_ptrs_in_the_past_for_eval:
        ptr_cond = {
            t: o for t, o in selected.items() if (t >= frame_idx if reverse else t <= frame_idx)
        }
    else:
        ptr_cond = selected
    sign = -1 if reverse else 1
    pointers = [
        (
            (frame_idx - t) * sign
            if config.use_signed_tpos_enc_to_obj_ptrs
            else abs(frame_idx - t),
            o,
        )
        for t, o in ptr_cond.items()
    ]
    for t_diff in range(1, max_ptrs):
        t = frame_idx + t_diff if reverse else frame_idx - t_diff
        if t < 0 or t >= num_frames:
            break
        out = non_cond_outputs.get(t, unselected.get(t))
        if out is not None:
            pointers.append((t_diff, out))
    # torch divides an int64 tensor by a Python int: both cast to float32, one IEEE division.
    positions = np.array([p for p, _ in pointers], dtype=np.float32)
    tpos = positions / np.float32(max(max_ptrs - 1, 1))
    return Selection(
        memories=[out for _, out in memories],
        memory_tpos=[t_pos for t_pos, _ in memories],
        pointers=[out for _, out in pointers],
        pointer_tpos=tpos.astype(np.float32),
    )
