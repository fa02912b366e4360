"""Repository entries of concept tracking in video: the graphs ``sam3_concept_video`` calls
and the model itself.

The graphs come from one ``Sam3VideoModel`` export (:mod:`triton_sam.export.sam3_concept_video`)
and are served under names of their own, so they sit beside the image concept model's and
the standalone tracker's graphs (whose weights differ: the video model's tracker reads the
detector's ViT through ``tracker_neck``):

- ``sam3_concept_video_vision``: one ViT run per frame, the detector's three levels and the
  tracker's three (``SharedVision``);
- ``sam3_concept_video_text`` / ``_decoder``: the detector's text encoder and decoder;
- ``sam3_concept_video_exemplar``: the detector's geometry encoder (exemplar boxes on one
  frame's 72x72 level), one frame per call as ``sam3_concept_exemplar`` (upstream's
  ``roi_align`` call unrolls the traced batch);
- ``sam3_concept_video_tracker_<role>``: the SAM3 tracker's graphs of the video model
  (its ``video_encoder`` too, though one ViT run per frame means it never runs: the tracker
  steps refuse a session without it).

``sam3_concept_video`` (python backend, ``serving/concept_video_model.py``) is decoupled with no
batch dimension (one command per request), one ``KIND_CPU`` instance (its sessions live in
it). Its version directory holds ``model.py``, the dependency-free serving modules it imports
as ``triton_sam_serving`` and the detector's ``tokenizer.json``. Everything is written as one
atomic set (:func:`writer.write_models`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from triton_sam.models.sam3_video import video_graphs
from triton_sam.models.spec import GraphSpec, TensorSpec
from triton_sam.repository import config as cfg
from triton_sam.repository.checks import check_int
from triton_sam.repository.shipping import shipped_files
from triton_sam.repository.video_config import check_store_bounds
from triton_sam.repository.writer import SERVING_DIR, ModelFiles, graph_artifacts, write_models
from triton_sam.serving.concept_video.pipeline import MASK_HW, SHARED_VISION
from triton_sam.serving.protocol import concept as concept_protocol
from triton_sam.serving.protocol import concept_video as protocol
from triton_sam.serving.protocol import tracker as tracker_protocol

SERVING_SOURCE = SERVING_DIR / "concept_video_model.py"
DETECTOR_ROLES = ("text", "exemplar", "decoder")  # the vision graph is the shared one


@dataclass(frozen=True)
class ConceptVideoOptions(tracker_protocol.StoreBounds):
    """Bounds of ``sam3_concept_video``: the session store's (as the tracker's, see
    ``repository.video_config.TrackerOptions``), ``max_propagations``, the propagations
    streaming at once (each holds the service's lock one frame at a time), and the batching
    of the graphs that declare none (the tracker's: objects of one call, as the tracker's
    own graphs are configured)."""

    max_propagations: int = 1
    graph_max_batch_size: int = 4
    graph_max_queue_size: int = 64

    def __post_init__(self) -> None:
        check_store_bounds(self)
        check_int("max_propagations", self.max_propagations, minimum=1)
        check_int("graph_max_batch_size", self.graph_max_batch_size, minimum=1)
        check_int("graph_max_queue_size", self.graph_max_queue_size, minimum=0)


def served_graphs(export: Any) -> tuple[list[GraphSpec], dict[str, Path]]:
    """The graphs to serve under this model's names, and role -> ``.onnx``.

    Args:
        export: a ``ConceptVideoExport`` with its shared vision graph exported.
    """
    from triton_sam.export.sam3_concept_video import shared_vision_graph

    detector = {g.role: g for g in export.detector_spec.family.graphs}
    graphs = [replace(shared_vision_graph(export), model=f"{protocol.MODEL}_vision")]
    graphs += [replace(detector[r], model=f"{protocol.MODEL}_{r}") for r in DETECTOR_ROLES]
    graphs += [
        replace(g, role=f"tracker.{g.role}", model=f"{protocol.MODEL}_tracker_{g.role}")
        for g in video_graphs()
    ]
    vision_dir = Path(export.detector.graphs["vision"]).parent.parent
    onnx = {SHARED_VISION: vision_dir / f"{SHARED_VISION}.onnx"}
    onnx |= {r: Path(export.detector.graphs[r]) for r in DETECTOR_ROLES}
    onnx |= {f"tracker.{k}": Path(v) for k, v in export.tracker.graphs.items()}
    return graphs, onnx


def build_serving_config(
    graphs: list[GraphSpec],
    tracker_config_json: str,
    pad_token_id: int,
    options: ConceptVideoOptions | None = None,
) -> cfg.ModelConfig:
    """The ``sam3_concept_video`` config: decoupled, every input optional, BLS parameters."""
    options = options or ConceptVideoOptions()
    config = cfg.ModelConfig(name=protocol.MODEL, backend="python", max_batch_size=0)
    config.model_transaction_policy.decoupled = True
    inputs = (
        TensorSpec(protocol.COMMAND, "bytes", (1,)),
        TensorSpec(protocol.SESSION_ID, "bytes", (1,)),
        TensorSpec(protocol.NUM_FRAMES, "int32", (1,)),
        TensorSpec(protocol.VIDEO_HW, "int32", (2,)),
        TensorSpec(protocol.FRAME_INDEX, "int32", (1,)),
        TensorSpec(protocol.FRAME, "uint8", (-1, -1, -1)),
        TensorSpec(protocol.FRAME_BYTES, "bytes", (1,)),
        TensorSpec(protocol.TEXT, "bytes", (-1,)),
        TensorSpec(protocol.EXEMPLAR_BOXES, "float32", (-1, 4)),
        TensorSpec(protocol.EXEMPLAR_LABELS, "int32", (-1,)),
        TensorSpec(protocol.START_FRAME, "int32", (1,)),
        TensorSpec(protocol.MAX_FRAMES, "int32", (1,)),
        TensorSpec(protocol.REVERSE, "bool", (1,)),
        TensorSpec(protocol.SETTINGS, "bytes", (1,)),
        TensorSpec(protocol.MASK_FORMAT, "bytes", (1,)),
    )
    for spec in inputs:
        message = _io(spec, cfg.model_config_pb2.ModelInput)
        message.optional = spec.name != protocol.COMMAND
        config.input.append(message)
    size = MASK_HW[0]  # the low-resolution logits of mask_format "logits"
    outputs = (
        TensorSpec(protocol.OUT_SESSION_ID, "bytes", (1,)),
        TensorSpec(protocol.OUT_STATUS, "bytes", (1,)),
        TensorSpec(protocol.OUT_PROMPT_IDS, "int32", (-1,)),
        TensorSpec(protocol.FRAME_INDEX, "int32", (1,)),
        TensorSpec(protocol.OBJECT_IDS, "int32", (-1,)),
        TensorSpec(protocol.PROMPT_IDS, "int32", (-1,)),
        TensorSpec(protocol.SCORES, "float32", (-1,)),
        TensorSpec(protocol.TRACKER_SCORES, "float32", (-1,)),
        TensorSpec(protocol.BOXES, "float32", (-1, 4)),
        TensorSpec(protocol.MASKS_RLE, "bytes", (-1,)),
        TensorSpec(protocol.MASKS_LOGITS, "float32", (-1, size, size)),
        TensorSpec(protocol.REMOVED_OBJECT_IDS, "int32", (-1,)),
        TensorSpec(protocol.PROGRESS, "int32", (2,)),
        TensorSpec(protocol.FRAMES_ANSWERED, "int32", (1,)),
    )
    config.output.extend(_io(t, cfg.model_config_pb2.ModelOutput) for t in outputs)
    config.instance_group.add(kind=cfg.model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    by_role = {g.role: g.model for g in graphs}
    detector = {r: by_role[r] for r in (SHARED_VISION, *DETECTOR_ROLES)}
    tracker = {r.split(".", 1)[1]: m for r, m in by_role.items() if r.startswith("tracker.")}
    served = protocol.ConceptVideoServing(
        detector_models=json.dumps(detector, sort_keys=True),
        tracker_models=json.dumps(tracker, sort_keys=True),
        model_config=tracker_config_json,
        pad_token_id=int(pad_token_id),
        max_propagations=options.max_propagations,
        **options.store_bounds(),
    )
    cfg.set_parameters(config, served, kind=protocol.KIND)
    return config


def concept_video_artifacts(
    export: Any, options: cfg.RepositoryOptions, serving: ConceptVideoOptions | None = None
) -> list[ModelFiles]:
    """The graphs and ``sam3_concept_video`` as artifacts of one build.

    Raises:
        RepositoryError / InputValidationError: as ``writer.graph_artifacts``.
    """
    serving = serving or ConceptVideoOptions()
    graphs, onnx = served_graphs(export)
    bounds = {
        "max_batch_size": serving.graph_max_batch_size,
        "max_queue_size": serving.graph_max_queue_size,
    }
    one_frame = {"max_batch_size": 1, "max_queue_size": serving.graph_max_queue_size}
    configs = {
        g.role: cfg.graph_config(g, options, **(one_frame if g.role == "exemplar" else bounds))
        for g in graphs
        if not g.batching
    }
    models = graph_artifacts(graphs, onnx, options, configs=configs)
    config = build_serving_config(
        graphs, export.tracker.tracker_config.to_json(), export.detector.pad_token_id, serving
    )
    files = {"model.py": SERVING_SOURCE, concept_protocol.TOKENIZER_FILE: export.detector.tokenizer}
    files |= shipped_files(SERVING_SOURCE)
    models.append(ModelFiles(config.name, cfg.config_to_text(config), files))
    return models


def write_concept_video_models(
    repo_dir: str | os.PathLike[str],
    export: Any,
    options: cfg.RepositoryOptions,
    serving: ConceptVideoOptions | None = None,
) -> list[str]:
    """Write :func:`concept_video_artifacts` as one atomic set; the model names written."""
    artifacts = concept_video_artifacts(export, options, serving)
    return [path.name for path in write_models(repo_dir, artifacts)]


def _io(spec: TensorSpec, message: type) -> object:
    # BYTES tensors are Triton's TYPE_STRING (numpy object arrays of bytes).
    types = {"bytes": "TYPE_STRING", "bool": "TYPE_BOOL"}
    if spec.dtype in types:
        data_type = cfg.model_config_pb2.DataType.Value(types[spec.dtype])
        return message(name=spec.name, data_type=data_type, dims=list(spec.shape))
    return cfg.tensor_message(spec, message)
