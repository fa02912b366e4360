"""Video propagation benchmark: frames per second of ``propagate_in_video`` through the
embedded Triton, against ``SAM2VideoPredictor`` in-process (PyTorch) and the same
orchestration on onnxruntime in-process, in one run; plus bytes on the wire per propagated
frame and what the server holds per session.

Every path runs the same scenario on the same synthetic clip: one click per object on frame 0,
then forward propagation over every frame (timed). Weights are random (SAM2.1-tiny's official
config): speed does not depend on them.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image


@dataclass
class PathResult:
    """One path's figures.

    Attributes:
        path: what ran (``upstream``, ``ort``, ``triton-grpc``, ``triton-http``).
        fps: propagated frames per second (median over repeats).
        seconds: each repeat's propagation time.
        bytes_up / bytes_down: per propagated frame, on the wire (Triton paths).
        upload_bytes: per frame, sending it to the server once (Triton paths).
        session_bytes: what the server holds for the session after propagation.
        frame_ms: each propagated frame's latency (ms), every repeat together; its
            percentiles are :meth:`percentile`.
    """

    path: str
    fps: float
    seconds: list[float] = field(default_factory=list)
    frame_ms: list[float] = field(default_factory=list)
    bytes_up: float | None = None
    bytes_down: float | None = None
    upload_bytes: float | None = None
    session_bytes: int | None = None

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0-100) of the frame latencies, in ms (NaN if none)."""
        return float(np.percentile(self.frame_ms, q)) if self.frame_ms else float("nan")


@dataclass
class VideoBenchReport:
    """Results of :func:`run_video_benchmark` and the setup they were measured with."""

    frames: int
    objects: int
    frame_hw: tuple[int, int]
    repeats: int
    results: list[PathResult]

    def ratio(self, path: str, baseline: str) -> float:
        """How many times slower ``path`` is than ``baseline`` (fps ratio; < 1: faster; NaN
        when the baseline was not measured)."""
        fps = {r.path: r.fps for r in self.results}
        return fps[baseline] / fps[path] if baseline in fps else float("nan")

    def markdown(self) -> str:
        """The report's table."""
        lines = [
            f"{self.frames} frames of {self.frame_hw[1]}x{self.frame_hw[0]}, {self.objects} "
            f"object(s), forward propagation, median of {self.repeats}; ratios are time per "
            "frame relative to the baseline (1.30 = 30 % slower)",
            "",
            "| path | frames/s | frame ms p50 | p90 | vs upstream | vs ORT in-process "
            "| up B/frame | down B/frame | frame upload B | server MiB/session |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in self.results:
            up = "" if r.bytes_up is None else f"{r.bytes_up:,.0f}"
            down = "" if r.bytes_down is None else f"{r.bytes_down:,.0f}"
            upload = "" if r.upload_bytes is None else f"{r.upload_bytes:,.0f}"
            held = "" if r.session_bytes is None else f"{r.session_bytes / 2**20:.1f}"
            lines.append(
                f"| {r.path} | {r.fps:.3f} | {r.percentile(50):.0f} | {r.percentile(90):.0f} | "
                f"{self.ratio(r.path, 'upstream'):.2f} | "
                f"{self.ratio(r.path, 'ort'):.2f} | {up} | {down} | {upload} | {held} |"
            )
        return "\n".join(lines)


def write_clip(folder: Path, frames: int, hw: tuple[int, int]) -> Path:
    """A synthetic clip of JPEG frames with ``objects`` discs moving across."""
    folder.mkdir(parents=True, exist_ok=True)
    height, width = hw
    yy, xx = np.mgrid[0:height, 0:width]
    for t in range(frames):
        image = np.full((height, width, 3), 40, np.uint8)
        for k, color in enumerate(((220, 60, 60), (60, 200, 90), (70, 90, 230))):
            cx, cy = width * (0.2 + 0.25 * k) + 2 * t, height * 0.5
            image[(xx - cx) ** 2 + (yy - cy) ** 2 < (min(hw) / 10) ** 2] = color
        Image.fromarray(image).save(folder / f"{t:05d}.jpg", quality=95)
    return folder


def clicks(hw: tuple[int, int], objects: int) -> list[tuple[int, list[float]]]:
    """(object id, click) per object: the centre of its disc on frame 0."""
    height, width = hw
    return [(k + 1, [width * (0.2 + 0.25 * k), height * 0.5]) for k in range(objects)]


def timed_frames(frames) -> list[float]:
    """Iterate ``frames`` (a propagation); each frame's latency in ms, in order."""
    latencies, last = [], time.perf_counter()
    for _ in frames:
        now = time.perf_counter()
        latencies.append(1000 * (now - last))
        last = now
    return latencies


def time_propagation(predictor, video, hw: tuple[int, int], objects: int) -> tuple[float, object]:
    """Prompt, then time a full forward propagation; returns ({seconds, frame_ms}, state)."""
    state = predictor.init_state(video)
    for obj_id, point in clicks(hw, objects):
        predictor.add_new_points_or_box(state, 0, obj_id, points=[point], labels=[1])
    frame_ms = timed_frames(predictor.propagate_in_video(state))
    return {"seconds": sum(frame_ms) / 1000, "frame_ms": frame_ms}, state


def run_video_benchmark(
    *,
    graphs_dir: Path,
    spec,
    urls: dict[str, str],
    work_dir: Path,
    frames: int = 8,
    objects: int = 1,
    hw: tuple[int, int] = (480, 640),
    repeats: int = 1,
    baselines: bool = True,
    upstream: object | None = None,
    tracker_model: str | None = None,
) -> VideoBenchReport:
    """Measure every path on the same clip (see the module docstring).

    Args:
        graphs_dir: the exported graphs (``export_video``'s folder) for the ORT path.
        spec: the variant, for the upstream predictor.
        urls: path label -> ``grpc://`` or ``http://`` URL of a server holding the same
            graphs and the tracker (e.g. ``{"triton-grpc": server.grpc_url}``).
        work_dir: where the clip is written.
        baselines: also measure upstream and ORT in-process (False: Triton paths only, to
            add another server's rows to a report).
        upstream: the upstream path (predictor-style calls); None: ``SAM2VideoPredictor``
            of ``spec`` (random weights). SAM3: ``bench.video_sam3.TransformersTracker``.
        tracker_model: the tracker model the Triton paths call (None: ``sam2_tracker``).
    """
    from triton_sam.bench.wire import ByteCountingProxy
    from triton_sam.client.video import SAM2VideoTritonClient
    from triton_sam.client.video_local import OnnxVideoPredictor
    from triton_sam.export.sam2_video import build_video_model

    clip = write_clip(work_dir / "clip", frames, hw)
    runners: dict[str, object] = {}
    if baselines:
        runners["upstream"] = upstream or _Upstream(build_video_model(spec, None))
        runners["ort"] = OnnxVideoPredictor(graphs_dir)
    proxies, clients = {}, {}
    try:
        for label, url in urls.items():
            protocol = "http" if url.startswith(("http://", "https://")) else "grpc"
            proxies[label] = ByteCountingProxy(url.split("://", 1)[-1])
            model = {"model": tracker_model} if tracker_model else {}
            clients[label] = SAM2VideoTritonClient(
                proxies[label].address, protocol=protocol, **model
            )
        samples: dict[str, list[dict[str, float]]] = {k: [] for k in [*runners, *urls]}
        # Round robin: a machine whose load drifts (shared CI) slows every path alike.
        for _ in range(repeats):
            for label, runner in runners.items():
                samples[label].append(time_propagation(runner, clip, hw, objects)[0])
            for label in urls:
                samples[label].append(
                    _triton_run(clients[label], proxies[label], clip, hw, objects)
                )
    finally:
        for client in clients.values():
            client.close()
        for proxy in proxies.values():
            proxy.close()
    results = []
    for label, runs in samples.items():
        seconds = [r["seconds"] for r in runs]
        frame_ms = [ms for r in runs for ms in r["frame_ms"]]
        result = PathResult(label, frames / statistics.median(seconds), seconds, frame_ms)
        if label in urls:
            result.bytes_up = statistics.median(r["up"] for r in runs)
            result.bytes_down = statistics.median(r["down"] for r in runs)
            result.upload_bytes = statistics.median(r["upload"] for r in runs)
            result.session_bytes = int(runs[-1]["held"])
        results.append(result)
    return VideoBenchReport(frames, objects, hw, repeats, results)


def _triton_run(client, proxy, clip: Path, hw: tuple[int, int], objects: int) -> dict[str, float]:
    """One timed propagation through Triton, with its bytes on the wire per frame."""
    before_init = proxy.snapshot()[0]
    state = client.init_state(clip)
    frames = state.num_frames
    for obj_id, point in clicks(hw, objects):
        client.add_new_points_or_box(state, 0, obj_id, points=[point], labels=[1])
    for t in range(frames):  # every frame on the server first: the timing is tracking only
        client._ensure_frame(state, t)
    sent, received = proxy.snapshot()
    frame_ms = timed_frames(client.propagate_in_video(state))
    time.sleep(0.05)  # the proxy's threads count the last bytes
    after = proxy.snapshot()
    held = client.session_info(state)["session"]["bytes"]
    client.close_state(state)
    return {
        "seconds": sum(frame_ms) / 1000,
        "frame_ms": frame_ms,
        "up": (after[0] - sent) / frames,
        "down": (after[1] - received) / frames,
        "upload": (sent - before_init) / frames,
        "held": held,
    }


def write_video_report(report: VideoBenchReport, out_dir: Path) -> dict[str, Path]:
    """``video_bench.json`` and ``video_bench.md`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "video_bench.json", "md": out_dir / "video_bench.md"}
    paths["json"].write_text(json.dumps(asdict(report), indent=2))
    paths["md"].write_text(report.markdown() + "\n")
    return paths


class _Upstream:
    """SAM2VideoPredictor with the in-process predictors' call signatures."""

    def __init__(self, model) -> None:
        self.model = model

    def init_state(self, video):
        return self.model.init_state(str(video))

    def add_new_points_or_box(self, *args, **kwargs):
        return self.model.add_new_points_or_box(*args, **kwargs)

    def propagate_in_video(self, state):
        yield from self.model.propagate_in_video(state)
