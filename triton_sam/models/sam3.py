"""SAM3 tracker family specs: geometry and the two tensor contracts it is served under.

Ground truth is transformers' ``Sam3TrackerModel`` with ``Sam3TrackerProcessor``
(``Sam3ImageProcessor``):

- preprocessing: the uint8 image resized to 1008x1008 (torchvision bilinear, antialiased, on
  uint8, rounded back to uint8), then ``(x - 127.5) / 127.5``: mean/std 0.5 on [0, 1], written
  on the 0-255 scale because the processor fuses rescale and normalise exactly so;
  prompts scaled by ``x * (1008 / w)`` in float32.
- encoder = ``get_image_embeddings``: three feature levels [B,32,288,288], [B,64,144,144],
  [B,256,72,72] (``conv_s0``/``conv_s1`` applied, ``no_memory_embedding`` added as upstream
  adds it).
- decoder: 288x288 low-resolution logits, returned unclipped (``pred_masks``); single-mask
  output = token 0 or, when unstable, the best of tokens 1-3 (dynamic multimask via
  stability); multimask output = tokens 1-3; plus the object score logit.

Two contracts:

- ``SAM3_FAMILY`` (``model_type="sam3"``): our own export (``triton_sam.export.sam3``), the
  same point-list decoder contract as SAM2, with ``mask_input`` and both output selections.
  Prompt layout is transformers': clicks first, then box corners (labels 2/3), then one
  padding point (label -1), always.
- ``SAM3_ONNX_COMMUNITY_FAMILY``: the pre-exported pair published as
  ``onnx-community/sam3-tracker-ONNX`` (``vision_encoder.onnx``,
  ``prompt_encoder_mask_decoder.onnx``), imported as is. Its encoder contract equals ours; its
  decoder takes transformers' prompt tensors, has no mask input and always returns the three
  multimask outputs, so single-mask predictions pick the highest-scoring of the three (as
  that export's users do) instead of token 0.

Both are served under the same Triton model names, so a client asking for ``"sam3"`` reads
the decoder's inputs from the server and uses the matching one (``FamilySpec.alternates``).
Text prompts (SAM3's concept segmentation) would be another family of this module.
"""

from __future__ import annotations

from dataclasses import replace

from triton_sam.models.spec import FamilySpec, Preprocessing, TensorSpec, mask_outputs, point_prompt

IMAGE_SIZE = 1008
PATCH_SIZE = 14
GRID = IMAGE_SIZE // PATCH_SIZE  # 72: the ViT token grid and the lowest feature level
MASK_SIZE = 4 * GRID  # 288

PREPROCESSING = Preprocessing(
    image_size=IMAGE_SIZE,
    resize="square",
    # Sam3ImageProcessor: mean = std = 0.5 with rescale 1/255, fused into (x - 127.5) / 127.5.
    pixel_mean=(127.5, 127.5, 127.5),
    pixel_std=(127.5, 127.5, 127.5),
    pixel_scale=1.0,
    mask_size=MASK_SIZE,
    # transformers returns pred_masks unclipped and takes them back as input_masks.
    low_res_logit_limit=None,
    resize_dtype="uint8",
    coord_rule="ratio",
)

PIXEL_VALUES = TensorSpec("pixel_values", "float32", (3, IMAGE_SIZE, IMAGE_SIZE))
# Names as in the onnx-community export (and transformers.js), so encoders are interchangeable.
EMBEDDINGS = (
    TensorSpec("image_embeddings.0", "float32", (32, MASK_SIZE, MASK_SIZE)),
    TensorSpec("image_embeddings.1", "float32", (64, 2 * GRID, 2 * GRID)),
    TensorSpec("image_embeddings.2", "float32", (256, GRID, GRID)),
)

SAM3_FAMILY = FamilySpec(
    family="sam3",
    preprocessing=PREPROCESSING,
    encoder_inputs=(PIXEL_VALUES,),
    encoder_outputs=EMBEDDINGS,
    # Points as (X, Y) in the 1008x1008 input frame: clicks, box corners (labels 2/3), then
    # one padding point labelled -1, as Sam3TrackerPromptEncoder lays them out.
    decoder_inputs=(*EMBEDDINGS, *point_prompt(MASK_SIZE)),
    decoder_outputs=(
        *mask_outputs(MASK_SIZE),
        TensorSpec("object_score_logits", "float32", (1,)),
    ),
    exporter="triton_sam.export.sam3",
    encoder_model="sam3_encoder",
    decoder_model="sam3_decoder",
    box_before_points=False,
    pad_with_box=True,
    alternates=("sam3_onnx_community",),
)

# The same encoder, model names and prompt rules as SAM3_FAMILY; another decoder contract.
SAM3_ONNX_COMMUNITY_FAMILY = replace(
    SAM3_FAMILY,
    family="sam3_onnx_community",
    decoder_inputs=(
        # [B, point_batch=1, N, 2] (X, Y) clicks in the input frame; the graph pads.
        TensorSpec("input_points", "float32", (-1, -1, 2)),
        TensorSpec("input_labels", "int64", (-1, -1)),
        # [B, nb, 4] (X0, Y0, X1, Y1) in the input frame, nb = 0 or 1.
        TensorSpec("input_boxes", "float32", (-1, 4)),
        *EMBEDDINGS,
    ),
    decoder_outputs=(
        TensorSpec("iou_scores", "float32", (-1, 3)),
        TensorSpec("pred_masks", "float32", (-1, 3, MASK_SIZE, MASK_SIZE)),
        TensorSpec("object_score_logits", "float32", (-1, 1)),
    ),
    prompt_layout="hf_points_boxes",
    alternates=("sam3",),
)

# The files of the onnx-community layout, as published in onnx-community/sam3-tracker-ONNX.
ONNX_COMMUNITY_REPO = "onnx-community/sam3-tracker-ONNX"
ONNX_COMMUNITY_ENCODER = "vision_encoder.onnx"
ONNX_COMMUNITY_DECODER = "prompt_encoder_mask_decoder.onnx"
