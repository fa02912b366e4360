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

from .generator import (
    Decode,
    Embed,
    Generator,
)
from .instances import (
    Instances,
    box_area,
    near_crop_edge,
    nms,
    uncropped_runs,
)
from .params import (
    FAMILIES,
    FIELD,
    GRAPH_INPUTS,
    GRAPH_OUTPUTS,
    IN_CROP_HW,
    IN_MASK_THRESHOLD,
    IN_MULTIMASK,
    IN_POINTS,
    IN_PRED_IOU_THRESH,
    IN_STABILITY_HIGH,
    IN_STABILITY_LOW,
    IN_STABILITY_THRESH,
    IN_USE_M2M,
    MAX_ABS_MASK_THRESHOLD,
    MAX_BATCH_LOGIT_BYTES,
    MAX_CROP_N_LAYERS,
    MAX_DOWNSCALE_FACTOR,
    MAX_JOB_PROMPTS,
    MAX_POINTS_PER_BATCH,
    MAX_POINTS_PER_SIDE,
    MAX_STABILITY_OFFSET,
    OUT_BOXES,
    OUT_IOU,
    OUT_MASKS,
    OUT_PROMPT_INDEX,
    OUT_STABILITY,
    Cancelled,
    EverythingParams,
    batch_logit_bytes,
    check_image,
    defaults,
    graph_name,
    parse_params,
)
from .plan import (
    CropJob,
    batches,
    crop_boxes,
    graph_feeds,
    layer_grids,
    plan,
    point_grid,
)

__all__ = [
    "Cancelled",
    "CropJob",
    "Decode",
    "Embed",
    "EverythingParams",
    "FAMILIES",
    "FIELD",
    "GRAPH_INPUTS",
    "GRAPH_OUTPUTS",
    "Generator",
    "IN_CROP_HW",
    "IN_MASK_THRESHOLD",
    "IN_MULTIMASK",
    "IN_POINTS",
    "IN_PRED_IOU_THRESH",
    "IN_STABILITY_HIGH",
    "IN_STABILITY_LOW",
    "IN_STABILITY_THRESH",
    "IN_USE_M2M",
    "Instances",
    "MAX_ABS_MASK_THRESHOLD",
    "MAX_BATCH_LOGIT_BYTES",
    "MAX_CROP_N_LAYERS",
    "MAX_DOWNSCALE_FACTOR",
    "MAX_JOB_PROMPTS",
    "MAX_POINTS_PER_BATCH",
    "MAX_POINTS_PER_SIDE",
    "MAX_STABILITY_OFFSET",
    "OUT_BOXES",
    "OUT_IOU",
    "OUT_MASKS",
    "OUT_PROMPT_INDEX",
    "OUT_STABILITY",
    "batch_logit_bytes",
    "batches",
    "box_area",
    "check_image",
    "crop_boxes",
    "defaults",
    "graph_feeds",
    "graph_name",
    "layer_grids",
    "near_crop_edge",
    "nms",
    "parse_params",
    "plan",
    "point_grid",
    "uncropped_runs",
]
