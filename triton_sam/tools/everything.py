"""``triton-sam everything``: every instance in each image -> overlay PNG + COCO JSON (served).

Importable from a notebook: :func:`segment_everything` does the work over a server's
``<family>_everything`` model; :func:`write_overlay` and :func:`write_annotations` write the
files. The JSON is the list of records the official ``scripts/amg.py`` writes with
``--convert-to-rle`` (one ``coco_rle`` record per instance).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from triton_sam.client import image_io
from triton_sam.client.everything import EverythingResult


@dataclass(frozen=True)
class EverythingFiles:
    """What :func:`segment_everything` wrote for one image.

    Attributes:
        image: the input; overlay / annotations: the PNG and the JSON written.
        result: the instances; seconds: the job's wall time on the client.
    """

    image: Path
    overlay: Path
    annotations: Path
    result: EverythingResult
    seconds: float


def segment_everything(
    images: Iterable[str | Path],
    out: str | Path,
    *,
    url: str | None = None,
    model_type: str = "sam2",
    params: Mapping[str, Any] | None = None,
    progress: Callable[[Path], Callable[[int, int], Any] | None] | None = None,
) -> list[EverythingFiles]:
    """Segment everything in each image on the server at ``url`` (gRPC); write
    ``<out>/<stem>.png`` (overlay) and ``<out>/<stem>.json`` (records) per image.

    Args:
        images: image files.
        out: the output directory (created).
        url: the server's gRPC address (default ``$TRITON_URL``, else localhost:8001).
        model_type: ``"sam2"`` (SAM2.1) or ``"sam1"``.
        params: the official generator's parameters to override.
        progress: ``progress(image)`` returns the job's progress callback (or None).

    Raises:
        TritonSamError: the client's errors (server not ready, a refused parameter...).
    """
    import time

    from triton_sam.client import SAM2TritonClient

    out = Path(out)
    written = []
    with SAM2TritonClient(url, model_type=model_type, protocol="grpc") as client:
        for image in map(Path, images):
            t0 = time.perf_counter()
            callback = progress(image) if progress is not None else None
            result = client.generate_masks(image, progress=callback, **dict(params or {}))
            seconds = time.perf_counter() - t0
            rgb = image_io.load_image(image)
            overlay = write_overlay(rgb, result, out / f"{image.stem}.png")
            annotations = write_annotations(result, out / f"{image.stem}.json")
            written.append(EverythingFiles(image, overlay, annotations, result, seconds))
    return written


def write_overlay(rgb: np.ndarray, result: EverythingResult, path: Path, *, seed: int = 0) -> Path:
    """Blend each instance in a random colour, largest first (as the official notebooks'
    ``show_anns``), so small instances stay visible on top of large ones."""
    canvas = rgb.astype(np.float32)
    colours = np.random.default_rng(seed).uniform(0, 255, (len(result), 3)).astype(np.float32)
    order = sorted(range(len(result)), key=lambda k: -result.instances[k]["area"])
    masks = result.masks()
    for k in order:
        canvas[masks[k]] = 0.45 * canvas[masks[k]] + 0.55 * colours[k]
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(canvas.clip(0, 255).astype(np.uint8)).save(path)
    return path


def write_annotations(result: EverythingResult, path: Path) -> Path:
    """The records as JSON (a list, as the official ``scripts/amg.py`` writes them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.instances))
    return path
