"""SAM1 family spec: geometry and tensor contract shared by ViT-B/L/H.

Ground truth is ``segment_anything.SamPredictor``: longest side resized to 1024 (PIL
bilinear on uint8), pixel mean/std on the 0-255 scale, zero padding bottom/right, one
256x64x64 image embedding, 256x256 low-resolution mask logits returned unclipped.

Mask outputs follow ``SamPredictor`` (``MaskDecoder.forward``), not the official ONNX
export (``segment_anything.utils.onnx.SamOnnxModel`` with ``return_single_mask=True``):

- ``masks`` / ``iou_predictions``: token 0, what ``predict(multimask_output=False)`` returns.
- ``multimask_masks`` / ``multimask_iou_predictions``: tokens 1-3, what
  ``predict(multimask_output=True)`` returns.

The official ONNX selection rule instead returns the best of tokens 1-3 when the prompt has
fewer than 3 points (counting the padding point) and token 0 otherwise. Users of SAM1 and
our parity tests are on the predictor's semantics, so that is what the graph
computes; a client that wants the ONNX rule has every token it needs (token 0 from
``masks``, tokens 1-3 from ``multimask_masks``).

Prompt layout is ``SamPredictor``'s (``PromptEncoder.forward``): clicks first, the padding
point (label -1) only when there is no box, box corners (labels 2/3) last.
"""

from __future__ import annotations

from triton_sam.models.spec import FamilySpec, Preprocessing, TensorSpec, mask_outputs, point_prompt

IMAGE_SIZE = 1024
MASK_SIZE = IMAGE_SIZE // 4
EMBEDDING = TensorSpec("image_embeddings", "float32", (256, IMAGE_SIZE // 16, IMAGE_SIZE // 16))

SAM1_FAMILY = FamilySpec(
    family="sam1",
    preprocessing=Preprocessing(
        image_size=IMAGE_SIZE,
        resize="longest_side",
        # segment_anything/build_sam.py: Sam(pixel_mean=..., pixel_std=...) on 0-255 pixels
        pixel_mean=(123.675, 116.28, 103.53),
        pixel_std=(58.395, 57.12, 57.375),
        pixel_scale=1.0,
        mask_size=MASK_SIZE,
        # SamPredictor returns low_res_masks unclipped (SAM2ImagePredictor clips to +-32).
        low_res_logit_limit=None,
    ),
    encoder_inputs=(TensorSpec("image", "float32", (3, IMAGE_SIZE, IMAGE_SIZE)),),
    encoder_outputs=(EMBEDDING,),
    # Points as (X, Y) in the 1024x1024 model input frame (after the longest-side resize):
    # clicks, then one padding point labelled -1 when there is no box, then box corners 2/3.
    decoder_inputs=(EMBEDDING, *point_prompt(MASK_SIZE)),
    # SamPredictor's single mask is token 0 (no selection rule, see the module docstring);
    # its multimask output, tokens 1-3.
    decoder_outputs=mask_outputs(MASK_SIZE),
    exporter="triton_sam.export.sam1",
    encoder_model="sam1_encoder",
    decoder_model="sam1_decoder",
    box_before_points=False,
    pad_with_box=False,
)
