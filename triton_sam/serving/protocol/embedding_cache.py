"""The ``<family>_session`` model: image features kept on the server (server-side embeddings).

One request, three uses. Every input but ``image_id`` is optional; tensors carry Triton's
batch dim first (1 per request):

- **embed**: ``image_id`` + the family's encoder inputs (``image``, float32 [3, S, S]
  preprocessed). Runs the encoder unless the id is cached, keeps its outputs under the id and
  answers ``encoded`` = 1 (ran) or 0 (was cached).
- **probe**: ``image_id`` alone. Answers ``encoded`` = 0 when cached, else the miss below.
- **predict**: ``image_id`` + the family's prompt tensors (the decoder inputs that are not
  encoder outputs: ``point_coords``/``point_labels``/``mask_input``/``has_mask_input``, or
  another layout's). Optionally ``logits_key`` (keep this prediction's low-res logits under
  it) and ``previous_key`` + ``previous_mask_index`` (use mask i of logits kept earlier as
  ``mask_input``, instead of sending 256 KiB). Answers the decoder outputs asked for.

A miss (an id or logits key this server does not hold: never embedded, evicted, restarted)
answers ``NOT_FOUND`` with code ``EmbeddingNotFound`` (see :mod:`triton_sam.serving.protocol`);
clients embed again and resend once.
"""

from . import KIND_EMBEDDING_CACHE, KIND_PARAM

KIND = KIND_EMBEDDING_CACHE

IMAGE_ID = "image_id"  # BYTES [1]
ENCODED = "encoded"  # INT32 [1] output
LOGITS_KEY = "logits_key"  # BYTES [1]
PREVIOUS_KEY = "previous_key"  # BYTES [1]
PREVIOUS_MASK_INDEX = "previous_mask_index"  # INT32 [1]
MASK_INPUT = "mask_input"
HAS_MASK_INPUT = "has_mask_input"
CONTROL_INPUTS = (IMAGE_ID, LOGITS_KEY, PREVIOUS_KEY, PREVIOUS_MASK_INDEX)
# Decoder outputs that are low-res logits (what a client passes back as mask_input).
MASK_OUTPUTS = ("masks", "multimask_masks")
# Asked for when a predict request names no output.
DEFAULT_OUTPUTS = ("masks", "iou_predictions")
METRIC_PREFIX = "triton_sam_session_"

# Config parameters (written by the renderer, read by the model).
PARAM_KIND = KIND_PARAM
PARAM_ENCODER_MODEL = "encoder_model"
PARAM_DECODER_MODEL = "decoder_model"
PARAM_ENCODER_INPUTS = "encoder_inputs"  # comma-separated
PARAM_EMBEDDING_NAMES = "embedding_names"  # encoder outputs = decoder inputs, comma-separated
PARAM_EMBEDDING_BYTES = "embedding_bytes"  # one image's features (the LRU's byte bound counts it)
PARAM_MAX_IMAGES = "max_images"
PARAM_MAX_BYTES = "max_bytes"
PARAM_LOGITS_PER_IMAGE = "logits_per_image"
PARAM_LOW_RES_LOGIT_LIMIT = "low_res_logit_limit"  # "" = kept logits unclipped
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
)

# Bounds (SessionOptions' defaults).
DEFAULT_MAX_IMAGES = 16
DEFAULT_MAX_BYTES = 2 * 2**30
DEFAULT_LOGITS_PER_IMAGE = 4
