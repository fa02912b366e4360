"""``triton-sam segment``: text prompts on one image -> overlay PNG + COCO JSON (via a server).

Importable from a notebook: :func:`segment_image` does the work, :func:`write_overlay` and
:func:`write_coco` write the files.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from triton_sam.client import image_io
from triton_sam.client.concepts import ConceptPrediction

# One colour per phrase (RGB), cycled.
PALETTE = np.array(
    [[30, 144, 255], [255, 140, 0], [50, 205, 50], [220, 20, 60], [148, 0, 211], [255, 215, 0]],
    dtype=np.float32,
)


@dataclass(frozen=True)
class SegmentResult:
    """What :func:`segment_image` produced.

    Attributes:
        prediction: the instances.
        overlay: path of the overlay PNG; coco: path of the COCO JSON.
        timings_ms: client-side timings (set_image, predict).
        request_bytes: bytes of the predict request (the image is sent once, by set_image).
    """

    prediction: ConceptPrediction
    overlay: Path
    coco: Path
    timings_ms: dict[str, float]
    request_bytes: int


def segment_image(
    image: str | Path,
    phrases: Sequence[str],
    out: Path,
    *,
    url: str | None = None,
    protocol: str = "http",
    threshold: float = 0.3,
    max_instances: int | None = None,
) -> SegmentResult:
    """Segment every instance of each phrase in ``image`` on the server at ``url``.

    Args:
        image: path of the image.
        phrases: one or more noun phrases.
        out: the overlay PNG to write; the COCO JSON goes beside it (``.json``).
        url / protocol: the server (default ``$TRITON_URL``, else localhost).
        threshold / max_instances: as ``SAM2TritonClient.predict_concepts``.

    Raises:
        TritonSamError: the client's errors (server not ready, bad input...).
    """
    from triton_sam.client import SAM2TritonClient

    rgb = image_io.load_image(image)
    with SAM2TritonClient(url, model_type="sam3_concept", protocol=protocol) as client:
        client.set_image(rgb)
        timings = dict(client.last_timings_ms)
        prediction = client.predict_concepts(
            list(phrases), threshold=threshold, max_instances=max_instances
        )
        timings.update(client.last_timings_ms)
        sent = client.last_request_bytes
    out = Path(out)
    overlay = write_overlay(rgb, prediction, out)
    coco = write_coco(prediction, out.with_suffix(".json"), file_name=Path(image).name)
    return SegmentResult(prediction, overlay, coco, timings, sent)


def write_overlay(rgb: np.ndarray, prediction: ConceptPrediction, path: Path) -> Path:
    """Blend each instance's mask in its phrase's colour, outline its box, label it."""
    canvas = rgb.astype(np.float32)
    if prediction.masks is not None:
        for k in range(len(prediction)):
            colour = PALETTE[int(prediction.phrase_index[k]) % len(PALETTE)]
            mask = prediction.masks[k]
            canvas[mask] = 0.5 * canvas[mask] + 0.5 * colour
    image = Image.fromarray(canvas.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for k in range(len(prediction)):
        phrase = int(prediction.phrase_index[k])
        colour = tuple(int(v) for v in PALETTE[phrase % len(PALETTE)])
        x0, y0, x1, y1 = (float(v) for v in prediction.boxes[k])
        draw.rectangle([x0, y0, x1, y1], outline=colour, width=2)
        draw.text((x0 + 2, y0 + 2), f"{prediction.phrases[phrase]} {prediction.scores[k]:.2f}")
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


def write_coco(prediction: ConceptPrediction, path: Path, *, file_name: str = "") -> Path:
    """The prediction as COCO JSON (one category per phrase, RLE segmentations)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(prediction.to_coco(file_name=file_name), indent=1))
    return path
