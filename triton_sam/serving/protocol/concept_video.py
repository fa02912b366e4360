"""The ``sam3_concept_video`` model (to be served): tensor names, commands and bounds.

Standard library only, like every protocol module. The design, the order of work per frame
and the streaming contract are in ``docs/concept-video.md``; the orchestration is
:mod:`triton_sam.serving.concept_video`. Defined so far: what one streamed frame answers
(:mod:`triton_sam.serving.concept_video.wire` builds it) and the ``settings`` a propagation
may override, with their bounds.
"""

from __future__ import annotations

MODEL = "sam3_concept_video"

# -- one streamed response per answered frame (gRPC decoupled) ------------------------------
FRAME_INDEX = "frame_index"  # INT32 [1]; absent in a progress-only response
OBJECT_IDS = "object_ids"  # INT32 [K], increasing
PROMPT_IDS = "prompt_ids"  # INT32 [K]: the prompt each object was found by
SCORES = "scores"  # FP32 [K]: detection probability at the object's birth
TRACKER_SCORES = "tracker_scores"  # FP32 [K]: sigmoid of the tracker's object score here
BOXES = "boxes"  # FP32 [K, 4]: (x0, y0, x1, y1) inclusive pixel extents of the mask
MASKS_RLE = "masks_rle"  # BYTES [K]: COCO compressed RLE counts at the video's size
MASKS_LOGITS = "masks_logits"  # FP32 [K, 288, 288]: low-resolution logits
REMOVED_OBJECT_IDS = "removed_object_ids"  # INT32 [R]: removed since the last response
PROGRESS = "progress"  # INT32 [2]: (frames processed, frames to process)
MASK_FORMATS = ("rle", "logits")

# -- settings a propagation may override: field -> (type, low, high) -------------------------
# Bounds keep every heuristic meaningful (probabilities in [0, 1]) and a session's cost
# bounded (objects per session: each holds a memory bank; 64 as the tracker's MAX_OBJECTS).
SETTINGS = "settings"  # BYTES [1]: a JSON object of some of these fields
MAX_OBJECTS = 64
SETTING_BOUNDS: dict[str, tuple[type, float, float]] = {
    "score_threshold_detection": (float, 0.0, 1.0),
    "det_nms_thresh": (float, 0.0, 1.0),
    "use_nms": (bool, 0, 1),
    "assoc_iou_thresh": (float, 0.0, 1.0),
    "trk_assoc_iou_thresh": (float, 0.0, 1.0),
    "new_det_thresh": (float, 0.0, 1.0),
    "recondition_on_trk_masks": (bool, 0, 1),
    "hotstart_delay": (int, 0, 1000),
    "hotstart_unmatch_thresh": (int, 0, 1000),
    "hotstart_dup_thresh": (int, 0, 1000),
    "suppress_unmatched_only_within_hotstart": (bool, 0, 1),
    "init_trk_keep_alive": (int, -1000, 1000),
    "max_trk_keep_alive": (int, -1000, 1000),
    "min_trk_keep_alive": (int, -1000, 1000),
    "suppress_overlapping_based_on_recent_occlusion_threshold": (float, 0.0, 1.0),
    "decrease_trk_keep_alive_for_empty_masklets": (bool, 0, 1),
    "max_num_objects": (int, 1, MAX_OBJECTS),
    "recondition_every_nth_frame": (int, 0, 100000),
    "high_conf_thresh": (float, 0.0, 1.0),
    "high_iou_thresh": (float, 0.0, 1.0),
}
