"""SAM3 concept segmentation family: text and exemplar prompts -> every instance, as
transformers' Sam3Model.

Ground truth is transformers' ``Sam3Model`` with ``Sam3Processor``:

- preprocessing: the tracker's (``Sam3ImageProcessor``: uint8 image resized to 1008x1008,
  antialiased, then ``(x - 127.5) / 127.5``), see :mod:`triton_sam.models.sam3`;
- text: the processor's CLIP tokenizer, ``padding="max_length", max_length=32`` (a phrase of
  more than 32 tokens is not truncated by the processor and the text encoder refuses it, so
  the serving model refuses it too);
- post-processing: ``post_process_instance_segmentation``: score = sigmoid(logit) x
  sigmoid(presence) > threshold, masks = bilinear resize of sigmoid(mask logits) to the
  original size > mask_threshold, boxes (xyxy, normalised) times (W, H, W, H).

Four graphs, so each runs as often as it must and no more:

- **vision** (once per image): ``pixel_values`` -> the three FPN levels the DETR encoder and
  the mask decoder read (``fpn_hidden_states[:-1]``: 288x288, 144x144, 72x72 at the FPN
  width). The position encodings are constants of these shapes and live in the decoder.
- **text** (once per phrase): token ids + attention mask -> ``get_text_features`` (the CLIP
  encoder and the projection to the DETR width), [32, width] per phrase.
- **exemplar** (once per image with exemplar boxes): the 72x72 level and G boxes (normalised
  cx, cy, w, h, as ``Sam3Processor`` sends ``input_boxes``) with their labels (1 positive,
  0 negative) -> ``Sam3Model.geometry_encoder``'s G + 1 prompt tokens (the boxes', then a
  CLS token). One image per call (upstream's ``roi_align`` call unrolls the batch).
- **decoder** (per image and prompts): one image's features (batch = images) and N prompts
  (a per-item dim), each P tokens: a phrase's 32 text tokens, followed by exemplar tokens when
  it has exemplars (what ``Sam3Model.forward`` concatenates from ``text_embeds`` and the
  geometry encoder's output; a prompt with exemplars and no phrase uses the processor's
  phrase ``"visual"``) -> the instances that pass ``threshold``, at most ``max_instances``
  per prompt (the highest scores), in query order as the processor returns them. Scoring,
  thresholding and the top-k happen inside the graph, so the [N, 200, 288, 288] mask logits
  (66 MB per phrase at full size) never leave it; only the selected masks do.

The tensor contract depends on the model width (256 for ``facebook/sam3``; tests use a small
random configuration), so a family is built by :func:`concept_family`; ``SAM3_CONCEPT_FAMILY``
is the published model's. Shapes are per item, without Triton's batch dim; -1 is variable.
"""

from __future__ import annotations

from dataclasses import dataclass

from triton_sam.models.sam3 import GRID, MASK_SIZE, PIXEL_VALUES, PREPROCESSING
from triton_sam.models.spec import GraphSpec, Preprocessing, TensorSpec

# Sam3Processor pads every phrase to 32 tokens; CLIP's position table has 32 entries.
CONTEXT_LENGTH = 32
NUM_QUERIES = 200  # Sam3DETRDecoderConfig.num_queries
WIDTH = 256  # DETR / FPN / projected text width of facebook/sam3

FEATURE_NAMES = ("fpn_features.0", "fpn_features.1", "fpn_features.2")
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
TEXT_FEATURES = "text_features"
EXEMPLAR_BOXES = "exemplar_boxes"
EXEMPLAR_LABELS = "exemplar_labels"
EXEMPLAR_FEATURES = "exemplar_features"
PROMPT_FEATURES = "prompt_features"
PROMPT_MASK = "prompt_mask"
# The phrase Sam3Processor substitutes when boxes come without text (``_resolve_text_prompts``):
# Sam3Model always reads text tokens, so exemplar-only prompts carry this phrase's.
EXEMPLAR_ONLY_PHRASE = "visual"
THRESHOLD = "threshold"
MAX_INSTANCES = "max_instances"
SCORES = "scores"
BOXES = "boxes"
MASKS = "masks"
QUERY_INDEX = "query_index"
NUM_INSTANCES = "num_instances"
PRESENCE = "presence"


@dataclass(frozen=True)
class ConceptFamilySpec:
    """A concept family (text and exemplar prompts): four graphs behind one serving model.

    Attributes:
        family: short name, also the client's ``model_type`` (``"sam3_concept"``).
        preprocessing: image geometry (the SAM3 tracker's).
        vision / text / exemplar / decoder: the four graphs' contracts and default model
            names.
        serving_model: the python-backend model clients call (tokenises, caches, decodes,
            encodes masks); see ``triton_sam/serving/concept_model.py``.
        exporter: dotted module path of the exporter (imports torch; loaded lazily).
        width: FPN / DETR width (channels of the features, width of text features).
        num_queries: DETR queries, the most instances one phrase can give.
        context_length: tokens per phrase.
    """

    family: str
    preprocessing: Preprocessing
    vision: GraphSpec
    text: GraphSpec
    exemplar: GraphSpec
    decoder: GraphSpec
    serving_model: str
    exporter: str
    width: int
    num_queries: int
    context_length: int = CONTEXT_LENGTH

    @property
    def graphs(self) -> tuple[GraphSpec, ...]:
        """The four graphs in data order: vision, text, exemplar, decoder."""
        return (self.vision, self.text, self.exemplar, self.decoder)

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Names of the vision outputs, which the decoder takes as they are."""
        return tuple(t.name for t in self.vision.outputs)

    @property
    def mask_size(self) -> int:
        """Side of the low-resolution mask logits (288)."""
        return self.preprocessing.mask_size


def concept_family(
    *, width: int = WIDTH, num_queries: int = NUM_QUERIES, family: str = "sam3_concept"
) -> ConceptFamilySpec:
    """The concept family's contract for a model of FPN/DETR width ``width``.

    Args:
        width: FPN width = DETR width = projected text width (Sam3Model requires them equal).
        num_queries: DETR queries.
        family: family name; model names derive from it (``<family>_vision`` ...).
    """
    features = tuple(
        TensorSpec(name, "float32", (width, side, side))
        for name, side in zip(FEATURE_NAMES, (MASK_SIZE, 2 * GRID, GRID), strict=True)
    )
    tokens = (
        TensorSpec(INPUT_IDS, "int64", (CONTEXT_LENGTH,)),
        TensorSpec(ATTENTION_MASK, "int64", (CONTEXT_LENGTH,)),
    )
    exemplar_inputs = (
        features[2],
        TensorSpec(EXEMPLAR_BOXES, "float32", (-1, 4)),
        TensorSpec(EXEMPLAR_LABELS, "int64", (-1,)),
    )
    decoder_inputs = (
        *features,
        # N prompts per image: a per-item dim, so one request is one image with its prompts
        # and the dynamic batcher can still stack images. P tokens per prompt: 32 text tokens,
        # then exemplar tokens if any (P varies with the exemplars, so it is dynamic).
        TensorSpec(PROMPT_FEATURES, "float32", (-1, -1, width)),
        TensorSpec(PROMPT_MASK, "int64", (-1, -1)),
        TensorSpec(THRESHOLD, "float32", (1,)),
        TensorSpec(MAX_INSTANCES, "int64", (1,)),
    )
    # K = the most instances any phrase of the batch kept (at least 1): data-dependent.
    decoder_outputs = (
        TensorSpec(SCORES, "float32", (-1, -1)),
        TensorSpec(BOXES, "float32", (-1, -1, 4)),
        TensorSpec(MASKS, "float32", (-1, -1, MASK_SIZE, MASK_SIZE)),
        TensorSpec(QUERY_INDEX, "int64", (-1, -1)),
        TensorSpec(NUM_INSTANCES, "int64", (-1,)),
        TensorSpec(PRESENCE, "float32", (-1,)),
    )
    return ConceptFamilySpec(
        family=family,
        preprocessing=PREPROCESSING,
        # The vision and decoder graphs run once per image: served with the encoder's
        # bounds; the text graph once per phrase: the decoder's.
        vision=GraphSpec("vision", f"{family}_vision", (PIXEL_VALUES,), features, "encoder"),
        text=GraphSpec(
            "text",
            f"{family}_text",
            tokens,
            (TensorSpec(TEXT_FEATURES, "float32", (CONTEXT_LENGTH, width)),),
            "decoder",
        ),
        # Served one image per call (see the module docstring): its bounds are set by the
        # repository writer, not by a batching role.
        exemplar=GraphSpec(
            "exemplar",
            f"{family}_exemplar",
            exemplar_inputs,
            (TensorSpec(EXEMPLAR_FEATURES, "float32", (-1, width)),),
        ),
        decoder=GraphSpec(
            "decoder", f"{family}_decoder", decoder_inputs, decoder_outputs, "encoder"
        ),
        serving_model=family,
        exporter="triton_sam.export.sam3_concept",
        width=width,
        num_queries=num_queries,
    )


SAM3_CONCEPT_FAMILY = concept_family()
