"""Track objects through a video or volume and write the masks: what ``triton-sam track`` runs.

Prompts are clicks ``x,y[,frame][,obj]`` and boxes ``x0,y0,x1,y1[,frame][,obj]`` in pixels
of the frames (frame and object default to 0 and 1). Propagation runs forward and backward
from the earliest prompted frame, so a click on a middle slice of a volume segments the whole
stack. Output: one label PNG per frame (pixel = object id, 0 = background; a later object
wins where masks overlap), or for a volume one (Z, Y, X) label TIFF stack.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from triton_sam.errors import InputValidationError

Direction = str  # "both" | "forward" | "reverse"


@dataclass(frozen=True)
class Prompt:
    """A click or a box on one frame for one object ((X, Y) pixels of the frame)."""

    frame: int
    obj_id: int
    point: tuple[float, float] | None = None
    box: tuple[float, float, float, float] | None = None


def parse_click(text: str) -> Prompt:
    """``"x,y[,frame][,obj]"`` -> Prompt (a foreground click).

    Raises:
        InputValidationError: (field ``click``) not 2 to 4 numbers.
    """
    values = _numbers(text, "click", 2)
    return Prompt(_index(values, 2, 0), _index(values, 3, 1), point=(values[0], values[1]))


def parse_box(text: str) -> Prompt:
    """``"x0,y0,x1,y1[,frame][,obj]"`` -> Prompt.

    Raises:
        InputValidationError: (field ``box``) not 4 to 6 numbers.
    """
    values = _numbers(text, "box", 4)
    return Prompt(_index(values, 4, 0), _index(values, 5, 1), box=tuple(values[:4]))


@dataclass
class TrackResult:
    """What :func:`track_video` wrote.

    Attributes:
        paths: the files written.
        frames: frames with masks; obj_ids: the objects.
        foreground: fraction of pixels of each object over all frames.
    """

    paths: list[Path]
    frames: int
    obj_ids: list[int]
    foreground: dict[int, float]


def track_video(
    client,
    video: object,
    prompts: list[Prompt],
    out_dir: str | os.PathLike[str],
    *,
    direction: Direction = "both",
    progress: Callable[[int], object] | None = None,
) -> TrackResult:
    """Prompt, propagate and write label masks (see the module docstring).

    Args:
        client: a :class:`SAM2VideoTritonClient` (or anything with its API).
        video: what ``client.init_state`` takes.
        prompts: clicks and boxes; several on one (frame, object) are sent together.
        out_dir: created if needed.
        direction: ``"both"`` (default), ``"forward"`` or ``"reverse"`` from the earliest
            prompted frame.
        progress: called with 1 after each propagated frame (a progress bar's update).

    Raises:
        InputValidationError: no prompt, or a bad direction.
    """
    if not prompts:
        raise InputValidationError("click", "give at least one --click or --box")
    if direction not in ("both", "forward", "reverse"):
        raise InputValidationError("direction", f"got {direction!r}, expected both|forward|reverse")
    state = client.init_state(video)
    try:
        for (frame, obj_id), group in _grouped(prompts).items():
            points = [p.point for p in group if p.point is not None]
            boxes = [p.box for p in group if p.box is not None]
            client.add_new_points_or_box(
                state,
                frame,
                obj_id,
                points=points or None,
                labels=[1] * len(points) if points else None,
                box=boxes[-1] if boxes else None,
            )
        start = min(p.frame for p in prompts)
        labels: dict[int, np.ndarray] = {}
        obj_ids: list[int] = []
        runs = [False, True] if direction == "both" else [direction == "reverse"]
        for reverse in runs:
            for frame, obj_ids, masks in client.propagate_in_video(
                state, start_frame_idx=start, reverse=reverse
            ):
                labels[frame] = _labels(obj_ids, masks)
                if progress is not None:
                    progress(1)
    finally:
        client.close_state(state)
    paths = _write(labels, Path(out_dir), state.source.is_volume, state.num_frames, state.video_hw)
    total = max(1, len(labels) * state.video_hw[0] * state.video_hw[1])
    foreground = {o: float(sum((m == o).sum() for m in labels.values()) / total) for o in obj_ids}
    return TrackResult(paths, len(labels), obj_ids, foreground)


def _grouped(prompts: list[Prompt]) -> dict[tuple[int, int], list[Prompt]]:
    groups: dict[tuple[int, int], list[Prompt]] = {}
    for prompt in prompts:
        groups.setdefault((prompt.frame, prompt.obj_id), []).append(prompt)
    return groups


def _labels(obj_ids: list[int], masks: np.ndarray) -> np.ndarray:
    dtype = np.uint8 if max(obj_ids, default=0) < 256 else np.uint16
    labels = np.zeros(masks.shape[-2:], dtype)
    for obj_id, mask in zip(obj_ids, masks[:, 0], strict=True):
        labels[mask > 0] = obj_id
    return labels


def _write(
    labels: dict[int, np.ndarray], out: Path, volume: bool, frames: int, hw: tuple[int, int]
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    if not volume:
        paths = []
        for frame in sorted(labels):
            path = out / f"{frame:05d}.png"
            Image.fromarray(labels[frame]).save(path)
            paths.append(path)
        return paths
    dtype = max((m.dtype for m in labels.values()), default=np.dtype(np.uint8))
    stack = np.zeros((frames, *hw), dtype)
    for frame, mask in labels.items():
        stack[frame] = mask
    path = out / "masks.tif"
    write_stack(path, stack)
    return [path]


def write_stack(path: Path, stack: np.ndarray) -> None:
    """A (Z, Y, X) stack as one multi-page TIFF (tifffile when installed, else Pillow)."""
    try:
        import tifffile
    except ImportError:
        pages = [Image.fromarray(page) for page in stack]
        pages[0].save(path, save_all=True, append_images=pages[1:], compression="tiff_deflate")
        return
    tifffile.imwrite(path, stack, compression="zlib")


def _numbers(text: str, field: str, minimum: int) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not minimum <= len(values) <= minimum + 2 or not np.isfinite(values).all():
        extra = "x,y[,frame][,obj]" if field == "click" else "x0,y0,x1,y1[,frame][,obj]"
        raise InputValidationError(field, f"got {text!r}, expected {extra}")
    return values


def _index(values: list[float], i: int, default: int) -> int:
    if len(values) <= i:
        return default
    if values[i] != int(values[i]) or values[i] < 0:
        raise InputValidationError("click", f"frame and object must be integers >= 0: {values}")
    return int(values[i])
