"""The ``sam3_concept`` model: an image, text phrases and exemplar boxes in, instances out.

One request = one image and N prompts; every input is
optional. Without ``text`` a request only embeds the image (or, with ``image_id`` alone, asks
whether the server holds it), so a client can send an image once and its phrases later.
Tensors carry Triton's batch dim first (size 1 per request). Cached image features and phrase
features live in the request's tenant namespace (:mod:`.tenancy`): another tenant's
``image_id`` is a miss, as if never sent.

Inputs:
    ``image``          UINT8 [H, W, 3] RGB pixels. The server preprocesses them (Sam3Processor's
                       resize and normalisation), keeps the features under the content id it
                       computes itself (:func:`triton_sam.serving.images.image_id`) and answers
                       that id. Omit it to reuse an image the server holds: send ``image_id``.
    ``image_id``       BYTES [1]: an id the server answered before (a lookup hint: the server
                       never binds features to an id it did not compute from the pixels).
    ``text``           BYTES [N]: UTF-8 phrases, 1..``max_phrases`` of them, each non-empty and
                       at most ``CONTEXT_LENGTH`` tokens with its start/end tokens. A phrase
                       is tokenised as Sam3Processor does (CLIP, lower-cased).
    ``threshold``      FP32 [1]: keep instances whose score exceeds it (default 0.3).
    ``mask_threshold`` FP32 [1]: binarise the resized mask probabilities above it (default 0.5).
    ``max_instances``  INT32 [1]: at most this many instances per phrase, the best scores
                       (default and maximum: the model's number of queries, 200).
    ``exemplar_boxes`` FP32 [G, 4]: 1..``MAX_BOXES`` boxes (x0, y0, x1, y1) in pixels of this
                       request's image, each around an example of the concept (or, labelled
                       0, a counter-example). Encoded on this image (SAM3's geometry
                       encoder) and kept under a new ``exemplar_id``.
    ``exemplar_labels`` INT32 [G]: 1 positive, 0 negative (default: all positive).
    ``exemplar_ids``   BYTES [E]: 1..``MAX_EXEMPLAR_IDS`` ids the server answered as
                       ``exemplar_id`` (to this tenant): exemplars drawn on earlier images,
                       applied to this one without their pixels.
Prompts: each phrase is a prompt; the request's exemplars (its boxes, then its ids' exemplars)
are appended to every phrase's prompt, after its text tokens, as ``Sam3Model`` appends the
geometry encoder's tokens to the text's. Exemplars without a phrase make one prompt with
``Sam3Processor``'s phrase for that case, ``"visual"`` (``EXEMPLAR_ONLY_PHRASE``). Boxes with
one phrase on their own image are exactly ``Sam3Model.forward(input_boxes=...)``; exemplars on
another image, or several exemplar sets in one prompt (one CLS token each), have no upstream
counterpart: SAM3 was trained with exemplars drawn on the image they prompt.
Outputs (ask only for what you need; masks are encoded only when asked for):
    ``image_id`` BYTES [1]; ``image_size`` INT32 [2] (H, W); ``encoded`` INT32 [1] (1: the
    vision graph ran, 0: the features were cached); ``exemplar_id`` BYTES [1]: the id of this
    request's boxes' exemplar (empty without boxes), for ``exemplar_ids`` of later requests;
    per prompt (``phrase_index`` numbers prompts): ``presence`` FP32 [N] (sigmoid of the
    presence logit), ``num_instances`` INT32 [N];
    per instance, phrase by phrase, in query order (Sam3Processor's order):
    ``phrase_index`` INT32 [K], ``query_index`` INT32 [K], ``scores`` FP32 [K], ``boxes`` FP32
    [K, 4] (x0, y0, x1, y1) in pixels of the original image, and the masks as
    ``masks_rle`` BYTES [K] (COCO compressed RLE ``counts``; ``{"size": [H, W], "counts": c}``
    decodes with ``pycocotools.mask.decode``), ``masks_png`` BYTES [K] (1-bit PNG at the
    original size) or ``masks_logits`` FP32 [K, 288, 288] (low-resolution logits).

Errors (the envelope of :mod:`triton_sam.serving.protocol`): a request the server refuses
answers INVALID_ARG (HTTP 400) with code ``InvalidInput`` and a message naming the field; an
``image_id`` or ``exemplar_ids`` entry the server does not hold for the tenant answers NOT_FOUND
with code ``EmbeddingNotFound`` (send the image, or the boxes with their image, again). The
server stays ready after either.
"""

from dataclasses import dataclass

from . import KIND_CONCEPT, KIND_PARAM

KIND = KIND_CONCEPT
MODEL = "sam3_concept"

# inputs
IMAGE = "image"
IMAGE_ID = "image_id"
TEXT = "text"
THRESHOLD = "threshold"
MASK_THRESHOLD = "mask_threshold"
MAX_INSTANCES = "max_instances"
EXEMPLAR_BOXES = "exemplar_boxes"
EXEMPLAR_LABELS = "exemplar_labels"
EXEMPLAR_IDS = "exemplar_ids"
INPUTS = (
    IMAGE,
    IMAGE_ID,
    TEXT,
    THRESHOLD,
    MASK_THRESHOLD,
    MAX_INSTANCES,
    EXEMPLAR_BOXES,
    EXEMPLAR_LABELS,
    EXEMPLAR_IDS,
)

# outputs
IMAGE_SIZE = "image_size"
ENCODED = "encoded"
EXEMPLAR_ID = "exemplar_id"
PRESENCE = "presence"
NUM_INSTANCES = "num_instances"
PHRASE_INDEX = "phrase_index"
QUERY_INDEX = "query_index"
SCORES = "scores"
BOXES = "boxes"
MASKS_RLE = "masks_rle"
MASKS_PNG = "masks_png"
MASKS_LOGITS = "masks_logits"
MASK_OUTPUTS = (MASKS_RLE, MASKS_PNG, MASKS_LOGITS)
OUTPUTS = (
    IMAGE_ID,
    IMAGE_SIZE,
    ENCODED,
    EXEMPLAR_ID,
    PRESENCE,
    NUM_INSTANCES,
    PHRASE_INDEX,
    QUERY_INDEX,
    SCORES,
    BOXES,
    *MASK_OUTPUTS,
)

# Sam3Processor's defaults.
DEFAULT_THRESHOLD = 0.3
DEFAULT_MASK_THRESHOLD = 0.5
# Tokens per phrase, start and end tokens included (Sam3Processor pads to 32; CLIP's text
# encoder has 32 positions, so a longer phrase cannot be encoded: refused, never truncated).
CONTEXT_LENGTH = 32
# Bounds enforced by the server (and checked first by the clients). Per request:
MAX_PHRASES = 16  # each phrase runs the decoder once (0.7 s on 2 CPU cores at width 64)
MAX_PHRASE_BYTES = 1024  # longer UTF-8 cannot fit 30 tokens of any CLIP vocabulary anyway
# Exemplars: each box adds a token to every prompt of the request (and so to the DETR
# encoder's and decoder's cross-attention); 16 boxes is 48 % more tokens than a phrase's 32.
MAX_BOXES = 16
MAX_EXEMPLAR_IDS = 4
EXEMPLAR_ID_MAX_BYTES = 64  # issued ids are 22 characters; anything longer was never issued
# Sam3Processor's phrase for boxes sent without text (``_resolve_text_prompts``).
EXEMPLAR_ONLY_PHRASE = "visual"
# 4096 x 4096: masks are resized to the original size on the server (4 bytes per pixel per
# instance while resizing), and Sam3 works at 1008 x 1008 anyway.
MAX_IMAGE_PIXELS = 16_777_216

# Image ids: images.image_id(rgb, image_namespace(model)); a client computes the same id to
# ask whether the server holds an image before sending its pixels.
IMAGE_ID_NAMESPACE = "sam3_concept/v1"


def image_namespace(model: str) -> str:
    """What an image id depends on besides the pixels: the protocol version and the model."""
    return f"{IMAGE_ID_NAMESPACE}\0{model}"


# Config parameters of the serving model (renderer and model.py read the same keys).
PARAM_KIND = KIND_PARAM
PARAM_VISION_MODEL = "vision_model"
PARAM_TEXT_MODEL = "text_model"
PARAM_DECODER_MODEL = "decoder_model"
PARAM_EXEMPLAR_MODEL = "exemplar_model"
PARAM_FEATURE_NAMES = "feature_names"  # the vision outputs = decoder inputs, comma-separated
PARAM_FEATURE_BYTES = "feature_bytes"  # one image's features (the LRU's byte bound counts it)
PARAM_PAD_TOKEN_ID = "pad_token_id"
PARAM_NUM_QUERIES = "num_queries"
PARAM_MAX_IMAGES = "max_images"
PARAM_MAX_BYTES = "max_bytes"
PARAM_MAX_PHRASES_CACHED = "max_phrases_cached"
PARAM_MAX_PHRASES = "max_phrases"
PARAM_PHRASES_PER_DECODE = "phrases_per_decode"
PARAM_MAX_IMAGE_PIXELS = "max_image_pixels"
PARAM_MAX_EXEMPLARS = "max_exemplars"
PARAM_MAX_BOXES = "max_boxes"
PARAM_KEYS = (
    PARAM_KIND,
    PARAM_VISION_MODEL,
    PARAM_TEXT_MODEL,
    PARAM_DECODER_MODEL,
    PARAM_FEATURE_NAMES,
    PARAM_FEATURE_BYTES,
    PARAM_PAD_TOKEN_ID,
    PARAM_NUM_QUERIES,
    PARAM_MAX_IMAGES,
    PARAM_MAX_BYTES,
    PARAM_MAX_PHRASES_CACHED,
    PARAM_MAX_PHRASES,
    PARAM_PHRASES_PER_DECODE,
    PARAM_MAX_IMAGE_PIXELS,
    PARAM_EXEMPLAR_MODEL,
    PARAM_MAX_EXEMPLARS,
    PARAM_MAX_BOXES,
)
TOKENIZER_FILE = "tokenizer.json"  # beside model.py


@dataclass(frozen=True)
class ConceptSettings:
    """The serving model's config parameters: rendered by ``repository/concept.py``, read by
    ``serving/concept_model.py`` (:mod:`.settings`; field names are the ``PARAM_*`` keys).

    Attributes:
        vision_model, text_model, decoder_model: graphs it calls over BLS.
        feature_names: the vision outputs (= decoder inputs).
        feature_bytes: one image's features, counted from the spec (on a GPU instance they
            stay in device memory, which the cache must count all the same).
        pad_token_id: the tokenizer's padding id; num_queries: the decoder's queries.
        max_images, max_bytes, max_phrases_cached: the caches' bounds.
        max_phrases, phrases_per_decode, max_image_pixels: a request's bounds.
        exemplar_model: the exemplar (geometry encoder) graph.
        max_exemplars: exemplars kept for ``exemplar_ids`` (LRU, fair between tenants).
        max_boxes: exemplar boxes one request may carry.
    """

    vision_model: str
    text_model: str
    decoder_model: str
    feature_names: tuple[str, ...]
    feature_bytes: int
    pad_token_id: int
    num_queries: int
    max_images: int
    max_bytes: int
    max_phrases_cached: int
    max_phrases: int
    phrases_per_decode: int
    max_image_pixels: int
    exemplar_model: str
    max_exemplars: int
    max_boxes: int
