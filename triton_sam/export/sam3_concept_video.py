"""``Sam3VideoModel`` (concept tracking in video) as the graphs our pipeline runs: the
detector's four concept graphs and the tracker's graphs.

Upstream runs the ViT once per frame and feeds it to both: the detector reads its own FPN
levels, the tracker reads ``tracker_neck`` (a second ``Sam3VisionNeck``) with the tracker mask
decoder's ``conv_s0`` / ``conv_s1`` on the two high-resolution levels
(``Sam3VideoModel.get_vision_features_for_tracker``). The tracker of a video model has no vision
encoder of its own (``remove_vision_encoder=True``).

Here the tracker is exported through the tracker family's exporter
(:func:`triton_sam.export.sam3_video.export_sam3_video`) from :func:`tracker_view`: a
``Sam3TrackerVideoModel`` whose vision encoder *is* the detector's ViT followed by
``tracker_neck``, so its encoder graph computes exactly ``get_vision_features_for_tracker`` (the
same modules in the same order; ``tests/export/test_sam3_concept_video_export.py`` checks it
bit for bit in torch). The detector is exported through the concept family's exporter
(:func:`triton_sam.export.concept_graphs.export_graphs`) from a model directory of
``detector_model`` (:func:`save_detector_checkpoint`). Each graph keeps its family's export
gate (ORT against torch, the family's principled tolerances).

The cost: the ViT runs twice per frame (once in each vision graph). The single shared vision
graph of the design note (``docs/concept-video.md``) removes that; the computation is the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from triton_sam.errors import CheckpointError
from triton_sam.export import ExportOptions

TRACKER_DIR = "tracker"
DETECTOR_DIR = "detector"


def tracker_view(video_model: nn.Module) -> nn.Module:
    """``Sam3TrackerVideoModel`` (eval) computing ``video_model``'s tracker on its shared ViT.

    Args:
        video_model: a ``Sam3VideoModel``.

    Returns:
        A tracker whose ``vision_encoder.backbone`` is the detector's ViT and whose
        ``vision_encoder.neck`` is ``tracker_neck`` (weights copied), every other weight the
        video model's tracker's.

    Raises:
        CheckpointError: a weight of the view left without a value (the two models' layouts
            differ from what this mapping expects).
    """
    from transformers import Sam3TrackerVideoConfig, Sam3TrackerVideoModel

    tracker_config = video_model.config.tracker_config.to_dict()
    vision_config = video_model.config.detector_config.vision_config.to_dict()
    # the tracker reads its feature sizes from its own vision config; the detector's ViT
    # gives the same grid (1008 / 14 = 72, upsampled x4 and x2)
    vision_config["backbone_feature_sizes"] = tracker_config["vision_config"][
        "backbone_feature_sizes"
    ]
    tracker_config["vision_config"] = vision_config
    view = Sam3TrackerVideoModel(Sam3TrackerVideoConfig(**tracker_config)).eval()
    state = {
        f"vision_encoder.backbone.{k}": v
        for k, v in video_model.detector_model.vision_encoder.backbone.state_dict().items()
    }
    neck = video_model.tracker_neck.state_dict()
    state |= {f"vision_encoder.neck.{k}": v for k, v in neck.items()}
    state |= video_model.tracker_model.state_dict()
    missing, unexpected = view.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"model: the tracker view of Sam3VideoModel lacks {sorted(missing)[:3]} and does "
            f"not take {sorted(unexpected)[:3]}; expected the ViT, tracker_neck and the tracker"
        )
    return view


def save_detector_checkpoint(video_model: nn.Module, path: Path, tokenizer: Any) -> Path:
    """Write ``video_model.detector_model`` as a ``Sam3Model`` directory with ``Sam3Processor``
    files (``tokenizer``), the layout the concept exporter reads.

    Raises:
        CheckpointError: ``path`` exists (never overwritten).
    """
    from transformers import Sam3ImageProcessor, Sam3Processor

    path = Path(path)
    if path.exists():
        raise CheckpointError(f"checkpoint: {path} already exists; not overwriting it")
    video_model.detector_model.save_pretrained(path)
    Sam3Processor(image_processor=Sam3ImageProcessor(), tokenizer=tokenizer).save_pretrained(path)
    return path


@dataclass
class ConceptVideoExport:
    """Where one export put its graphs.

    Attributes:
        tracker: the tracker's graphs and settings (``Sam3VideoExportResult``).
        detector: the concept graphs (``ConceptExportResult``).
        detector_spec: the concept variant the detector was exported as.
    """

    tracker: Any
    detector: Any
    detector_spec: Any


def export_concept_video(
    video_model: nn.Module,
    out_dir: Path,
    tokenizer: Any,
    options: ExportOptions | None = None,
) -> ConceptVideoExport:
    """Export ``video_model`` to ``out_dir/tracker`` (the tracker's graphs and
    ``tracker_config.json``) and ``out_dir/detector`` (the concept graphs and tokenizer).

    Args:
        video_model: a ``Sam3VideoModel`` in eval mode.
        out_dir: a directory (created).
        tokenizer: the CLIP tokenizer of the detector (the checkpoint's).
        options: as each family's exporter takes them.

    Raises:
        CheckpointError / ExportError / ExportValidationError: as the two exporters raise them.
    """
    from triton_sam.export.concept_graphs import export_graphs
    from triton_sam.export.sam3_concept import family_for_config
    from triton_sam.export.sam3_video import export_sam3_video
    from triton_sam.models.spec import Checkpoint, ModelSpec

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tracker = export_sam3_video(tracker_view(video_model), out_dir / TRACKER_DIR, options)
    family = family_for_config(video_model.config.detector_config)
    spec = ModelSpec(
        name="sam3_concept_video_detector",
        family=family,
        upstream_config="transformers.Sam3VideoConfig.detector_config",
        checkpoint=Checkpoint(url="", filename="detector"),
        params_m=0.0,
        description="the detector of a Sam3VideoModel",
    )
    checkpoint = save_detector_checkpoint(video_model, out_dir / "detector_checkpoint", tokenizer)
    detector = export_graphs(spec, checkpoint, out_dir / DETECTOR_DIR, options)
    return ConceptVideoExport(tracker, detector, spec)


__all__ = [
    "ConceptVideoExport",
    "export_concept_video",
    "save_detector_checkpoint",
    "tracker_view",
]
