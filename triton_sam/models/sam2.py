"""SAM2.1 family spec: geometry and tensor contract shared by tiny/small/base_plus/large.

Ground truth is ``sam2.sam2_image_predictor.SAM2ImagePredictor``: square resize to 1024,
ImageNet mean/std on [0, 1], three feature maps (``no_mem_embed`` already added to the
lowest-resolution one), 256x256 low-resolution mask logits.
"""

from __future__ import annotations

from triton_sam.models.spec import FamilySpec, Preprocessing, TensorSpec, mask_outputs, point_prompt

IMAGE_SIZE = 1024
MASK_SIZE = IMAGE_SIZE // 4
# The encoder's outputs, fed back to the decoder.
FEATURES = (
    TensorSpec("image_embed", "float32", (256, IMAGE_SIZE // 16, IMAGE_SIZE // 16)),
    TensorSpec("high_res_feats_0", "float32", (32, IMAGE_SIZE // 4, IMAGE_SIZE // 4)),
    TensorSpec("high_res_feats_1", "float32", (64, IMAGE_SIZE // 8, IMAGE_SIZE // 8)),
)

SAM2_FAMILY = FamilySpec(
    family="sam2",
    preprocessing=Preprocessing(
        image_size=IMAGE_SIZE,
        resize="square",
        pixel_mean=(0.485, 0.456, 0.406),
        pixel_std=(0.229, 0.224, 0.225),
        pixel_scale=1.0 / 255.0,
        mask_size=MASK_SIZE,
        # SAM2ImagePredictor clips the low-res logits it returns for refinement.
        low_res_logit_limit=32.0,
    ),
    encoder_inputs=(TensorSpec("image", "float32", (3, IMAGE_SIZE, IMAGE_SIZE)),),
    encoder_outputs=FEATURES,
    # Points as (X, Y) in the 1024x1024 model input frame; boxes as corner points labelled
    # 2/3 first, then clicks, then one padding point labelled -1 (as upstream pads).
    decoder_inputs=(*FEATURES, *point_prompt(MASK_SIZE)),
    # Single-mask output: token 0, or the best multimask token when token 0 is unstable
    # (SAM2's dynamic multimask via stability); multimask output: tokens 1-3. Both are
    # computed; a client asks for the pair it needs, so only those bytes cross the wire.
    decoder_outputs=mask_outputs(MASK_SIZE),
    exporter="triton_sam.export.sam2",
    encoder_model="sam2_encoder",
    decoder_model="sam2_decoder",
)
