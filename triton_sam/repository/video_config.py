"""The video models of a repository: the graph configs and the tracker model of a family
(SAM2.1: five graphs and ``sam2_tracker``; SAM3: four graphs and ``sam3_tracker``).

The graphs are declared ``GraphSpec``s (``models.sam2_video`` / ``models.sam3_video``) and
go through the same rendering and writing as every family's graphs (:func:`config.graph_config`,
:func:`writer.graph_artifacts`), with the tracker's bounds. The tracker is a python-backend
BLS model whose directory holds ``model.py`` (``serving/tracker_model.py``) and the
dependency-free ``triton_sam/serving`` modules it needs (protocol, tracking) as
``triton_sam_serving/``. Everything is written as one set (:func:`writer.write_models`): the
graphs and the tracker that calls them change together.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2

from triton_sam.errors import InputValidationError
from triton_sam.models import sam2_video, sam3_video
from triton_sam.repository.checks import check_int, check_model_name
from triton_sam.repository.config import (
    ModelConfig,
    RepositoryOptions,
    config_to_text,
    graph_config,
    model_kind,
    set_parameters,
    triton_dtype,
)
from triton_sam.repository.shipping import shipped_files
from triton_sam.repository.writer import (
    RUNNER_NAME,
    SERVING_DIR,
    SHIPPED_PACKAGE,
    ModelFiles,
    graph_artifacts,
    write_models,
)
from triton_sam.serving.protocol import tracker as protocol
from triton_sam.serving.tracking.config import TrackerConfig

TRACKER_SOURCE = SERVING_DIR / "tracker_model.py"
PACKAGE_DIR = SHIPPED_PACKAGE  # what tracker_model.py imports


def check_store_bounds(options: protocol.StoreBounds) -> None:
    """The session store's bounds of a model's options (the trackers' and concept video's).

    Raises:
        InputValidationError: a bound out of range, naming it.
    """
    for name in ("max_sessions", "max_frames", "max_session_bytes", "max_total_bytes"):
        check_int(name, getattr(options, name), minimum=1)
    check_int("feature_cache_frames", options.feature_cache_frames, minimum=1)
    for name in ("max_tenant_sessions", "max_tenant_bytes", "evict_idle_s"):
        check_int(name, getattr(options, name), minimum=0)
    if options.max_tenant_sessions > options.max_sessions:
        raise InputValidationError(
            "max_tenant_sessions",
            f"got {options.max_tenant_sessions}, expected at most max_sessions "
            f"({options.max_sessions}); 0 means max_sessions",
        )


@dataclass(frozen=True)
class TrackerOptions(protocol.StoreBounds):
    """Bounds of the tracker's sessions and batching of the video graphs.

    Who may evict whose session is the rule of ``serving/tracking/sessions.py``: only sessions
    idle for ``evict_idle_s``, the tenant's own first; otherwise the request is refused with
    ``Overloaded``.

    Attributes:
        max_sessions: sessions held at once.
        max_frames: frames one session may have.
        max_session_bytes: bytes one session may hold (frames as sent, cached features at
            16 MiB per frame, 0.75 MiB per object and tracked frame).
        max_total_bytes: bytes all sessions may hold.
        feature_cache_frames: encoded frames kept per session.
        max_tenant_sessions: sessions one tenant may hold (0 = max_sessions). With tokens on,
            set it below max_sessions so that no tenant can occupy every slot.
        max_tenant_bytes: bytes one tenant's sessions may hold (0 = max_total_bytes).
        evict_idle_s: seconds without a command before a session may be evicted to make room
            for another (0: any session but the one in use, the bounds' pure LRU).
        graph_max_batch_size: ``max_batch_size`` of the video graphs (objects or sessions
            batched by Triton when their shapes agree).
        graph_max_queue_size: requests a video graph's queue holds (0 = unbounded).
    """

    graph_max_batch_size: int = 4
    graph_max_queue_size: int = 64

    def __post_init__(self) -> None:
        check_store_bounds(self)
        check_int("graph_max_batch_size", self.graph_max_batch_size, minimum=1)
        check_int("graph_max_queue_size", self.graph_max_queue_size, minimum=0)


def build_tracker_config(
    options: RepositoryOptions,
    config: TrackerConfig,
    tracker: TrackerOptions | None = None,
    *,
    name: str = protocol.TRACKER_MODEL,
    graph_models: dict[str, str] | None = None,
) -> ModelConfig:
    """The tracker model's config: optional request tensors, one CPU instance, bounds."""
    tracker = tracker or TrackerOptions()
    check_model_name(name)
    # Requests are never batched together (each is one command), but max_batch_size > 0
    # with dynamic batching is what makes Triton drop a cancelled request still queued.
    model = ModelConfig(name=name, backend="python", max_batch_size=8)
    for tensor, dtype, dims in protocol.INPUTS:
        message = model_config_pb2.ModelInput(name=tensor, data_type=_dtype(dtype), dims=list(dims))
        message.optional = tensor not in protocol.REQUIRED_INPUTS
        model.input.append(message)
    for tensor, dtype, dims in protocol.output_tensors(config.mask_size):
        model.output.append(
            model_config_pb2.ModelOutput(name=tensor, data_type=_dtype(dtype), dims=list(dims))
        )
    # One instance, always: the sessions live in it (see tracker_model.py).
    model.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    model.dynamic_batching.max_queue_delay_microseconds = 0
    served = protocol.TrackerSettings(
        graph_models=_json(graph_models or protocol.DEFAULT_MODEL_NAMES),
        model_config=config.to_json(),
        **tracker.store_bounds(),
    )
    set_parameters(model, served, kind=protocol.KIND)
    return model


# family -> its declared video graphs
FAMILY_GRAPHS = {"sam2": sam2_video.video_graphs, "sam3": sam3_video.video_graphs}


def video_artifacts(
    graphs: dict[str, Path],
    config: TrackerConfig,
    options: RepositoryOptions,
    tracker: TrackerOptions | None = None,
    *,
    family: str = "sam2",
) -> list[ModelFiles]:
    """The family's graph models and its tracker, ready for :func:`writer.write_models`.

    Raises:
        RepositoryError / InputValidationError: as :func:`writer.graph_artifacts`; an
            unknown family.
    """
    tracker = tracker or TrackerOptions()
    if family not in FAMILY_GRAPHS:
        raise InputValidationError(
            "family", f"got {family!r}, expected one of {sorted(FAMILY_GRAPHS)}"
        )
    declared = FAMILY_GRAPHS[family]()
    configs = {
        g.role: graph_config(
            g,
            options,
            max_batch_size=tracker.graph_max_batch_size,
            max_queue_size=tracker.graph_max_queue_size,
        )
        for g in declared
    }
    artifacts = graph_artifacts(declared, graphs, options, configs=configs)
    model = build_tracker_config(
        options,
        config,
        tracker,
        name=protocol.FAMILY_MODELS[family][1],
        graph_models={g.role: g.model for g in declared},
    )
    artifacts.append(ModelFiles(model.name, config_to_text(model), tracker_files()))
    return artifacts


def tracker_files() -> dict[str, Path]:
    """The tracker's version directory: model.py and the tracking package."""
    return {RUNNER_NAME: TRACKER_SOURCE} | shipped_files(TRACKER_SOURCE)


def write_video_models(
    repo_dir: str | os.PathLike[str],
    graphs: dict[str, Path],
    config: TrackerConfig,
    options: RepositoryOptions,
    tracker: TrackerOptions | None = None,
    *,
    family: str = "sam2",
) -> list[str]:
    """Write the family's video graphs and its tracker into ``repo_dir`` as one atomic set."""
    artifacts = video_artifacts(graphs, config, options, tracker, family=family)
    return [p.name for p in write_models(repo_dir, artifacts)]


def is_tracker_config(config: ModelConfig) -> bool:
    """True for a tracker model's config (by the kind it declares)."""
    return model_kind(config) == protocol.KIND


def _dtype(dtype: str) -> int:
    name = "TYPE_STRING" if dtype == "bytes" else triton_dtype(dtype)
    return model_config_pb2.DataType.Value(name)


def _json(value: object) -> str:
    import json

    return json.dumps(value, sort_keys=True)
