"""``bench video`` end to end: the SAM2.1 video graphs exported once (random weights), written
with the tracker into a python-target repository, served embedded, and
:func:`triton_sam.bench.video.run_video_benchmark` over it (gRPC and HTTP).

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
        model: the SAM2.1 variant.
        work_dir: the graphs (``graphs/<model>``, reused) and the repository.
        frames / objects / repeats: the scenario of :func:`run_video_benchmark`.
        progress: told when the graphs are exported (the slow first run).

    Returns:
        The report of every path (Triton gRPC and HTTP, SAM2VideoPredictor, onnxruntime).
    """
    from triton_sam.export.sam2_video import GRAPH_KEYS, TRACKER_CONFIG_FILENAME, export_video
    from triton_sam.models import get_model
    from triton_sam.repository.config import RepositoryOptions
    from triton_sam.repository.video_config import write_video_models
    from triton_sam.serving.tracking.config import TrackerConfig

    spec = get_model(model)
    graphs_dir = work_dir / "graphs" / spec.name
    if not (graphs_dir / TRACKER_CONFIG_FILENAME).is_file():
        progress(f"exporting {spec.name} (random weights) to {graphs_dir} ...")
        export_video(spec, None, graphs_dir)
    graphs = {key: graphs_dir / f"{key}.onnx" for key in GRAPH_KEYS}
    config = TrackerConfig.from_json((graphs_dir / TRACKER_CONFIG_FILENAME).read_text())
    repo = work_dir / "model_repository"
    write_video_models(repo, graphs, config, RepositoryOptions(target="python"))
    with embedded(repo) as server:
        return run_video_benchmark(
            graphs_dir=graphs_dir,
            spec=spec,
            urls={"triton-grpc": server.grpc_url, "triton-http": server.http_url},
            work_dir=work_dir,
            frames=frames,
            objects=objects,
            repeats=repeats,
        )
