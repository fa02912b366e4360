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

Run that way, the ViT runs twice per frame (once in each vision graph). :class:`SharedVision`
(:func:`export_shared_vision`) is the design note's single vision graph: both families'
levels from one ViT run, as upstream computes them.
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
SHARED_VISION_ROLE = "video_vision"


class SharedVision(nn.Module):
    """pixel_values [B,3,1008,1008] -> the detector's fpn_features.0/1/2 (as the concept
    ``vision`` graph) and the tracker's vision_feats / high_res_feats_0 / high_res_feats_1
    (as the tracker's ``video_encoder`` graph of :func:`tracker_view`), from one ViT run
    (``Sam3VideoModel``: ``get_vision_features`` then ``get_vision_features_for_tracker``).
    """

    def __init__(self, video_model: nn.Module) -> None:
        super().__init__()
        self.model = video_model

    def forward(self, pixel_values):
        vision = self.model.detector_model.get_vision_features(pixel_values=pixel_values)
        detector = tuple(vision.fpn_hidden_states[:-1])
        feats, _ = self.model.get_vision_features_for_tracker(vision)
        sizes = [f.shape[-2:] for f in detector]  # the tracker's levels have the same grids
        level0, level1, level2 = (
            f.permute(1, 2, 0).reshape(f.shape[1], f.shape[2], *size)
            for f, size in zip(feats, sizes, strict=True)
        )
        return (*detector, level2, level0, level1)


def shared_vision_graph(export: ConceptVideoExport) -> Any:
    """The ``GraphSpec`` of :class:`SharedVision`: the concept vision graph's input and
    outputs followed by the tracker encoder's outputs."""
    from triton_sam.models.sam3_video import video_graphs
    from triton_sam.models.spec import GraphSpec

    vision = next(g for g in export.detector_spec.family.graphs if g.role == "vision")
    encoder = next(g for g in video_graphs() if g.role == "video_encoder")
    return GraphSpec(
        SHARED_VISION_ROLE,
        "sam3_video_vision",
        vision.inputs,
        (*vision.outputs, *encoder.outputs),
        vision.batching,
    )


def export_shared_vision(
    video_model: nn.Module,
    export: ConceptVideoExport,
    options: ExportOptions | None = None,
    *,
    pixels: Any = None,
) -> tuple[Path, dict[str, float]]:
    """Trace :class:`SharedVision` to ``<export's dir>/video_vision.onnx`` and check it against
    torch with the fp32 tolerance the two graphs it replaces are checked with.

    Returns:
        (path, max |ORT - torch| per output).

    Raises:
        ExportValidationError: an output out of tolerance.
    """
    import numpy as np
    import torch

    from triton_sam.export import GraphExport, finish_graph, trace_graphs, verification

    options = options or ExportOptions()
    graph = shared_vision_graph(export)
    module = SharedVision(video_model).eval()
    if pixels is None:
        rng = np.random.default_rng(options.seed)
        pixels = rng.uniform(-1.0, 1.0, (1, 3, 1008, 1008)).astype(np.float32)
    feeds = {"pixel_values": pixels}
    with torch.no_grad():
        expected = module(torch.from_numpy(pixels))
    names = [t.name for t in graph.outputs]
    case = ("pixels", feeds, {n: t.numpy() for n, t in zip(names, expected, strict=True)})
    out_dir = Path(export.detector.graphs["vision"]).parent.parent
    seconds: dict[str, float] = {}
    paths = trace_graphs([GraphExport(graph, module, feeds)], out_dir, options, seconds)
    path = paths[SHARED_VISION_ROLE]
    finish_graph(path, graph, options)
    errors = verification.verify_graph(path, [case], verification.FP32_TOLERANCE)
    return path, errors


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
    "SharedVision",
    "export_shared_vision",
    "shared_vision_graph",
    "export_concept_video",
    "save_detector_checkpoint",
    "tracker_view",
]
