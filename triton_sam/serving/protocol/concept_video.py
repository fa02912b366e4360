"""The ``sam3_concept_video`` model (to be served): tensor names, commands and bounds.

Standard library only, like every protocol module. The design, the order of work per frame
and the streaming contract are in ``docs/concept-video.md``; the orchestration is
:mod:`triton_sam.serving.concept_video`. Defined so far: what one streamed frame answers
(:mod:`triton_sam.serving.concept_video.wire` builds it), the ``settings`` a propagation
may override, with their bounds, and the commands the service answers
(:mod:`triton_sam.serving.concept_video.service`). The session commands (``init``,
``add_frame``, ``close``, ``info``) and their tensors are the tracker's
(:mod:`.tracker`), answered by the same session store.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import (  # noqa: F401 - the codes the service raises, re-exported for it
    ERR_CANCELLED,
    ERR_FRAME_MISSING,
    ERR_FRAME_OUT_OF_RANGE,
    ERR_INVALID_INPUT,
    ERR_LIMIT,
    ERR_NO_PROMPTS,
    ERR_OVERLOADED,
    ERR_SESSION_NOT_FOUND,
    KIND_CONCEPT_VIDEO,
)
from .concept import (  # noqa: F401 - exemplar boxes as the image concept model takes them
    EXEMPLAR_BOXES,
    EXEMPLAR_LABELS,
    EXEMPLAR_ONLY_PHRASE,
    MAX_BOXES,
)
from .tracker import (  # noqa: F401 - the session commands' names, shared with the tracker
    CMD_ADD_FRAME,
    CMD_CLOSE,
    CMD_INFO,
    CMD_INIT,
    COMMAND,
    FRAME,
    FRAME_BYTES,
    MAX_FRAMES,
    NUM_FRAMES,
    OUT_SESSION_ID,
    OUT_STATUS,
    REVERSE,
    SESSION_ID,
    START_FRAME,
    VIDEO_HW,
    StoreBounds,
    TrackingError,
)

MODEL = "sam3_concept_video"
KIND = KIND_CONCEPT_VIDEO

# -- commands ---------------------------------------------------------------------------------
# add_prompt: TEXT, or EXEMPLAR_BOXES (+ EXEMPLAR_LABELS) drawn on frame FRAME_INDEX (default
# 0), or both -> OUT_PROMPT_IDS. Boxes are FP32 [G, 4] (x0, y0, x1, y1) in that frame's
# pixels, 1..MAX_BOXES; labels INT32 [G], 1 positive / 0 negative (default all positive).
# Each phrase of the request becomes one prompt carrying the boxes; boxes without a phrase
# make one prompt of EXEMPLAR_ONLY_PHRASE. The frame must be uploaded.
CMD_ADD_PROMPT = "add_prompt"
CMD_PROPAGATE = "propagate"  # streams one response per processed frame, then a final one
SESSION_COMMANDS = (CMD_INIT, CMD_ADD_FRAME, CMD_CLOSE, CMD_INFO)  # answered as the tracker's
COMMANDS = (*SESSION_COMMANDS, CMD_ADD_PROMPT, CMD_PROPAGATE)
TEXT = "text"  # BYTES [N]: phrases (add_prompt)
# EXEMPLAR_BOXES / EXEMPLAR_LABELS: as sam3_concept's (add_prompt, with FRAME_INDEX)
MASK_FORMAT = "mask_format"  # BYTES [1]: one of MASK_FORMATS (propagate; default rle)
OUT_PROMPT_IDS = "out_prompt_ids"  # INT32 [N]: add_prompt, each phrase's prompt id
FRAMES_ANSWERED = "frames_answered"  # INT32 [1]: only in propagate's final response
MAX_PROMPTS = 16  # prompts per session: each is one decoder item per frame
MAX_PHRASE_BYTES = 1024  # one phrase (the tokenizer then refuses beyond 32 tokens)

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


# -- the model's config parameters ------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ConceptVideoServing(StoreBounds):
    """The ``sam3_concept_video`` model's config parameters (field names are the keys):
    ``detector_models`` / ``tracker_models``: JSON, graph key -> Triton model name (the
    concept graphs ``text``, ``exemplar``, ``decoder`` and ``video_vision``; the SAM3
    tracker's graphs);
    ``model_config``: JSON, the tracker's ``TrackerConfig``; ``pad_token_id``: the
    tokenizer's padding id (``tokenizer.json`` ships beside ``model.py``, as
    ``sam3_concept``'s); ``max_propagations``: propagations streaming at once (one more is
    refused with ``Overloaded``); the rest: the session store's bounds, as the tracker's."""

    detector_models: str
    tracker_models: str
    model_config: str
    pad_token_id: int
    max_propagations: int = 1
