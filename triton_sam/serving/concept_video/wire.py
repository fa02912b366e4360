"""The streaming model's per-frame responses and its ``settings`` override, in numpy.

Names and bounds are :mod:`triton_sam.serving.protocol.concept_video`'s. A response is a
dict of tensor name -> numpy array, what the python model turns into ``pb_utils.Tensor``s.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping
from dataclasses import fields, replace

import numpy as np

from ..bounds import RequestError
from ..protocol import concept_video as protocol
from .results import FrameResult, PackedFrameResult
from .settings import ConceptVideoSettings


def parse_settings(text: bytes | str | None, base: ConceptVideoSettings) -> ConceptVideoSettings:
    """``base`` with the fields a request's ``settings`` JSON object overrides.

    Raises:
        RequestError: not a JSON object, an unknown field, a value of the wrong type, NaN or
            infinite, or out of its bounds (the field named ``settings.<key>``), or a
            combination ``ConceptVideoSettings`` refuses (a hot-start count above the delay).
    """
    if text is None or text in (b"", ""):
        return base
    try:
        values = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(protocol.SETTINGS, f"not valid JSON ({e}); expected an object") from None
    if not isinstance(values, dict):
        raise RequestError(
            protocol.SETTINGS, f"got a JSON {type(values).__name__}, expected an object"
        )
    known = {f.name for f in fields(ConceptVideoSettings)}
    changes = {}
    for key, value in values.items():
        field = f"{protocol.SETTINGS}.{key}"
        if key not in protocol.SETTING_BOUNDS:
            raise RequestError(field, f"unknown setting, expected some of {sorted(known)}")
        kind, low, high = protocol.SETTING_BOUNDS[key]
        changes[key] = _checked(field, value, kind, low, high)
    try:
        return replace(base, **changes)
    except RequestError as e:
        raise RequestError(f"{protocol.SETTINGS}.{e.field}", str(e).split(": ", 1)[1]) from None


def _checked(field: str, value: object, kind: type, low: float, high: float) -> object:
    """``value`` if it is a ``kind`` in [low, high] (bool is not an int, an int is a float)."""
    if kind is bool:
        if not isinstance(value, bool):
            raise RequestError(field, f"got {value!r}, expected true or false")
        return value
    ok_type = isinstance(value, int) if kind is int else isinstance(value, int | float)
    if isinstance(value, bool) or not ok_type or not math.isfinite(value):
        raise RequestError(field, f"got {value!r}, expected {kind.__name__} in [{low}, {high}]")
    if not low <= value <= high:
        raise RequestError(field, f"got {value!r}, expected {kind.__name__} in [{low}, {high}]")
    return kind(value)


def frame_response(
    result: FrameResult | PackedFrameResult,
    *,
    tracker_scores: Mapping[int, float],
    removed_since_last: Collection[int],
    progress: tuple[int, int],
    mask_format: str = "rle",
    low_res_masks: Mapping[int, np.ndarray] | None = None,
    low_res_hw: tuple[int, int] = (288, 288),
) -> dict[str, np.ndarray]:
    """One answered frame as response tensors.

    Args:
        result: the frame's answer (:func:`.results.postprocess_frame`).
        tracker_scores: this frame's tracker scores (0 for an object without one).
        removed_since_last: ids removed by hot-start since the previous response.
        progress: (frames processed, frames to process).
        mask_format: ``"rle"`` (masks at the video's size, overlaps resolved) or
            ``"logits"`` (the low-resolution logits of ``low_res_masks``).
        low_res_masks: object id -> float32 [h, w] logits, for ``"logits"``.
        low_res_hw: (h, w) of those logits (the shape of an empty answer's tensor).

    Raises:
        RequestError: an unknown ``mask_format`` (field ``mask_format``).
    """
    ids = result.object_ids
    out = {
        protocol.FRAME_INDEX: np.array([result.frame_idx], np.int32),
        protocol.OBJECT_IDS: ids.astype(np.int32),
        protocol.PROMPT_IDS: result.prompt_ids.astype(np.int32),
        protocol.SCORES: result.scores.astype(np.float32),
        protocol.TRACKER_SCORES: np.array(
            [tracker_scores.get(int(o), 0.0) for o in ids], np.float32
        ),
        protocol.BOXES: result.boxes.astype(np.float32).reshape(-1, 4),
        protocol.REMOVED_OBJECT_IDS: np.array(sorted(removed_since_last), np.int32),
        protocol.PROGRESS: np.array(progress, np.int32),
    }
    if mask_format == "rle":
        out[protocol.MASKS_RLE] = np.array(result.rle(), dtype=np.object_)
    elif mask_format == "logits" and low_res_masks is not None:
        logits = np.zeros((len(ids), *low_res_hw), np.float32)
        for row, obj_id in enumerate(ids):
            logits[row] = low_res_masks[int(obj_id)]
        out[protocol.MASKS_LOGITS] = logits
    else:
        raise RequestError(
            "mask_format", f"got {mask_format!r}, expected one of {list(protocol.MASK_FORMATS)}"
        )
    return out


def progress_response(done: int, total: int) -> dict[str, np.ndarray]:
    """A response that only reports progress (a processed frame that released no answer)."""
    return {protocol.PROGRESS: np.array([done, total], np.int32)}
