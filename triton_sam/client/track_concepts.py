"""Find and track concepts through a video or volume and write what was found: what
``triton-sam track --phrase`` runs (``sam3_concept_video``).

Every instance of each phrase gets an object id that stays the same across frames (z-slices);
instances that appear later are picked up. Output in ``out_dir``:

- ``concepts.json``: per answered frame, each object's id, phrase, detection score, box
  (x0, y0, x1, y1, inclusive pixels) and mask as COCO RLE (``{"size": [H, W], "counts"}``);
- ``labels.ome.zarr``: an OME-Zarr (NGFF 0.4) image of the frames (grayscale) with one label
  image per phrase (``labels/prompt-<id>``: pixel = object id), as napari and Fiji open it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from triton_sam.client.concept_labels import OmeZarrLabelWriter
from triton_sam.client.video_source import VideoSource, open_video
from triton_sam.errors import InputValidationError
from triton_sam.serving.masks import encode_rle


@dataclass
class ConceptTrackResult:
    """What :func:`track_concepts` wrote.

    Attributes:
        paths: ``concepts.json`` and ``labels.ome.zarr``.
        frames: frames answered; objects: phrase -> the ids found for it.
    """

    paths: list[Path]
    frames: int
    objects: dict[str, list[int]]


def track_concepts(
    client: Any,
    video: object,
    phrases: Sequence[str],
    out_dir: str | os.PathLike[str],
    *,
    settings: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], object] | None = None,
) -> ConceptTrackResult:
    """Upload ``video``, search it for ``phrases``, propagate, write the results.

    Args:
        client: a :class:`~triton_sam.client.concept_video.SAM3ConceptVideoClient`.
        video: what :func:`~triton_sam.client.video_source.open_video` takes.
        phrases: the concepts (one label image each).
        out_dir: created if needed; ``labels.ome.zarr`` must not exist yet in it.
        settings: the propagation's settings overrides (``ConceptVideoSettings`` fields).
        progress: called with (frames processed, frames) as the server reports them.

    Raises:
        InputValidationError: no phrase, or an output that exists.
    """
    phrases = [p.strip() for p in phrases if p.strip()]
    if not phrases:
        raise InputValidationError("phrase", "give at least one --phrase")
    out = Path(out_dir)
    labels_path = out / "labels.ome.zarr"
    if labels_path.exists():
        raise InputValidationError("out", f"{labels_path} exists; choose another --out")
    source = open_video(video)
    session = client.open(source)
    try:
        prompts = dict(zip(client.add_prompt(session, phrases), phrases, strict=True))
        out.mkdir(parents=True, exist_ok=True)
        shape = (source.num_frames, source.height, source.width)
        labels = OmeZarrLabelWriter(labels_path, prompts, shape, image=_Grayscale(source))
        frames, found = [], {phrase: set() for phrase in phrases}
        for answer in client.propagate(
            session, settings=settings, labels=labels, progress=progress
        ):
            frames.append(_frame_record(answer.result, prompts, found))
    finally:
        client.close(session)
    json_path = out / "concepts.json"
    json_path.write_text(json.dumps({"phrases": prompts, "frames": frames}, indent=1))
    objects = {phrase: sorted(ids) for phrase, ids in found.items()}
    return ConceptTrackResult([json_path, labels_path], len(frames), objects)


def _frame_record(result: Any, prompts: Mapping[int, str], found: dict[str, set]) -> dict:
    height, width = result.masks.shape[1:]
    objects = []
    for row, obj_id in enumerate(result.object_ids):
        phrase = prompts[int(result.prompt_ids[row])]
        found[phrase].add(int(obj_id))
        objects.append(
            {
                "id": int(obj_id),
                "phrase": phrase,
                "score": round(float(result.scores[row]), 5),
                "box": [float(v) for v in result.boxes[row]],
                "rle": {"size": [height, width], "counts": encode_rle(result.masks[row]).decode()},
            }
        )
    return {"frame": int(result.frame_idx), "objects": objects}


class _Grayscale:
    """The frames as a (Z, Y, X) uint8 array read one section at a time (the OME-Zarr image
    under the labels; colour frames by their luminance, as Pillow's ``convert("L")``)."""

    def __init__(self, source: VideoSource) -> None:
        self.source = source
        self.shape = (source.num_frames, source.height, source.width)
        self.dtype = np.dtype(np.uint8)

    def __getitem__(self, z: int) -> np.ndarray:
        pixels = self.source.pixels(int(z))
        if pixels.ndim == 2:
            return pixels
        rgb = pixels[..., :3].astype(np.uint32)  # Pillow's convert("L") fixed-point weights
        luma = rgb[..., 0] * 19595 + rgb[..., 1] * 38470 + rgb[..., 2] * 7471 + 0x8000
        return (luma >> 16).astype(np.uint8)
