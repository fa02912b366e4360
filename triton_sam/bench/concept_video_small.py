"""The seeded small ``Sam3VideoModel`` that ``bench concept-video`` runs without a checkpoint
(facebook/sam3 is gated, and its full ViT is beyond a CPU benchmark), and the thresholds at
which it finds objects. The parity tests of concept video run the same model.

The detector is :func:`triton_sam.export.sam3_concept.small_config` widened to the tracker's
256 channels, because ``Sam3VideoModel`` feeds the detector's ViT to the tracker through
``tracker_neck`` (built from the detector's vision config) and the tracker's memory attention
and mask decoder work at 256; its ViT is the tracker's small one (width 32, two layers), so
the shared ViT is as cheap as the tracker's own. The tracker is
:func:`triton_sam.export.sam3_video.small_config`, with the learnt embeddings upstream
initialises to zero given random values (as :func:`~triton_sam.export.sam3_video.random_model`
does, so a pipeline that forgets one differs).

Detector weights: :func:`~triton_sam.export.sam3_concept.rescale_weights`, then the scoring
projections' biases zeroed and the presence head's bias raised by 3. With the random queries
nearly parallel, the biases put every query's score logit at the same large value (all 200
queries above 0.5, one score); without them the queries' scores spread by about 0.01 to 0.02
and the presence ("cat": 0.8) scales them to just above 0.5. The thresholds of
:data:`SMALL_SETTINGS` lie between the measured scores.

Speed depends on the widths, not on the values of the weights: the small model's figures say
how the served loop compares with transformers' on the same model, not how fast SAM3 is.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from triton_sam.serving.concept_video.settings import ConceptVideoSettings

SMALL_SEED = 0
SMALL_PHRASE = "cat"  # the toy tokenizer's phrase the thresholds were measured with
TRACKER_WIDTH = 256
VIT_WIDTH = 32

# NMS off and no hole filling (fill_hole_area = 0 below): upstream without the ``kernels``
# package, as installed here, skips both (``nms_masks`` keeps every valid detection).
SMALL_SETTINGS = ConceptVideoSettings(
    use_nms=False,
    score_threshold_detection=0.575,
    new_det_thresh=0.575,
    high_conf_thresh=0.575,
    hotstart_delay=2,
    hotstart_unmatch_thresh=2,
    hotstart_dup_thresh=2,
    recondition_every_nth_frame=2,
)


def detector_config() -> Any:
    """``Sam3Config``: the concept small config at the tracker's width with its ViT."""
    from triton_sam.export import sam3_concept

    config = sam3_concept.small_config()
    config.vision_config.fpn_hidden_size = TRACKER_WIDTH
    for sub in (
        config.geometry_encoder_config,
        config.detr_encoder_config,
        config.detr_decoder_config,
        config.mask_decoder_config,
    ):
        sub.hidden_size = TRACKER_WIDTH
    config.text_config.projection_dim = TRACKER_WIDTH
    config.vision_config.backbone_config.hidden_size = VIT_WIDTH
    config.vision_config.backbone_config.intermediate_size = 2 * VIT_WIDTH
    return config


def video_config(settings: ConceptVideoSettings = SMALL_SETTINGS) -> Any:
    """``Sam3VideoConfig`` of :func:`detector_config` and the tracker's small config, with
    ``settings`` as its thresholds and no hole filling."""
    from transformers import Sam3VideoConfig

    from triton_sam.export import sam3_video

    thresholds = {k: v for k, v in asdict(settings).items() if k != "use_nms"}
    if not settings.use_nms:
        thresholds["det_nms_thresh"] = 0.0
    return Sam3VideoConfig(
        detector_config=detector_config().to_dict(),
        tracker_config=sam3_video.small_config().to_dict(),
        fill_hole_area=0,
        **thresholds,
    )


def small_video_model(
    seed: int = SMALL_SEED, settings: ConceptVideoSettings = SMALL_SETTINGS
) -> Any:
    """Seeded ``Sam3VideoModel`` (eval) with the weights of the module docstring."""
    import torch
    from transformers import Sam3VideoModel

    from triton_sam.export import sam3_concept

    torch.manual_seed(seed)
    model = Sam3VideoModel(video_config(settings)).eval()
    detector = model.detector_model
    sam3_concept.rescale_weights(detector, seed=seed)
    tracker = model.tracker_model
    with torch.no_grad():
        detector.dot_product_scoring.query_proj.bias.zero_()
        detector.dot_product_scoring.text_proj.bias.zero_()
        detector.detr_decoder.presence_head.layer3.bias.add_(3.0)
        for param in (
            tracker.no_memory_embedding,
            tracker.memory_temporal_positional_encoding,
            tracker.no_object_pointer,
            tracker.occlusion_spatial_embedding_parameter,
        ):
            param.normal_(std=0.5)
    return model


def small_processor() -> Any:
    """``Sam3VideoProcessor`` as facebook/sam3 configures it (1008 square, mean = std = 0.5),
    with the concept graphs' offline tokenizer."""
    from transformers import Sam2VideoVideoProcessor, Sam3ImageProcessor, Sam3VideoProcessor

    from triton_sam.export.sam3_concept import toy_tokenizer

    video = Sam2VideoVideoProcessor(
        size={"height": 1008, "width": 1008}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    return Sam3VideoProcessor(
        image_processor=Sam3ImageProcessor(), video_processor=video, tokenizer=toy_tokenizer()
    )
