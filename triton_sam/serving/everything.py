"""Segment everything (automatic mask generation): parameters, plan, driver, NMS, RLE (numpy).

Reproduces ``segment_anything.SamAutomaticMaskGenerator`` and
``sam2.automatic_mask_generator.SAM2AutomaticMaskGenerator`` (same instances, scores, order),
split where it costs least:

- the ``<family>_everything_decoder`` graph (``export/everything.py``) runs a batch of P
  single-point prompts on one image's features and does the per-mask work on the device:
  upsampling to the crop's size, the pred_iou / stability filters, thresholding, boxes (and,
  for SAM2 ``use_m2m``, the refinement pass). It returns only the masks that survive;
- this module (dependency-free: it ships into Triton's python stub beside the served model,
  and the in-process runner imports the same file) plans the crops and point grids, drives
  the batches through two callbacks, drops masks near crop edges, uncrops, encodes COCO RLE
  per batch (memory stays bounded by one batch of masks), and runs the box NMS within each
  crop and across crops with ``torchvision.ops.batched_nms`` semantics.

Callbacks of :class:`Generator` (sync; the served model wraps its BLS calls in them):

- ``embed(crop_box_xyxy) -> features``: the crop's image features (opaque to the driver);
- ``decode(features, feeds) -> outputs``: one run of the everything-decoder graph on
  ``feeds`` (every input but the features: :func:`graph_feeds`) plus the features; returns
  the graph's outputs by name (:data:`GRAPH_OUTPUTS`).

Errors: :class:`~.bounds.RequestError` naming the parameter (``params.points_per_side``...),
answered as ``InvalidInput`` by the served model; :class:`Cancelled` when ``cancelled()``
turned true between batches.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from .bounds import RequestError
from .masks import compress_counts, rle_counts

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


# -- plan: crops and point grids ------------------------------------------------------------
@dataclass(frozen=True)
class CropJob:
    """One crop of a job.

    Attributes:
        box: (x0, y0, x1, y1) in pixels of the original image (x1, y1 exclusive).
        layer: crop layer (0 = the whole image).
        points: float64 [N, 2] (X, Y) in pixels of the crop: the layer's grid times the
            crop's size, as the official generator computes them.
    """

    box: tuple[int, int, int, int]
    layer: int
    points: np.ndarray

    @property
    def hw(self) -> tuple[int, int]:
        """(H, W) of the crop."""
        x0, y0, x1, y1 = self.box
        return y1 - y0, x1 - x0


def point_grid(n_per_side: int) -> np.ndarray:
    """float64 [n*n, 2] points evenly spaced in [0, 1]^2, X fastest (``build_point_grid``)."""
    offset = 1 / (2 * n_per_side)
    side = np.linspace(offset, 1 - offset, n_per_side)
    xs = np.tile(side[None, :], (n_per_side, 1))
    ys = np.tile(side[:, None], (1, n_per_side))
    return np.stack([xs, ys], axis=-1).reshape(-1, 2)


def layer_grids(n_per_side: int, n_layers: int, scale_per_layer: int) -> list[np.ndarray]:
    """One grid per crop layer (``build_all_layer_point_grids``)."""
    return [point_grid(int(n_per_side / (scale_per_layer**i))) for i in range(n_layers + 1)]


def crop_boxes(
    image_hw: tuple[int, int], n_layers: int, overlap_ratio: float
) -> tuple[list[list[int]], list[int]]:
    """Crop boxes (x0, y0, x1, y1) and their layers (``generate_crop_boxes``)."""
    im_h, im_w = image_hw
    short_side = min(im_h, im_w)
    boxes, layers = [[0, 0, im_w, im_h]], [0]

    def crop_len(orig_len: int, n_crops: int, overlap: int) -> int:
        return int(math.ceil((overlap * (n_crops - 1) + orig_len) / n_crops))

    for i_layer in range(n_layers):
        n_crops = 2 ** (i_layer + 1)
        overlap = int(overlap_ratio * short_side * (2 / n_crops))
        crop_w = crop_len(im_w, n_crops, overlap)
        crop_h = crop_len(im_h, n_crops, overlap)
        x0s = [int((crop_w - overlap) * i) for i in range(n_crops)]
        y0s = [int((crop_h - overlap) * i) for i in range(n_crops)]
        for x0 in x0s:  # itertools.product order: x outer, y inner
            for y0 in y0s:
                boxes.append([x0, y0, min(x0 + crop_w, im_w), min(y0 + crop_h, im_h)])
                layers.append(i_layer + 1)
    return boxes, layers


def plan(params: EverythingParams, image_hw: tuple[int, int]) -> list[CropJob]:
    """The crops of a job in the official order, each with its points in crop pixels."""
    grids = layer_grids(
        params.points_per_side, params.crop_n_layers, params.crop_n_points_downscale_factor
    )
    boxes, layers = crop_boxes(image_hw, params.crop_n_layers, params.crop_overlap_ratio)
    jobs = []
    for box, layer in zip(boxes, layers, strict=True):
        h, w = box[3] - box[1], box[2] - box[0]
        points = grids[layer] * np.array([[w, h]])
        jobs.append(CropJob(box=tuple(box), layer=layer, points=points))
    return jobs


def batches(job: CropJob, points_per_batch: int) -> list[np.ndarray]:
    """The crop's points cut into batches (``batch_iterator``)."""
    n = len(job.points)
    return [job.points[i : i + points_per_batch] for i in range(0, n, points_per_batch)]


def graph_feeds(params: EverythingParams, points: np.ndarray, crop_hw: tuple[int, int]) -> dict:
    """Every everything-decoder input but the features, for one batch of points.

    The stability cut-offs are added in float64 and rounded once to float32, as torch
    compares the float32 logits with ``mask_threshold +- offset`` computed in Python.
    """
    f32 = np.float32
    return {
        IN_POINTS: np.asarray(points, np.float64).reshape(-1, 2),
        IN_CROP_HW: np.array(crop_hw, np.int64),
        IN_PRED_IOU_THRESH: np.array([params.pred_iou_thresh], f32),
        IN_STABILITY_THRESH: np.array([params.stability_score_thresh], f32),
        IN_STABILITY_HIGH: np.array([params.mask_threshold + params.stability_score_offset], f32),
        IN_STABILITY_LOW: np.array([params.mask_threshold - params.stability_score_offset], f32),
        IN_MASK_THRESHOLD: np.array([params.mask_threshold], f32),
        IN_MULTIMASK: np.array([params.multimask_output], bool),
        IN_USE_M2M: np.array([params.use_m2m], bool),
    }


# -- NMS ------------------------------------------------------------------------------------
def box_area(boxes: np.ndarray) -> np.ndarray:
    """(x1 - x0) * (y1 - y0) of [N, 4] boxes (torchvision's ``box_area``, no +1)."""
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Indices kept by greedy NMS, by decreasing score (``torchvision.ops.batched_nms`` with
    one category).

    As torchvision's CPU kernel: boxes and IoU in float32, a stable descending sort (ties
    keep index order), a box suppressed when IoU > threshold (compared in float64: the
    kernel compares the float IoU with a double), NaN IoU (0/0) suppresses nothing.
    """
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    scores = np.asarray(scores, np.float32).reshape(-1)
    order = np.argsort(-scores, kind="stable")
    b = boxes[order]
    x0, y0, x1, y1 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    areas = (x1 - x0) * (y1 - y0)
    alive = np.ones(len(b), bool)
    keep = []
    zero = np.float32(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        for i in range(len(b)):
            if not alive[i]:
                continue
            keep.append(i)
            rest = i + 1 + np.flatnonzero(alive[i + 1 :])
            w = np.maximum(zero, np.minimum(x1[i], x1[rest]) - np.maximum(x0[i], x0[rest]))
            h = np.maximum(zero, np.minimum(y1[i], y1[rest]) - np.maximum(y0[i], y0[rest]))
            inter = w * h
            iou = inter / (areas[i] + areas[rest] - inter)
            alive[rest[iou.astype(np.float64) > iou_threshold]] = False
    return order[np.array(keep, np.int64)]


# -- instances ------------------------------------------------------------------------------
@dataclass
class Instances:
    """Masks kept so far, as columns (masks as uncompressed RLE run lengths).

    Attributes:
        runs: per mask, int64 run lengths (column-major, starting with background) of the
            mask in the ORIGINAL image frame.
        boxes: int64 [K, 4] xyxy, original frame (crop frame while still inside a crop).
        iou: float32 [K]; stability: float32 [K].
        points: [K, 2] the prompt point (float64 for SAM1, float32 for SAM2, as upstream).
        crop_boxes: int64 [K, 4] xyxy.
    """

    runs: list[np.ndarray]
    boxes: np.ndarray
    iou: np.ndarray
    stability: np.ndarray
    points: np.ndarray
    crop_boxes: np.ndarray

    @classmethod
    def empty(cls, point_dtype: Any) -> Instances:
        return cls(
            [],
            np.zeros((0, 4), np.int64),
            np.zeros(0, np.float32),
            np.zeros(0, np.float32),
            np.zeros((0, 2), point_dtype),
            np.zeros((0, 4), np.int64),
        )

    def __len__(self) -> int:
        return len(self.runs)

    def take(self, index: np.ndarray) -> Instances:
        index = np.asarray(index, np.int64)
        return Instances(
            [self.runs[i] for i in index],
            self.boxes[index],
            self.iou[index],
            self.stability[index],
            self.points[index],
            self.crop_boxes[index],
        )

    @classmethod
    def concat(cls, parts: list[Instances], point_dtype: Any) -> Instances:
        if not parts:
            return cls.empty(point_dtype)
        return cls(
            [r for p in parts for r in p.runs],
            np.concatenate([p.boxes for p in parts]),
            np.concatenate([p.iou for p in parts]),
            np.concatenate([p.stability for p in parts]),
            np.concatenate([p.points for p in parts]),
            np.concatenate([p.crop_boxes for p in parts]),
        )

    def records(self, image_hw: tuple[int, int]) -> list[dict]:
        """COCO records as the official generators' ``output_mode="coco_rle"`` writes them."""
        h, w = image_hw
        out = []
        for k, runs in enumerate(self.runs):
            x0, y0, x1, y1 = (int(v) for v in self.boxes[k])
            cx0, cy0, cx1, cy1 = (int(v) for v in self.crop_boxes[k])
            out.append(
                {
                    "segmentation": {"size": [h, w], "counts": compress_counts(runs).decode()},
                    "area": int(runs[1::2].sum()),
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "predicted_iou": float(self.iou[k]),
                    "point_coords": [[float(v) for v in self.points[k]]],
                    "stability_score": float(self.stability[k]),
                    "crop_box": [cx0, cy0, cx1 - cx0, cy1 - cy0],
                }
            )
        return out


def uncropped_runs(mask: np.ndarray, crop_box: tuple[int, ...], image_hw: tuple[int, int]):
    """Run lengths of a crop-frame bool mask placed in the original image (zero elsewhere)."""
    x0, y0, x1, y1 = crop_box
    h, w = image_hw
    if (x0, y0, x1, y1) == (0, 0, w, h):
        return rle_counts(mask)
    full = np.zeros((h, w), bool)
    full[y0:y1, x0:x1] = mask
    return rle_counts(full)


def near_crop_edge(
    boxes: np.ndarray, crop_box: tuple[int, ...], image_hw: tuple[int, int], atol: float = 20.0
) -> np.ndarray:
    """bool [K]: a box (crop frame) within ``atol`` of an edge of the crop that is not an edge
    of the image (``is_box_near_crop_edge``, compared in float32 as torch's ``isclose``)."""
    x0, y0 = crop_box[0], crop_box[1]
    h, w = image_hw
    b = (np.asarray(boxes, np.int64) + np.array([x0, y0, x0, y0])).astype(np.float32)
    crop = np.asarray(crop_box, np.float32)[None]
    image = np.array([[0, 0, w, h]], np.float32)
    near_crop = np.abs(b - crop) <= np.float32(atol)
    near_image = np.abs(b - image) <= np.float32(atol)
    return np.any(near_crop & ~near_image, axis=1)


# -- driver ---------------------------------------------------------------------------------
Embed = Callable[[tuple[int, int, int, int]], Any]
Decode = Callable[[Any, dict], dict]


class Generator:
    """Runs one segment-everything job through ``embed`` / ``decode`` callbacks.

    Args:
        params: checked parameters (:func:`parse_params`).
        family: ``"sam1"`` or ``"sam2"`` (the records' number types follow the official one).
        embed: ``(x0, y0, x1, y1) -> features`` of that crop of the image.
        decode: ``(features, feeds) -> outputs`` of the everything-decoder graph.
        progress: called ``(done_batches, total_batches)`` after each batch.
        cancelled: polled before each embed and each batch; True raises :class:`Cancelled`.
    """

    def __init__(
        self,
        params: EverythingParams,
        *,
        family: str,
        embed: Embed,
        decode: Decode,
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        defaults(family)
        self.params = params
        self.family = family
        self.embed = embed
        self.decode = decode
        self.progress = progress
        self.cancelled = cancelled
        # SAM2's generator keeps points as float32 tensors; SAM1's as float64 numpy.
        self.point_dtype = np.float32 if family == "sam2" else np.float64

    def total_batches(self, image_hw: tuple[int, int]) -> int:
        """Decoder runs a job on an image of ``image_hw`` takes (progress' denominator)."""
        jobs = plan(self.params, image_hw)
        return sum(len(batches(j, self.params.points_per_batch)) for j in jobs)

    def run(self, image_hw: tuple[int, int]) -> list[dict]:
        """The job's instances as COCO records, in the official generator's order."""
        return self.instances(image_hw).records(image_hw)

    def instances(self, image_hw: tuple[int, int]) -> Instances:
        """The job's instances as columns (before the records are written)."""
        image_hw = (int(image_hw[0]), int(image_hw[1]))
        check_image(self.family, self.params, image_hw)
        jobs = plan(self.params, image_hw)
        total = sum(len(batches(j, self.params.points_per_batch)) for j in jobs)
        done = 0
        per_crop = []
        for job in jobs:
            self._check_cancelled()
            features = self.embed(job.box)
            parts = []
            for points in batches(job, self.params.points_per_batch):
                self._check_cancelled()
                outputs = self.decode(features, graph_feeds(self.params, points, job.hw))
                parts.append(self._batch(outputs, points, job, image_hw))
                done += 1
                if self.progress is not None:
                    self.progress(done, total)
            del features
            per_crop.append(self._crop(Instances.concat(parts, self.point_dtype), job))
        data = Instances.concat(per_crop, self.point_dtype)
        if len(jobs) > 1:
            # Prefer masks from smaller crops: score 1 / area, float32 as torch's 1 / int.
            scores = (1.0 / box_area(data.crop_boxes).astype(np.float32)).astype(np.float32)
            data = data.take(nms(data.boxes, scores, self.params.crop_nms_thresh))
        return data

    def _check_cancelled(self) -> None:
        if self.cancelled is not None and self.cancelled():
            raise Cancelled("cancelled between batches")

    def _batch(
        self, outputs: dict, points: np.ndarray, job: CropJob, image_hw: tuple[int, int]
    ) -> Instances:
        masks = np.asarray(outputs[OUT_MASKS], bool)
        boxes = np.asarray(outputs[OUT_BOXES], np.int64).reshape(-1, 4)
        keep = ~near_crop_edge(boxes, job.box, image_hw)
        index = np.asarray(outputs[OUT_PROMPT_INDEX], np.int64).reshape(-1)[keep]
        return Instances(
            [uncropped_runs(m, job.box, image_hw) for m in masks[keep]],
            boxes[keep],
            np.asarray(outputs[OUT_IOU], np.float32).reshape(-1)[keep],
            np.asarray(outputs[OUT_STABILITY], np.float32).reshape(-1)[keep],
            np.asarray(points, self.point_dtype)[index],
            np.zeros((int(keep.sum()), 4), np.int64),
        )

    def _crop(self, data: Instances, job: CropJob) -> Instances:
        data = data.take(nms(data.boxes, data.iou, self.params.box_nms_thresh))
        x0, y0 = job.box[0], job.box[1]
        data.boxes = data.boxes + np.array([x0, y0, x0, y0], np.int64)
        data.points = (data.points + np.array([x0, y0], data.points.dtype)).astype(self.point_dtype)
        data.crop_boxes = np.tile(np.array(job.box, np.int64), (len(data), 1))
        return data


__all__ = [
    "Cancelled",
    "CropJob",
    "EverythingParams",
    "Generator",
    "Instances",
    "crop_boxes",
    "defaults",
    "graph_feeds",
    "layer_grids",
    "nms",
    "parse_params",
    "plan",
]
