"""Segment everything's parameters, bounds and the everything-decoder graph's contract.

Parameters arrive as a JSON object (the request's ``params``), are checked against the bounds
here and refused with :class:`~triton_sam.serving.bounds.RequestError` naming
``params.<key>``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from typing import Any

from ..bounds import RequestError

FAMILIES = ("sam1", "sam2")
FIELD = "params"  # the request field the parameters travel in; errors name params.<key>

# -- bounds ---------------------------------------------------------------------------------
# A job costs crops x points x 3 masks of the crop's size: these keep one job's work and a
# batch's memory within what one request may ask. 128 per side is 16x the points of the
# default 32 (finer grids find nothing new at SAM's 256x256 mask resolution); 256 points per
# batch = 768 candidate masks of the crop's size held at once (3 GiB of float32 logits at
# 1024x1024, the official generator's own peak at that batch size); 3 crop layers = 85 crops.
MAX_POINTS_PER_SIDE = 128
MAX_POINTS_PER_BATCH = 256
MAX_CROP_N_LAYERS = 3
MAX_DOWNSCALE_FACTOR = 8
# One decoder run upsamples up to 3 x points_per_batch masks (4 with m2m's ride-along) to the
# crop's size in float32 (SAM1 also through a 1024 x 1024 float32 step, as its predictor
# does): a job whose batch would hold more than this in logits is refused up front, naming
# points_per_batch (the official generator has the same peak on its device). 2 GiB: the
# default batch of 64 on a 1024 x 1024 image holds 0.75 GiB (SAM1 1.5 GiB).
MAX_BATCH_LOGIT_BYTES = 2 * 2**30
# Prompts one job decodes, over all its crops (layer k: 4^k crops of (points_per_side /
# factor^k)^2 points each): what bounds a job's time and the records it accumulates before the
# NMS. 2^17 admits the default 32x32 grid with 3 crop layers at factor 1 (87,040 prompts) and
# the largest grid with one crop layer (81,920); the largest grid with 3 layers (1.4 M) not.
MAX_JOB_PROMPTS = 2**17
MAX_ABS_MASK_THRESHOLD = 100.0  # logits: beyond +-100 every mask is empty or full
MAX_STABILITY_OFFSET = 100.0

# -- the everything-decoder graph's contract (one place: exporter, writer, served model) ----
# Inputs besides the features (the family's encoder outputs, batch 1: SAM1 image_embeddings;
# SAM2 image_embed, high_res_feats_0, high_res_feats_1).
IN_POINTS = "point_coords"  # float64 [P, 2]: (X, Y) crop pixels, one point per prompt
IN_CROP_HW = "crop_hw"  # int64 [2]: (H, W) of the crop the features were computed on
IN_PRED_IOU_THRESH = "pred_iou_thresh"  # float32 [1]; <= 0 keeps every mask (official)
IN_STABILITY_THRESH = "stability_score_thresh"  # float32 [1]; <= 0 keeps every mask
IN_STABILITY_HIGH = "stability_high"  # float32 [1]: float32(mask_threshold + offset)
IN_STABILITY_LOW = "stability_low"  # float32 [1]: float32(mask_threshold - offset)
IN_MASK_THRESHOLD = "mask_threshold"  # float32 [1]
IN_MULTIMASK = "multimask_output"  # bool [1]: tokens 1-3, else the single-mask selection
IN_USE_M2M = "use_m2m"  # bool [1]: SAM2's refinement pass (SAM1 graphs: always false)
GRAPH_INPUTS = (
    IN_POINTS,
    IN_CROP_HW,
    IN_PRED_IOU_THRESH,
    IN_STABILITY_THRESH,
    IN_STABILITY_HIGH,
    IN_STABILITY_LOW,
    IN_MASK_THRESHOLD,
    IN_MULTIMASK,
    IN_USE_M2M,
)
# Outputs: only the K masks that passed the filters, in the official order (prompt-major,
# then token order).
OUT_MASKS = "masks"  # bool [K, H, W]: logits > mask_threshold at the crop's size
OUT_IOU = "iou_predictions"  # float32 [K]
OUT_STABILITY = "stability_scores"  # float32 [K]
OUT_BOXES = "boxes"  # int64 [K, 4]: x0, y0, x1, y1 (inclusive) in crop pixels; 0s if empty
OUT_PROMPT_INDEX = "prompt_index"  # int64 [K]: row of point_coords the mask came from
GRAPH_OUTPUTS = (OUT_MASKS, OUT_IOU, OUT_STABILITY, OUT_BOXES, OUT_PROMPT_INDEX)


def graph_name(family: str) -> str:
    """Name of the everything-decoder model for a family's model prefix (``sam2.1_tiny`` ...)."""
    return f"{family}_everything_decoder"


class Cancelled(Exception):
    """The job was cancelled between two batches."""


@dataclass(frozen=True)
class EverythingParams:
    """The official generators' parameters (same names, same meaning).

    ``point_grids`` and ``output_mode`` are not parameters: grids come from
    ``points_per_side``, and records always carry COCO compressed RLE. ``min_mask_region_area``
    must be 0 (its connected-component pass needs OpenCV / SAM2's CUDA extension; refused
    rather than silently skipped: SAM1's generator fills holes and drops islands with
    ``cv2.connectedComponentsWithStats`` after generation, SAM2's predictor does it on the
    low-res logits with its CUDA extension and skips it with a warning without one).
    ``multimask_output`` and ``use_m2m`` exist for SAM2 only. ``mask_threshold`` is SAM2's
    argument; for SAM1 it is the model's ``Sam.mask_threshold`` (0.0), which the official
    generator reads.
    """

    points_per_side: int = 32
    points_per_batch: int = 64
    pred_iou_thresh: float = 0.88
    stability_score_thresh: float = 0.95
    stability_score_offset: float = 1.0
    mask_threshold: float = 0.0
    box_nms_thresh: float = 0.7
    crop_n_layers: int = 0
    crop_nms_thresh: float = 0.7
    crop_overlap_ratio: float = 512 / 1500
    crop_n_points_downscale_factor: int = 1
    min_mask_region_area: int = 0
    multimask_output: bool = True
    use_m2m: bool = False


def defaults(family: str) -> EverythingParams:
    """The official generator's defaults: ``"sam1"`` (pred_iou_thresh 0.88) or ``"sam2"`` (0.8).

    Raises:
        RequestError: (``family``) not one of :data:`FAMILIES`.
    """
    if family == "sam1":
        return EverythingParams()
    if family == "sam2":
        return EverythingParams(pred_iou_thresh=0.8)
    raise RequestError("family", f"got {family!r}, expected one of {list(FAMILIES)}")


_INTS = {
    "points_per_side": (1, MAX_POINTS_PER_SIDE),
    "points_per_batch": (1, MAX_POINTS_PER_BATCH),
    "crop_n_layers": (0, MAX_CROP_N_LAYERS),
    "crop_n_points_downscale_factor": (1, MAX_DOWNSCALE_FACTOR),
    "min_mask_region_area": (0, 0),
}
# (low, high, high inclusive)
_FLOATS = {
    "pred_iou_thresh": (0.0, 1.0, True),
    "stability_score_thresh": (0.0, 1.0, True),
    "stability_score_offset": (0.0, MAX_STABILITY_OFFSET, True),
    "mask_threshold": (-MAX_ABS_MASK_THRESHOLD, MAX_ABS_MASK_THRESHOLD, True),
    "box_nms_thresh": (0.0, 1.0, True),
    "crop_nms_thresh": (0.0, 1.0, True),
    "crop_overlap_ratio": (0.0, 1.0, False),
}
_BOOLS = ("multimask_output", "use_m2m")
_SAM2_ONLY = {"multimask_output": True, "use_m2m": False}  # key -> the only SAM1 value


def parse_params(family: str, text: str | bytes | dict | None) -> EverythingParams:
    """The family's defaults with the overrides of a JSON object applied and checked.

    Args:
        family: ``"sam1"`` or ``"sam2"``.
        text: a JSON object (text or parsed) of overrides, keys as in
            :class:`EverythingParams`; empty / None for the defaults.

    Raises:
        RequestError: naming ``params`` or ``params.<key>``: not a JSON object, unknown key,
            wrong type (bools are not numbers), NaN / infinity, out of bounds, an option the
            family's official generator does not have.
    """
    base = defaults(family)
    if text is None or (isinstance(text, (str, bytes)) and not text.strip()):
        return base
    given = _json_object(text)
    known = {f.name for f in fields(EverythingParams)}
    updates: dict[str, Any] = {}
    for key, value in given.items():
        name = f"{FIELD}.{key}"
        if key not in known:
            raise RequestError(name, f"unknown parameter, expected some of {sorted(known)}")
        if key in _INTS:
            updates[key] = _int(name, value, *_INTS[key])
        elif key in _FLOATS:
            updates[key] = _float(name, value, *_FLOATS[key])
        else:
            if not isinstance(value, bool):
                raise RequestError(name, f"got {value!r}, expected true or false")
            if family == "sam1" and value != _SAM2_ONLY[key]:
                raise RequestError(
                    name, f"got {value!r}; SAM1's generator has no such option (SAM2 only)"
                )
            updates[key] = value
    params = replace(base, **updates)
    _check_layers(params)
    return params


def _json_object(text: str | bytes | dict) -> dict:
    if isinstance(text, dict):
        return text
    try:
        # NaN and Infinity (which Python's json writes) parse to floats here, so the check
        # of their key refuses them by its name.
        value = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(FIELD, f"not valid JSON ({e}); expected a JSON object") from None
    if not isinstance(value, dict):
        raise RequestError(FIELD, f"got a JSON {type(value).__name__}, expected an object")
    return value


def _int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(name, f"got {value!r}, expected an integer in [{low}, {high}]")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise RequestError(name, f"got {value!r}, expected an integer in [{low}, {high}]")
    if not low <= value <= high:
        raise RequestError(name, f"got {value!r}, expected an integer in [{low}, {high}]")
    return int(value)


def _float(name: str, value: Any, low: float, high: float, closed: bool) -> float:
    bracket = "]" if closed else ")"
    expected = f"a finite number in [{low:g}, {high:g}{bracket}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(name, f"got {value!r}, expected {expected}")
    value = float(value)
    if not math.isfinite(value):
        raise RequestError(name, f"got {value!r}, expected {expected}")
    if not (low <= value <= high) or (not closed and value == high):
        raise RequestError(name, f"got {value!r}, expected {expected}")
    return value


def _check_layers(params: EverythingParams) -> None:
    """Every crop layer must keep at least one point per side (the official generator
    divides by zero otherwise)."""
    last = params.crop_n_points_downscale_factor**params.crop_n_layers
    prompts = sum(
        4**k * int(params.points_per_side / params.crop_n_points_downscale_factor**k) ** 2
        for k in range(params.crop_n_layers + 1)
    )
    if prompts > MAX_JOB_PROMPTS:
        raise RequestError(
            f"{FIELD}.points_per_side",
            f"got {params.points_per_side} with crop_n_layers {params.crop_n_layers} and "
            f"crop_n_points_downscale_factor {params.crop_n_points_downscale_factor}: "
            f"{prompts} prompts over the job's crops, expected at most {MAX_JOB_PROMPTS}; "
            "use a smaller grid, fewer crop layers or a larger downscale factor",
        )
    if int(params.points_per_side / last) < 1:
        raise RequestError(
            f"{FIELD}.crop_n_points_downscale_factor",
            f"got {params.crop_n_points_downscale_factor} with points_per_side "
            f"{params.points_per_side} and crop_n_layers {params.crop_n_layers}: layer "
            f"{params.crop_n_layers} would have no points; expected points_per_side >= "
            f"factor ** crop_n_layers",
        )


def batch_logit_bytes(family: str, points_per_batch: int, crop_hw: tuple[int, int]) -> int:
    """Peak float32 logit bytes of one decoder run (see :data:`MAX_BATCH_LOGIT_BYTES`)."""
    per_mask = crop_hw[0] * crop_hw[1] + (1024 * 1024 if family == "sam1" else 0)
    return 4 * 3 * points_per_batch * per_mask


def check_image(family: str, params: EverythingParams, image_hw: tuple[int, int]) -> None:
    """Refuse a job whose decoder runs would exceed :data:`MAX_BATCH_LOGIT_BYTES` on this
    image (the whole image is the largest crop).

    Raises:
        RequestError: (``params.points_per_batch``) with the largest batch that fits.
    """
    need = batch_logit_bytes(family, params.points_per_batch, image_hw)
    if need > MAX_BATCH_LOGIT_BYTES:
        per_point = batch_logit_bytes(family, 1, image_hw)
        raise RequestError(
            f"{FIELD}.points_per_batch",
            f"got {params.points_per_batch}: on a {image_hw[1]}x{image_hw[0]} (W x H) image a "
            f"batch holds {need / 2**30:.1f} GiB of mask logits, expected at most "
            f"{MAX_BATCH_LOGIT_BYTES / 2**30:.0f} GiB: use points_per_batch <= "
            f"{max(1, MAX_BATCH_LOGIT_BYTES // per_point)}",
        )
