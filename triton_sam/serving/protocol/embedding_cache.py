"""The ``<family>_session`` model: image features kept on the server (server-side embeddings).

One request, three uses. Every input but ``image_id`` is optional; tensors carry Triton's
batch dim first (1 per request):

- **embed**: an image as ``image_bytes`` (an encoded file, decoded on the server),
  ``image_rgb`` (uint8 [H, W, 3]) or the family's encoder inputs (``image``, float32
  [3, S, S] preprocessed). The server computes the image id from what it received and
  answers it as ``image_id``; a client-sent ``image_id`` is only a hint (it routes the
  request to a replica and binds nothing: features are kept under the computed id only).
  Runs the encoder unless the id is cached, answers ``encoded`` = 1
  (ran) or 0 (was cached).
- **probe**: ``image_id`` alone. Answers ``encoded`` = 0 when cached, else the miss below.
- **predict**: ``image_id`` + the family's prompt tensors (the decoder inputs that are not
  encoder outputs: ``point_coords``/``point_labels``/``mask_input``/``has_mask_input``, or
  another layout's). Answers the decoder outputs asked for. One prompt set per request: a
  batch dimension above 1 on any input, or more than one box (corner labels 2/3 in
  ``point_coords``, or ``input_boxes``), is refused, never merged.

Refinement without resending the mask (layouts with ``mask_input`` and a low-res mask
output): a predict that asks for the OUTPUT ``logits_key`` (a request naming no outputs asks
for every output, this one included) makes the server keep that
answer's low-res logits (those of ``masks`` when the answer has it, else of
``multimask_masks``; clipped like the official predictor's) and answer, in ``logits_key``,
a key the server issued for them: 128 random bits as 32 hex characters (an empty string when
the server keeps none: ``logits_per_image`` = 0). A later predict on the same image sends
``previous_key`` (that key) + ``previous_mask_index`` (mask i of those logits) instead of
256 KiB of ``mask_input``. Keys are capabilities: only a key this server issued for this
image, to this tenant, is found; anything else (another image's key, another tenant's, a
made-up one, one evicted or lost in a restart) is the miss below, which clients answer by
sending the mask itself. A client never names where logits are kept: the INPUT
``logits_key`` is refused (``InvalidInput``), and ``previous_key`` with ``mask_input`` too
(one mask per request). Treat keys as secrets; the server never logs or counts them.

A miss (an id or logits key this server does not hold: never embedded, evicted, restarted)
answers ``NOT_FOUND`` with code ``EmbeddingNotFound`` (see :mod:`triton_sam.serving.protocol`);
clients embed again and resend once.

Tenants (:mod:`.tenancy`): the features and kept logits of a request live in its tenant's
namespace. Another tenant's image id is a miss (a probe says ``EmbeddingNotFound``, an embed
of the same picture runs the encoder again: nothing tells whether another tenant embedded
it); within one tenant the content-addressed cache is shared (the image id is a function of
the pixels). The bounds (``max_images``, ``max_bytes``) are global, shared fairly between the
tenants holding entries (:mod:`triton_sam.serving.cache`).

Point-list families (SAM1, SAM2.1, the SAM3 tracker) also take prompts in original pixels
(``points``, ``labels``, ``box``, ``multimask_output``) and can answer finished masks at the
original size (``masks_rle`` / ``masks_png`` / ``masks_bits`` with ``mask_boxes``,
``mask_scores``, ``image_size``), each family by its upstream processor's rule
(:mod:`triton_sam.serving.rules`). Bounds on every request: :mod:`triton_sam.serving.bounds`.
"""

import json

from . import ERR_INVALID_INPUT, KIND_EMBEDDING_CACHE, KIND_PARAM, ProtocolError

KIND = KIND_EMBEDDING_CACHE

IMAGE_ID = "image_id"  # BYTES [1]
ENCODED = "encoded"  # INT32 [1] output
LOGITS_KEY = "logits_key"  # BYTES [1] output: the key the server issued (never an input)
PREVIOUS_KEY = "previous_key"  # BYTES [1]
PREVIOUS_MASK_INDEX = "previous_mask_index"  # INT32 [1]
MASK_INPUT = "mask_input"
HAS_MASK_INPUT = "has_mask_input"
IMAGE_RGB = "image_rgb"  # UINT8 [H, W, 3]
IMAGE_BYTES = "image_bytes"  # BYTES [1]: one encoded image file
CONTROL_INPUTS = (IMAGE_ID, LOGITS_KEY, PREVIOUS_KEY, PREVIOUS_MASK_INDEX)
IMAGE_INPUTS = (IMAGE_RGB, IMAGE_BYTES)
# Prompts in original pixels (point_list decoders), and the finished masks they can ask for.
POINTS = "points"  # FP32 [N, 2] (x, y)
LABELS = "labels"  # INT32 [N]
BOX = "box"  # FP32 [4] (x0, y0, x1, y1)
MULTIMASK = "multimask_output"  # INT32 [1]
PIXEL_INPUTS = (POINTS, LABELS, BOX, MULTIMASK)
MASKS_RLE = "masks_rle"  # BYTES [M]: COCO compressed RLE counts (size: image_size)
MASKS_PNG = "masks_png"  # BYTES [M]: 1-bit PNG
MASKS_BITS = "masks_bits"  # BYTES [M]: row-major bits, MSB first, rows not padded
MASK_BOXES = "mask_boxes"  # FP32 [M, 4]
MASK_SCORES = "mask_scores"  # FP32 [M]
IMAGE_SIZE = "image_size"  # INT32 [2] (H, W)
ENCODED_MASK_OUTPUTS = (MASKS_RLE, MASKS_PNG, MASKS_BITS)
FINISHED_OUTPUTS = (*ENCODED_MASK_OUTPUTS, MASK_BOXES, MASK_SCORES, IMAGE_SIZE)
# Decoder outputs that are low-res logits (what a client passes back as mask_input); a
# kept-logits key names the first of them the answer has.
MASK_OUTPUTS = ("masks", "multimask_masks")
ISSUED_KEY_BYTES = 16  # random bytes of a kept-logits key (hex: 32 characters)
# Request parameter (not a tensor, so the config is unchanged) naming the cache area an embed
# is kept in (serving/embedding_cache/store.py). The everything model's crops name CROPS_AREA:
# they live in an area of their own, at most CROP_AREA_IMAGES images shared fairly by the
# tenants, so a job's crops never evict the images a user is clicking on. Absent: the images.
CACHE_AREA = "cache_area"
IMAGES_AREA = "images"
CROPS_AREA = "crops"
CACHE_AREAS = (IMAGES_AREA, CROPS_AREA)
CROP_AREA_IMAGES = 4  # one layer-1 everything job's crops (2 x 2)
CROP_EMBED = {CACHE_AREA: CROPS_AREA}  # the parameters of a crop's embed request (BLS)
# Asked for when a predict request names no output.
DEFAULT_OUTPUTS = ("masks", "iou_predictions")
METRIC_PREFIX = "triton_sam_session_"
# Where a request's time goes inside the session model (serving/embedding_cache_model.py):
# counters of microseconds and of requests per stage, label ``stage`` (one of STAGES), so a
# p50-free but exact mean per stage is (delta us) / (delta count) between two scrapes.
STAGE_MICROSECONDS = METRIC_PREFIX + "stage_microseconds"
STAGE_COUNT = METRIC_PREFIX + "stage_count"
STAGES = (
    "schedule",  # execute() -> the request's coroutine starts on the instance's event loop
    "intake",  # input checks, pixel prompts -> decoder prompts, image id, cache lookup
    "feeds",  # the decoder's BLS request: cached features + prompts as pb_utils tensors
    "bls",  # decoder BLS round trip (inputs into the stub's shm, IPC, queue, run, outputs)
    "outputs",  # decoder outputs read; low-res logits kept for refinement by reference
    "finish",  # server-side masks (pixel prompts only): upsample + encode
    "respond",  # the response tensors built and sent
    "total",  # execute() -> response sent
)

# Config parameters (written by the renderer, read by the model).
PARAM_KIND = KIND_PARAM
PARAM_ENCODER_MODEL = "encoder_model"
PARAM_DECODER_MODEL = "decoder_model"
# The encoder name image ids are computed with, when the session model calls another copy of
# it (the CPU twin's background encoder): clients compute the same ids from the encoder they
# know. Absent: encoder_model. CPU twin only, like decoder_slots below.
PARAM_ENCODER_IDENTITY = "encoder_identity"
PARAM_ENCODER_INPUTS = "encoder_inputs"  # comma-separated
PARAM_EMBEDDING_NAMES = "embedding_names"  # encoder outputs = decoder inputs, comma-separated
PARAM_EMBEDDING_BYTES = "embedding_bytes"  # one image's features (the LRU's byte bound counts it)
PARAM_MAX_IMAGES = "max_images"
PARAM_MAX_BYTES = "max_bytes"
PARAM_LOGITS_PER_IMAGE = "logits_per_image"
PARAM_LOW_RES_LOGIT_LIMIT = "low_res_logit_limit"  # "" = kept logits unclipped
PARAM_PREPROCESSING = "preprocessing"  # JSON of the family's preprocessing (serving/intake.py)
PARAM_MAX_POINTS = "max_points"
PARAM_MAX_BOXES = "max_boxes"
PARAM_MAX_IMAGE_PIXELS = "max_image_pixels"
PARAM_MAX_IMAGE_BYTES = "max_image_bytes"
PARAM_BOX_BEFORE_POINTS = "box_before_points"  # "true"/"false": the family's prompt layout
PARAM_PAD_WITH_BOX = "pad_with_box"
# CPU instance: where the cached features live. "shared_memory" keeps the encoder's BLS
# output tensors (already in the stub's shared-memory pool) and hands them to the decoder
# again without a copy; "process" copies them into process memory once and back into the
# pool on every click (the /dev/shm-frugal choice: a 64 MB Docker /dev/shm holds 4 SAM2
# images). GPU instances keep device tensors either way.
PARAM_CPU_FEATURES = "cpu_features"
CPU_FEATURES = ("process", "shared_memory")  # the first is the default
# CPU twin only (written by the embedded repository, never by the renderer): clicks the
# session model keeps at its decoder at once; the rest wait in the session model (at most
# max_waiting_clicks), where one cancelled meanwhile is answered unrun. The twin's decoder for
# clicks has no dynamic batcher (measured: its hand-off between runs idled the cores), so
# these do its bounding and cancelling. Absent or 0: no limit (the decoder's batcher does
# both, as on a GPU). See serving/click_queue.py.
PARAM_DECODER_SLOTS = "decoder_slots"
PARAM_MAX_WAITING_CLICKS = "max_waiting_clicks"
DEFAULT_MAX_WAITING_CLICKS = 64  # as the decoder's own queue bound (max_queue_size)
# Embeds (requests that carry an image): at most max_concurrent_embeds are decoded,
# preprocessed and encoded at once, at most max_waiting_embeds wait for one of those slots,
# one more is refused at once with ERR_OVERLOADED (serving/click_queue.py). Each embed in work
# holds its pixels, its encoder input and its features, and the encoder's memory grows with
# the batches it runs: this is the bound on both. Clicks never wait in this line. Absent
# (configs written before): the defaults below.
PARAM_MAX_CONCURRENT_EMBEDS = "max_concurrent_embeds"
PARAM_MAX_WAITING_EMBEDS = "max_waiting_embeds"
# The feature store (serving/embedding_cache/disk.py): a directory where images the cache
# evicts are written, and its byte bound ("" = none: evicted features are dropped).
PARAM_FEATURE_STORE_DIR = "feature_store_dir"
PARAM_FEATURE_STORE_BYTES = "feature_store_bytes"
DEFAULT_FEATURE_STORE_BYTES = 64 * 2**30
DEFAULT_MAX_CONCURRENT_EMBEDS = 4  # one encoder batch (RepositoryOptions.encoder_max_batch_size)
DEFAULT_MAX_WAITING_EMBEDS = 16  # as the encoder's own queue bound (encoder_max_queue_size)
PARAM_KEYS = (
    PARAM_KIND,
    PARAM_ENCODER_MODEL,
    PARAM_DECODER_MODEL,
    PARAM_ENCODER_INPUTS,
    PARAM_EMBEDDING_NAMES,
    PARAM_EMBEDDING_BYTES,
    PARAM_MAX_IMAGES,
    PARAM_MAX_BYTES,
    PARAM_LOGITS_PER_IMAGE,
    PARAM_LOW_RES_LOGIT_LIMIT,
    PARAM_PREPROCESSING,
    PARAM_MAX_POINTS,
    PARAM_MAX_BOXES,
    PARAM_MAX_IMAGE_PIXELS,
    PARAM_MAX_IMAGE_BYTES,
    PARAM_BOX_BEFORE_POINTS,
    PARAM_PAD_WITH_BOX,
    PARAM_CPU_FEATURES,
    PARAM_MAX_CONCURRENT_EMBEDS,
    PARAM_MAX_WAITING_EMBEDS,
    PARAM_FEATURE_STORE_DIR,
    PARAM_FEATURE_STORE_BYTES,
)


def keeps_logits(decoder_inputs, decoder_outputs) -> bool:
    """Whether a session model over a decoder with these input and output names keeps
    logits for refinement (and so offers the ``logits_key`` output): the decoder takes
    ``mask_input`` and answers one of :data:`MASK_OUTPUTS`."""
    return MASK_INPUT in set(decoder_inputs) and bool(set(MASK_OUTPUTS) & set(decoder_outputs))


def cache_area(parameters_json: str | None) -> str:
    """The cache area a request names (:data:`CACHE_AREA`) in its parameters (the python
    backend's ``request.parameters()``, JSON text): one of :data:`CACHE_AREAS`.

    Raises:
        ProtocolError: ``InvalidInput`` naming ``cache_area`` for any other value.
    """
    value = json.loads(parameters_json).get(CACHE_AREA) if parameters_json else None
    if value is None:
        return IMAGES_AREA
    if value not in CACHE_AREAS:
        raise ProtocolError(
            ERR_INVALID_INPUT,
            f"{CACHE_AREA}: got {value!r}, expected one of {list(CACHE_AREAS)}",
            CACHE_AREA,
        )
    return value


# Bounds (SessionOptions' defaults).
DEFAULT_MAX_IMAGES = 16
DEFAULT_MAX_BYTES = 2 * 2**30
DEFAULT_LOGITS_PER_IMAGE = 4
