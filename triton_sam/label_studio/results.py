"""Masks -> the ``/predict`` answer Label Studio stores or draws (pure, no I/O).

Label Studio reads ``{"results": [prediction per task]}``, each prediction
``{"result": [region...], "score": float, "model_version": str}``. A region names the control
that owns it (``from_name``), the image (``to_name``), the image's natural size, and its value:

- ``brushlabels``: ``{"format": "rle", "rle": [bytes], "brushlabels": [label]}``
  (:mod:`.rle`);
- ``polygonlabels``: ``{"points": [[x%, y%], ...], "closed": true, "polygonlabels": [label]}``
  in percent of the image size (:mod:`.polygon`).
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np

from triton_sam.errors import InputValidationError
from triton_sam.label_studio.config import LabelingConfig
from triton_sam.label_studio.polygon import largest_outline
from triton_sam.label_studio.prompts import Prompt
from triton_sam.label_studio.rle import encode_mask


def prediction(result: list[dict[str, Any]], score: float, model_version: str) -> dict[str, Any]:
    """One task's prediction."""
    return {"result": result, "score": score, "model_version": model_version}


def mask_regions(
    mask: np.ndarray, score: float, config: LabelingConfig, prompt: Prompt, *, field: str
) -> list[dict[str, Any]]:
    """The region(s) of one mask, as the config's output control answers.

    Args:
        mask: bool [H, W] at the original size, (H, W) = ``prompt.size`` reversed.
        score: the mask's predicted IoU.
        config: the labeling config (output control, image name, labels).
        prompt: the request's prompts (size and chosen label).
        field: where the label came from, for errors.

    Returns:
        One region, or none for an empty mask as polygon (a polygon needs a ring).

    Raises:
        InputValidationError: the annotator's label is not one of the output control's.
    """
    width, height = prompt.size
    if mask.shape != (height, width):
        raise ValueError(f"mask: shape {mask.shape}, expected {(height, width)}")
    label = _label(config, prompt.label, field)
    region: dict[str, Any] = {
        "id": secrets.token_hex(5),
        "from_name": config.output_name,
        "to_name": config.image_name,
        "original_width": width,
        "original_height": height,
        "image_rotation": 0,
        "type": config.result_type,
        "score": score,
        "readonly": False,
    }
    if config.output == "brush":
        region["value"] = {"format": "rle", "rle": encode_mask(mask), "brushlabels": [label]}
        return [region]
    outline = largest_outline(mask)
    if outline is None:
        return []
    points = outline * (100.0 / width, 100.0 / height)
    region["value"] = {"points": points.tolist(), "closed": True, "polygonlabels": [label]}
    return [region]


def _label(config: LabelingConfig, chosen: str | None, field: str) -> str:
    # The annotator picks the label on the smart keypoint/rectangle tool; the mask takes it,
    # so the names must be the output control's too (the usual SAM config repeats them).
    if chosen is None:
        if not config.output_labels:
            raise InputValidationError(field, f"<{config.result_type}> has no <Label>")
        return config.output_labels[0]
    if config.output_labels and chosen not in config.output_labels:
        raise InputValidationError(
            field,
            f"label {chosen!r} is not one of {config.output_name!r}'s "
            f"({', '.join(config.output_labels)}); give both controls the same labels",
        )
    return chosen
