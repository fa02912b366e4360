"""``bench video`` end to end: a tracker's video graphs exported once (random weights; SAM3:
the seeded small config, see ``bench/video_sam3.py``), written with its tracker into a
python-target repository, served embedded, and
:func:`triton_sam.bench.video.run_video_benchmark` over it (gRPC and HTTP), against its
upstream (``SAM2VideoPredictor`` / transformers' ``Sam3TrackerVideoModel``) on the same weights.

``triton-sam bench video`` is this function with options; a notebook calls it directly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from triton_sam.bench.harness import embedded
from triton_sam.bench.video import VideoBenchReport, run_video_benchmark


def serve_and_bench_video(
    model: str,
    *,
    work_dir: Path,
    frames: int = 8,
    objects: int = 1,
    repeats: int = 1,
    progress: Callable[[str], None] = print,
) -> VideoBenchReport:
    """Export (once), serve and measure video propagation of ``model``.

    Args:
        model: a SAM2.1 variant or ``sam3_tracker``.
        work_dir: the graphs (``graphs/<model>``, reused) and the repository.
        frames / objects / repeats: the scenario of :func:`run_video_benchmark`.
        progress: told when the graphs are exported (the slow first run).

    Returns:
        The report of every path (Triton gRPC and HTTP, upstream, onnxruntime).
    """
    from triton_sam.export.sam2_video import GRAPH_KEYS, TRACKER_CONFIG_FILENAME, export_video
    from triton_sam.models import get_model
    from triton_sam.repository.config import RepositoryOptions
    from triton_sam.repository.video_config import write_video_models
    from triton_sam.serving.protocol import tracker as protocol
    from triton_sam.serving.tracking.config import TrackerConfig

    spec = get_model(model)
    family = spec.family.family
    graphs_dir = work_dir / "graphs" / spec.name
    if not (graphs_dir / TRACKER_CONFIG_FILENAME).is_file():
        progress(f"exporting {spec.name} (random weights) to {graphs_dir} ...")
    upstream = None
    if family == "sam3":  # the seeded small model, and transformers' loop on it
        from triton_sam.bench.video_sam3 import TransformersTracker, export_small

        upstream = TransformersTracker(export_small(graphs_dir))
        keys: tuple[str, ...] = protocol.SAM3_GRAPH_KEYS
    else:
        if not (graphs_dir / TRACKER_CONFIG_FILENAME).is_file():
            export_video(spec, None, graphs_dir)
        keys = GRAPH_KEYS
    graphs = {key: graphs_dir / f"{key}.onnx" for key in keys}
    config = TrackerConfig.from_json((graphs_dir / TRACKER_CONFIG_FILENAME).read_text())
    repo = work_dir / "model_repository" / family
    write_video_models(repo, graphs, config, RepositoryOptions(target="python"), family=family)
    with embedded(repo) as server:
        return run_video_benchmark(
            graphs_dir=graphs_dir,
            spec=spec,
            urls={"triton-grpc": server.grpc_url, "triton-http": server.http_url},
            work_dir=work_dir,
            frames=frames,
            objects=objects,
            repeats=repeats,
            upstream=upstream,
            tracker_model=protocol.FAMILY_MODELS[family][1],
        )
