"""The ``sam2_tracker`` model and the five video graphs it calls: contracts, commands, limits.

The exporter, the config renderer, the tracking orchestration (in Triton and in-process) and
the video client read the same definitions. Errors use the common envelope and codes of
:mod:`triton_sam.serving.protocol` (re-exported here for the orchestration).

Graph contracts are ``(name, dtype, shape)`` per tensor; ``shape`` is per request item,
without Triton's batch dimension (dim 0 of every graph tensor is the batch: the objects of one
call, or requests batched by Triton); ``-1`` is a variable dim. Image-space tensors are in the
model's square input frame (``IMAGE_SIZE``), masks at ``MASK_SIZE`` (stride 4); point
coordinates are (X, Y) in the input frame.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import (  # noqa: F401 - the codes the orchestration raises, re-exported for it
    ERR_CANCELLED,
    ERR_FRAME_MISSING,
    ERR_FRAME_OUT_OF_RANGE,
    ERR_INTERNAL,
    ERR_INVALID_INPUT,
    ERR_LIMIT,
    ERR_NO_PROMPTS,
    ERR_OBJECT_NOT_FOUND,
    ERR_OVERLOADED,
    ERR_SESSION_NOT_FOUND,
    ERROR_PREFIX,
    ERROR_STATUS,
    KIND_PARAM,
    KIND_TRACKER,
    ProtocolError,
    error_code,
    error_message,
    error_response,
)

KIND = KIND_TRACKER
IMAGE_SIZE = 1024  # square model input (SAM2Base.image_size for every SAM2.1 variant)
MASK_SIZE = IMAGE_SIZE // 4  # low-resolution mask logits (stride 4)
FEAT_SIZE = IMAGE_SIZE // 16  # lowest-resolution feature map (stride 16)
HIDDEN_DIM = 256  # SAM2Base.hidden_dim (FPN neck d_model) for every SAM2.1 variant
MEM_DIM = 64  # SAM2Base.mem_dim (memory encoder out_dim) for every SAM2.1 variant
# A large negative logit that marks "no object" (sam2.modeling.sam2_base.NO_OBJ_SCORE).
NO_OBJ_SCORE = -1024.0
# add_new_points_or_box clamps the previous low-res logits it feeds back as mask input.
MASK_INPUT_LIMIT = 32.0
# SAM2Base._use_mask_as_output: a mask prompt becomes logits -10 / +10.
MASK_AS_OUTPUT_SCALE = 20.0
MASK_AS_OUTPUT_BIAS = -10.0
# load_video_frames' normalisation (ImageNet mean/std on [0, 1]).
PIXEL_MEAN = (0.485, 0.456, 0.406)
PIXEL_STD = (0.229, 0.224, 0.225)

TensorContract = tuple[str, str, tuple[int, ...]]

Contracts = dict[str, tuple[tuple[TensorContract, ...], tuple[TensorContract, ...]]]


# -- the five graphs the tracker calls ------------------------------------------------------
def graph_contracts(image_size: int, feat: int, hidden: int, mem: int) -> Contracts:
    """Graph key -> (inputs, outputs) of one model family: square input ``image_size``, lowest
    feature level ``feat`` x ``feat`` (masks and the first high-resolution level 4x that, the
    second 2x), ``hidden`` feature channels, ``mem`` memory channels. SAM2.1:
    (1024, 64, 256, 64); SAM3: (1008, 72, 256, 64). Per-item dims (batch first when sent).
    """
    # Image encoder for tracking: SAM2Base.forward_image + _prepare_backbone_features, the three
    # feature levels as NCHW maps, *without* no_mem_embed (the image pair's encoder adds it; the
    # memory attention and the memory encoder need the raw lowest level). The position encodings
    # are constants of the feature-map size, so they live inside the graphs that use them.
    encoder_inputs = (("image", "float32", (3, image_size, image_size)),)
    encoder_outputs = (
        ("vision_feats", "float32", (hidden, feat, feat)),
        ("high_res_feats_0", "float32", (32, 4 * feat, 4 * feat)),
        ("high_res_feats_1", "float32", (64, 2 * feat, 2 * feat)),
    )
    # Memory attention (SAM2Base._prepare_memory_conditioned_features, step 2): the current
    # frame's features cross-attend to Nm spatial memories and Np object pointers.
    #   memory_tpos: t_pos of each memory (0 = conditioning frame, 1..num_maskmem-1 = how recent),
    #     the graph adds maskmem_tpos_enc[num_maskmem - 1 - t_pos] to its position encoding;
    #   obj_ptr_tpos: each pointer's temporal offset divided by (max pointers - 1), as upstream
    #     feeds get_1d_sine_pe.
    memory_attention_inputs = (
        ("vision_feats", "float32", (hidden, feat, feat)),
        ("memory", "float32", (-1, mem, feat, feat)),
        ("memory_tpos", "int64", (-1,)),
        ("obj_ptrs", "float32", (-1, hidden)),
        ("obj_ptr_tpos", "float32", (-1,)),
    )
    memory_attention_outputs = (("pix_feat", "float32", (hidden, feat, feat)),)
    # SAM heads (SAM2Base._forward_sam_heads) on memory-conditioned features. Prompts as the
    # image decoder takes them: box corners (2/3) first, clicks, then padding points (-1), which
    # the caller appends (upstream's prompt encoder pads once more than the points it is given).
    # Flags are 0/1 floats so one graph serves every case by arithmetic:
    #   has_mask_input: mask_input holds previous logits (a correction), else no_mask_embed;
    #   multimask_output: the best of tokens 1-3 by predicted IoU, else token 0 with dynamic
    #     multimask via stability (SAM2Base._use_multimask decides, in the orchestration);
    #   add_no_mem_embed: pix_feat is the raw frame feature of an initial conditioning frame
    #     (directly_add_no_mem_embed), so the graph adds no_mem_embed.
    decoder_inputs = (
        ("pix_feat", "float32", (hidden, feat, feat)),
        ("high_res_feats_0", "float32", (32, 4 * feat, 4 * feat)),
        ("high_res_feats_1", "float32", (64, 2 * feat, 2 * feat)),
        ("point_coords", "float32", (-1, 2)),
        ("point_labels", "float32", (-1,)),
        ("mask_input", "float32", (1, 4 * feat, 4 * feat)),
        ("has_mask_input", "float32", (1,)),
        ("multimask_output", "float32", (1,)),
        ("add_no_mem_embed", "float32", (1,)),
    )
    # low_res_masks: the selected mask, NO_OBJ_SCORE everywhere when object_score_logits <= 0;
    # obj_ptr: already replaced by no_obj_ptr when the object is absent (fixed_no_obj_ptr).
    decoder_outputs = (
        ("low_res_masks", "float32", (1, 4 * feat, 4 * feat)),
        ("obj_ptr", "float32", (hidden,)),
        ("object_score_logits", "float32", (1,)),
        ("iou", "float32", (1,)),
    )
    # Memory encoder (SAM2Base._encode_new_memory): low-res masks upsampled to the input frame
    # inside the graph (bilinear, as every upstream caller does before encoding), sigmoid (or
    # binarised for masks from clicks), scale and bias, no_obj_embed_spatial added where the
    # object is absent. The output is what upstream stores (before its bfloat16 cast, which the
    # orchestration applies).
    memory_encoder_inputs = (
        ("vision_feats", "float32", (hidden, feat, feat)),
        ("low_res_masks", "float32", (1, 4 * feat, 4 * feat)),
        ("object_score_logits", "float32", (1,)),
        ("is_mask_from_pts", "float32", (1,)),
    )
    memory_encoder_outputs = (("maskmem_features", "float32", (mem, feat, feat)),)
    # A mask prompt (SAM2Base._use_mask_as_output): the object pointer and score a binary mask in
    # the input frame gives; its low-res logits are a resampling the orchestration does.
    # (The pointer and score come from the decoder's tokens, which the high-resolution features do
    # not reach: they only shape the mask upsampling, whose output is not used here.)
    mask_prompt_inputs = (
        ("vision_feats", "float32", (hidden, feat, feat)),
        ("mask", "float32", (1, image_size, image_size)),
    )
    mask_prompt_outputs = (
        ("obj_ptr", "float32", (hidden,)),
        ("object_score_logits", "float32", (1,)),
    )

    # graph key -> (inputs, outputs); the keys are also the exporter's file stems.
    return {
        "video_encoder": (encoder_inputs, encoder_outputs),
        "memory_attention": (memory_attention_inputs, memory_attention_outputs),
        "video_decoder": (decoder_inputs, decoder_outputs),
        "memory_encoder": (memory_encoder_inputs, memory_encoder_outputs),
        "mask_prompt": (mask_prompt_inputs, mask_prompt_outputs),
    }


GRAPHS: Contracts = graph_contracts(IMAGE_SIZE, FEAT_SIZE, HIDDEN_DIM, MEM_DIM)
ENCODER_INPUTS, ENCODER_OUTPUTS = GRAPHS["video_encoder"]
MEMORY_ATTENTION_INPUTS, MEMORY_ATTENTION_OUTPUTS = GRAPHS["memory_attention"]
DECODER_INPUTS, DECODER_OUTPUTS = GRAPHS["video_decoder"]
MEMORY_ENCODER_INPUTS, MEMORY_ENCODER_OUTPUTS = GRAPHS["memory_encoder"]
MASK_PROMPT_INPUTS, MASK_PROMPT_OUTPUTS = GRAPHS["mask_prompt"]
# SAM3 (transformers' Sam3TrackerVideoModel at facebook/sam3's sizes): 1008 / 14 = 72.
SAM3_IMAGE_SIZE = 1008
SAM3_FEAT_SIZE = 72
SAM3_GRAPHS: Contracts = graph_contracts(SAM3_IMAGE_SIZE, SAM3_FEAT_SIZE, HIDDEN_DIM, MEM_DIM)
# SAM3's mask prompt also returns its memory: transformers encodes a mask prompt's memory
# from the full-resolution mask (not from low-resolution logits, which is all the
# memory_encoder graph takes), so the graph that has the mask encodes it.
SAM3_GRAPHS["mask_prompt"] = (
    SAM3_GRAPHS["mask_prompt"][0],
    (
        *SAM3_GRAPHS["mask_prompt"][1],
        ("maskmem_features", "float32", (MEM_DIM, SAM3_FEAT_SIZE, SAM3_FEAT_SIZE)),
    ),
)
SAM3_GRAPH_KEYS = tuple(SAM3_GRAPHS)
# graph key -> default Triton model name
DEFAULT_MODEL_NAMES: dict[str, str] = {
    "video_encoder": "sam2_video_encoder",
    "memory_attention": "sam2_memory_attention",
    "video_decoder": "sam2_video_decoder",
    "memory_encoder": "sam2_memory_encoder",
    "mask_prompt": "sam2_mask_prompt",
}
TRACKER_MODEL = "sam2_tracker"
SAM3_MODEL_NAMES: dict[str, str] = {
    key: name.replace("sam2_", "sam3_", 1)
    for key, name in DEFAULT_MODEL_NAMES.items()
    if key in SAM3_GRAPH_KEYS
}
SAM3_TRACKER_MODEL = "sam3_tracker"
# family -> (graph key -> default Triton model name, the tracker model's name)
FAMILY_MODELS: dict[str, tuple[dict[str, str], str]] = {
    "sam2": (DEFAULT_MODEL_NAMES, TRACKER_MODEL),
    "sam3": (SAM3_MODEL_NAMES, SAM3_TRACKER_MODEL),
}

# -- the tracker model's request -----------------------------------------------------------
# One request = one command. Every input but COMMAND is optional; a command reads the ones it
# needs and refuses missing ones with INVALID_ARG naming the input.
COMMAND = "command"  # BYTES [1]: one of COMMANDS
# BYTES [1]: the id ``init`` answered (OUT_SESSION_ID), on every other command. The server
# issues it (SESSION_ID_BYTES random bytes, URL-safe base64) and binds it to the tenant of the
# init request; ``init`` itself must not carry one. It is a bearer capability: keep it secret.
SESSION_ID = "session_id"
FRAME_INDEX = "frame_index"  # INT32 [1]
OBJECT_ID = "object_id"  # INT32 [1]
NUM_FRAMES = "num_frames"  # INT32 [1]: init
VIDEO_HW = "video_hw"  # INT32 [2]: init, (H, W) of the original frames
FRAME = "frame"  # UINT8 [H, W, C] (C = 1 or 3): one decoded frame
FRAME_BYTES = "frame_bytes"  # BYTES [1]: one encoded frame (PNG/JPEG/TIFF...)
POINTS = "points"  # FP32 [N, 2]: (X, Y) pixels of the original frame
LABELS = "labels"  # INT32 [N]: 1 foreground, 0 background
BOX = "box"  # FP32 [4]: (X0, Y0, X1, Y1) pixels of the original frame
CLEAR_OLD_POINTS = "clear_old_points"  # BOOL [1], default true
NORMALIZE_COORDS = "normalize_coords"  # BOOL [1], default true: points/box in pixels
MASK = "mask"  # BOOL [H, W] at the original resolution
START_FRAME = "start_frame_index"  # INT32 [1], -1 = earliest conditioning frame
MAX_FRAMES = "max_frame_num_to_track"  # INT32 [1], -1 = all
REVERSE = "reverse"  # BOOL [1]
STRICT = "strict"  # BOOL [1]: remove_object of an unknown object is an error
# outputs
OUT_FRAME_INDEX = "out_frame_index"  # INT32 [1]
OUT_OBJECT_IDS = "object_ids"  # INT32 [K]
OUT_MASKS = "masks"  # FP32 [K, 1, MASK_SIZE, MASK_SIZE] low-res logits (client upsamples)
OUT_OBJECT_SCORES = "object_scores"  # FP32 [K]
OUT_FRAMES = "frames"  # INT32 [F]: preflight's processing order; remove_object's frames
# BYTES [1]: JSON about the caller's own session only (STATUS_KEYS), never server-wide counters
# (those are the operator's, in Triton's metrics)
OUT_STATUS = "status"
OUT_SESSION_ID = "out_session_id"  # BYTES [1]: init, the session's id
OUTPUTS = (
    OUT_FRAME_INDEX,
    OUT_OBJECT_IDS,
    OUT_MASKS,
    OUT_OBJECT_SCORES,
    OUT_FRAMES,
    OUT_STATUS,
    OUT_SESSION_ID,
)
# the status JSON: {"session": {key: ...}} with these keys
STATUS_KEYS = ("bytes", "frames_tracked", "frames_uploaded", "num_frames", "objects")
# every request input: (name, dtype, per-item dims); all optional but COMMAND
INPUTS: tuple[TensorContract, ...] = (
    (COMMAND, "bytes", (1,)),
    (SESSION_ID, "bytes", (1,)),
    (FRAME_INDEX, "int32", (1,)),
    (OBJECT_ID, "int32", (1,)),
    (NUM_FRAMES, "int32", (1,)),
    (VIDEO_HW, "int32", (2,)),
    (FRAME, "uint8", (-1, -1, -1)),
    (FRAME_BYTES, "bytes", (1,)),
    (POINTS, "float32", (-1, 2)),
    (LABELS, "int32", (-1,)),
    (BOX, "float32", (4,)),
    (CLEAR_OLD_POINTS, "bool", (1,)),
    (NORMALIZE_COORDS, "bool", (1,)),
    (MASK, "bool", (-1, -1)),
    (START_FRAME, "int32", (1,)),
    (MAX_FRAMES, "int32", (1,)),
    (REVERSE, "bool", (1,)),
    (STRICT, "bool", (1,)),
)


def output_tensors(mask_size: int = MASK_SIZE) -> tuple[TensorContract, ...]:
    """Every output of the tracker model of a family whose masks are ``mask_size`` square."""
    return (
        (OUT_FRAME_INDEX, "int32", (1,)),
        (OUT_OBJECT_IDS, "int32", (-1,)),
        (OUT_MASKS, "float32", (-1, 1, mask_size, mask_size)),
        (OUT_OBJECT_SCORES, "float32", (-1,)),
        (OUT_FRAMES, "int32", (-1,)),
        (OUT_STATUS, "bytes", (1,)),
        (OUT_SESSION_ID, "bytes", (1,)),
    )


OUTPUT_TENSORS = output_tensors(MASK_SIZE)
REQUIRED_INPUTS = (COMMAND,)

# Commands. Frames are uploaded once (init, then add_frame per frame); propagation is one
# request per frame ("track"), so each answer carries one frame's masks (~256 KiB per object
# at low resolution), the memory bank never crosses the wire, and a cancelled client simply
# stops asking: nothing past the frame in flight runs.
CMD_INIT = "init"
CMD_ADD_FRAME = "add_frame"
CMD_ADD_POINTS = "add_points"
CMD_ADD_MASK = "add_mask"
CMD_PREFLIGHT = "preflight"
CMD_TRACK = "track"
CMD_GET = "get"
CMD_CLEAR_PROMPTS = "clear_prompts"
CMD_REMOVE_OBJECT = "remove_object"
CMD_RESET = "reset"
CMD_CLOSE = "close"
CMD_INFO = "info"
COMMANDS = (
    CMD_INIT,
    CMD_ADD_FRAME,
    CMD_ADD_POINTS,
    CMD_ADD_MASK,
    CMD_PREFLIGHT,
    CMD_TRACK,
    CMD_GET,
    CMD_CLEAR_PROMPTS,
    CMD_REMOVE_OBJECT,
    CMD_RESET,
    CMD_CLOSE,
    CMD_INFO,
)

# -- bounds (defaults; the tracker model's config parameters override them) --------------
# Who may evict whom is the rule of tracking/sessions.py (its module docstring).
SESSION_ID_BYTES = 16  # random bytes of an issued session id: 128 bits
MAX_SESSION_ID_CHARS = 256  # longer is refused as malformed, not looked up
DEFAULT_MAX_SESSIONS = 4
# sessions one tenant may hold; 0 = max_sessions (one team, no proxy: everyone is one tenant)
DEFAULT_MAX_TENANT_SESSIONS = 0
# bytes one tenant's sessions may hold together; 0 = max_total_bytes
DEFAULT_MAX_TENANT_BYTES = 0
# a session unused for this long may be evicted to make room for another; one used more
# recently never is (the request that needs the room is refused with Overloaded instead)
DEFAULT_EVICT_IDLE_S = 60
DEFAULT_MAX_FRAMES = 2000  # frames per session
DEFAULT_MAX_SESSION_BYTES = 8 * 2**30  # frames + features + memory bank of one session
DEFAULT_MAX_TOTAL_BYTES = 16 * 2**30  # every session together (idle ones evicted beyond)
DEFAULT_FEATURE_CACHE_FRAMES = 4  # encoded frames per session (16 MiB each, LRU)
MAX_OBJECTS = 64
MAX_POINTS = 64
MAX_FRAME_SIDE = 8192  # pixels per side of an uploaded frame
MAX_FRAME_BYTES = 64 * 2**20  # an encoded frame

# Config ``parameters`` of the tracker model (written by the repository, read by model.py).
PARAM_KIND = KIND_PARAM
PARAM_GRAPH_MODELS = "graph_models"  # JSON: graph key -> Triton model name
PARAM_MODEL_CONFIG = "model_config"  # JSON: the SAM2 hyperparameters (TrackerConfig)
PARAM_MAX_SESSIONS = "max_sessions"
PARAM_MAX_FRAMES = "max_frames"
PARAM_MAX_SESSION_BYTES = "max_session_bytes"
PARAM_MAX_TOTAL_BYTES = "max_total_bytes"
PARAM_FEATURE_CACHE_FRAMES = "feature_cache_frames"
PARAM_MAX_TENANT_SESSIONS = "max_tenant_sessions"
PARAM_MAX_TENANT_BYTES = "max_tenant_bytes"
PARAM_EVICT_IDLE_S = "evict_idle_s"
PARAM_KEYS = (
    PARAM_KIND,
    PARAM_GRAPH_MODELS,
    PARAM_MODEL_CONFIG,
    PARAM_MAX_SESSIONS,
    PARAM_MAX_FRAMES,
    PARAM_MAX_SESSION_BYTES,
    PARAM_MAX_TOTAL_BYTES,
    PARAM_FEATURE_CACHE_FRAMES,
    PARAM_MAX_TENANT_SESSIONS,
    PARAM_MAX_TENANT_BYTES,
    PARAM_EVICT_IDLE_S,
)
STORE_BOUNDS = PARAM_KEYS[3:]  # the session store's (tracking/sessions.py)


@dataclass(frozen=True)
class StoreBounds:
    """The session store's bounds (``tracking/sessions.py``), each a config parameter of the
    tracker model (field names are the ``PARAM_*`` keys): the operator's choice
    (``repository.video_config.TrackerOptions``) and what the model reads back
    (:class:`TrackerSettings`)."""

    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_frames: int = DEFAULT_MAX_FRAMES
    max_session_bytes: int = DEFAULT_MAX_SESSION_BYTES
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES
    feature_cache_frames: int = DEFAULT_FEATURE_CACHE_FRAMES
    max_tenant_sessions: int = DEFAULT_MAX_TENANT_SESSIONS
    max_tenant_bytes: int = DEFAULT_MAX_TENANT_BYTES
    evict_idle_s: int = DEFAULT_EVICT_IDLE_S

    def store_bounds(self) -> dict[str, int]:
        """The bounds, as ``SessionStore``'s keyword arguments."""
        return {key: getattr(self, key) for key in STORE_BOUNDS}


# Keyword-only: its own fields have no default, and follow the bounds' defaulted ones.
@dataclass(frozen=True, kw_only=True)
class TrackerSettings(StoreBounds):
    """The tracker model's config parameters: rendered by ``repository/video_config.py``,
    read by ``serving/tracker_model.py`` (:mod:`.settings`; field names are the ``PARAM_*``
    keys). ``graph_models``: JSON, graph key -> Triton model name; ``model_config``: JSON,
    the SAM2 hyperparameters (``TrackerConfig``); the rest: the session store's bounds."""

    graph_models: str
    model_config: str


class TrackingError(ProtocolError):
    """An error of the tracking orchestration, carrying its protocol code."""
