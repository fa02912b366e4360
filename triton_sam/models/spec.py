"""Model specs: the single source of truth for sizes, tensor names, shapes and checkpoints.

A *family* (SAM1, SAM2.1, SAM3 tracker) fixes preprocessing and the encoder/decoder tensor
contract; a *variant* (e.g. ``sam2.1_hiera_tiny``) adds the checkpoint and the upstream
config. The exporter, the repository writer and the clients all read from here.

Shapes are per request item, without Triton's batch dimension; ``-1`` is a variable dim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

ResizeRule = Literal["square", "longest_side"]
ResizeDtype = Literal["float32", "uint8"]
CoordRule = Literal["divide_then_scale", "ratio"]
# How the client lays prompts out for the decoder (triton_sam.client.prompts):
# "point_list": point_coords/point_labels (boxes as corner points 2/3), mask_input,
#   has_mask_input -> masks/iou_predictions and multimask_masks/multimask_iou_predictions;
# "hf_points_boxes": transformers' SAM prompt tensors (input_points [B,1,N,2], input_labels
#   [B,1,N] int64, input_boxes [B,nb,4]) -> pred_masks/iou_scores, 3 masks always
#   (the onnx-community pre-exported graphs).
PromptLayout = Literal["point_list", "hf_points_boxes"]
# Which of the repository options' bounds a graph is served with (batch size, queue size and
# timeout): "encoder" for per-image graphs, "decoder" for per-prompt ones. None: the builder
# of the models that call the graph gives its bounds (the video graphs, the tracker's).
Batching = Literal["encoder", "decoder"]


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of an ONNX graph / Triton model.

    Attributes:
        name: tensor name, identical in the ONNX graph, config.pbtxt and client requests.
        dtype: numpy dtype name (``"float32"``, ``"int32"``...).
        shape: per-item shape without the batch dimension; ``-1`` marks a variable dim.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]


def point_prompt(mask_size: int) -> tuple[TensorSpec, ...]:
    """The decoder's prompt inputs in the ``"point_list"`` layout (see ``PromptLayout``), float32:
    ``point_coords`` [N, 2] (X, Y) in the model input frame, ``point_labels`` [N] (1 click,
    0 background, 2/3 box corners, -1 padding), ``mask_input`` [1, m, m] low-resolution
    logits and ``has_mask_input`` [1] (1.0 when ``mask_input`` is a real mask), ``m`` =
    ``mask_size``. Where box corners and the padding point go is the family's
    (``FamilySpec.box_before_points`` / ``pad_with_box``)."""
    return (
        TensorSpec("point_coords", "float32", (-1, 2)),
        TensorSpec("point_labels", "float32", (-1,)),
        TensorSpec("mask_input", "float32", (1, mask_size, mask_size)),
        TensorSpec("has_mask_input", "float32", (1,)),
    )


def mask_outputs(mask_size: int) -> tuple[TensorSpec, ...]:
    """The decoder's mask outputs in the ``"point_list"`` layout, float32 logits at
    ``mask_size``: the single-mask pair ``masks`` [1, m, m] / ``iou_predictions`` [1] and the
    multimask pair (tokens 1-3) ``multimask_masks`` [3, m, m] / ``multimask_iou_predictions``
    [3]. Which token the single mask is, is the family's (see its module)."""
    return (
        TensorSpec("masks", "float32", (1, mask_size, mask_size)),
        TensorSpec("iou_predictions", "float32", (1,)),
        TensorSpec("multimask_masks", "float32", (3, mask_size, mask_size)),
        TensorSpec("multimask_iou_predictions", "float32", (3,)),
    )


@dataclass(frozen=True)
class GraphSpec:
    """One ONNX graph of a family (a family is a declared list of them, see
    ``FamilySpec.graphs``); the repository renders and the exporter exports each the same way.

    Attributes:
        role: what the graph does in the family (``"encoder"``, ``"decoder"``, ``"vision"``,
            ``"text"``...); the exporter's ``wrap_<role>`` builds its torch module.
        model: default Triton model name.
        inputs / outputs: the tensor contract; the first dim of every tensor is Triton's
            batch dim and is not listed.
        batching: whose bounds in the repository options it is served with (see ``Batching``).
    """

    role: str
    model: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batching: Batching | None = None


@dataclass(frozen=True)
class Preprocessing:
    """How the client turns an RGB uint8 image into the encoder input.

    Attributes:
        image_size: side of the square encoder input (1024 for SAM1/SAM2, 1008 for SAM3).
        resize: ``"square"`` stretches to image_size x image_size (SAM2, SAM3);
            ``"longest_side"`` scales the longest side to image_size and zero-pads
            bottom/right (SAM1).
        pixel_mean: per-channel mean, on the scale given by ``pixel_scale``.
        pixel_std: per-channel std, same scale.
        pixel_scale: factor applied to uint8 pixels before normalising (1/255 when upstream
            normalises on [0, 1], 1.0 when it normalises on the 0-255 scale).
        mask_size: side of the decoder's low-resolution mask logits.
        low_res_logit_limit: the low-resolution logits a prediction returns (to pass back as
            ``mask_input``) are clipped to +-this, as the official predictor does (32 for
            SAM2ImagePredictor); None returns them unclipped (SamPredictor).
        resize_dtype: what the square resize runs on: ``"float32"`` pixels after scaling
            (SAM2Transforms) or the ``"uint8"`` image, rounded back to uint8 before
            normalising (transformers' image processors, e.g. Sam3ImageProcessor).
        coord_rule: how prompts map to the square input frame: ``"divide_then_scale"``
            (``x / w * S``, SAM2Transforms) or ``"ratio"`` (``x * (S / w)``, transformers'
            processors). Both in float32; they differ by float rounding only.
    """

    image_size: int
    resize: ResizeRule
    pixel_mean: tuple[float, float, float]
    pixel_std: tuple[float, float, float]
    pixel_scale: float
    mask_size: int
    low_res_logit_limit: float | None = None
    resize_dtype: ResizeDtype = "float32"
    coord_rule: CoordRule = "divide_then_scale"


@dataclass(frozen=True)
class Checkpoint:
    """Where a variant's weights come from and how to check them.

    Attributes:
        url: download URL.
        filename: file name under the checkpoints directory.
        sha256: published full sha256, or None when none is published (then the hash is
            recorded at first download and verified afterwards).
        sha256_prefix: published prefix of the sha256. (The hex in SAM1 file names, e.g.
            ``sam_vit_b_01ec64.pth``, is the start of the file's MD5, not of its sha256:
            SAM1 configs carry the full sha256 instead.)
        hf_repo: Hugging Face Hub repository holding the checkpoint (``facebook/sam3``); when
            set, the checkpoint is that repository's snapshot (a directory, fetched with
            ``huggingface_hub`` and its own integrity checks) and ``filename`` names the
            directory under the checkpoints dir.
    """

    url: str
    filename: str
    sha256: str | None = None
    sha256_prefix: str | None = None
    hf_repo: str | None = None


@dataclass(frozen=True)
class FamilySpec:
    """What every variant of a model family shares.

    Attributes:
        family: short name, also the client's ``model_type`` (``"sam2"``).
        preprocessing: image and mask geometry.
        encoder_inputs / encoder_outputs / decoder_inputs / decoder_outputs: the tensor
            contract of the two graphs. Every encoder output is also a decoder input.
        exporter: dotted module path of the exporter, imported lazily (it needs torch).
        encoder_model: default Triton model name of the encoder.
        decoder_model: default Triton model name of the decoder.
        box_before_points: where box corners (labels 2/3) go in ``point_coords``: first
            (SAM2ImagePredictor) or after the clicks (SAM1's official ONNX layout).
        pad_with_box: whether the padding point (label -1) is appended when a box is
            given (SAM2 always pads; SAM1 pads only prompts without a box).
        prompt_layout: how the client builds decoder inputs and reads its outputs (see
            ``PromptLayout``).
        alternates: other registered families that serve the same models under another
            tensor contract (e.g. a pre-exported ONNX pair); a client picks the one whose
            decoder inputs the server reports.
    """

    family: str
    preprocessing: Preprocessing
    encoder_inputs: tuple[TensorSpec, ...]
    encoder_outputs: tuple[TensorSpec, ...]
    decoder_inputs: tuple[TensorSpec, ...]
    decoder_outputs: tuple[TensorSpec, ...]
    exporter: str
    encoder_model: str
    decoder_model: str
    box_before_points: bool = True
    pad_with_box: bool = True
    prompt_layout: PromptLayout = "point_list"
    alternates: tuple[str, ...] = ()

    @property
    def graphs(self) -> tuple[GraphSpec, GraphSpec]:
        """The family's graphs in data order: encoder (per image), decoder (per prompt)."""
        return (
            GraphSpec(
                "encoder", self.encoder_model, self.encoder_inputs, self.encoder_outputs, "encoder"
            ),
            GraphSpec(
                "decoder", self.decoder_model, self.decoder_inputs, self.decoder_outputs, "decoder"
            ),
        )

    @property
    def embedding_names(self) -> tuple[str, ...]:
        """Names of the encoder outputs, which the client feeds back to the decoder."""
        return tuple(t.name for t in self.encoder_outputs)

    @property
    def session_model(self) -> str:
        """Default Triton model name of the server-side embedding session (``sam2_session``)."""
        return f"{self.family}_session"


@dataclass(frozen=True)
class ModelSpec:
    """One exportable variant of a family.

    Attributes:
        name: registry name (``"sam2.1_hiera_tiny"``).
        family: the family spec (a ``ConceptFamilySpec`` for text-prompted families, see
            ``registry.is_concept_family``).
        upstream_config: the official package's config for this variant.
        checkpoint: weights and their integrity data.
        params_m: parameter count in millions, for display.
        description: one line for ``--help`` and listings.
    """

    name: str
    family: FamilySpec
    upstream_config: str
    checkpoint: Checkpoint
    params_m: float = 0.0
    description: str = ""
    extra: dict[str, str] = field(default_factory=dict)
