"""The main job end to end on one machine: export -> repository -> embedded Triton -> masks.

Real weights when it can: a verified checkpoint already in ``checkpoints/``, else a download
(resumable, sha256-checked, with a progress bar). Offline it falls back to the official
config's random weights and says so loudly. Writes an overlay PNG and prints per-stage latency.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from triton_sam.client import SAM2TritonClient
from triton_sam.errors import CheckpointError, DownloadError, IntegrityError
from triton_sam.export import ExportOptions
from triton_sam.models.checkpoints import download_checkpoint, resolve_checkpoint
from triton_sam.models.registry import get_model
from triton_sam.models.spec import ModelSpec
from triton_sam.repository.config import RepositoryOptions
from triton_sam.repository.writer import embedded_repository
from triton_sam.server import EmbeddedTriton
from triton_sam.setup.pipeline import RepositoryBuild, build_repository
from triton_sam.tools.sample import sample_image

log = logging.getLogger(__name__)

_COLORS = np.array([[30, 144, 255], [255, 140, 0]], dtype=np.float32)


@dataclass
class DemoReport:
    """Figures of a demo run (printed by the CLI, asserted by the tests)."""

    model: str
    random_weights: bool
    overlay: Path
    stages_s: dict[str, float] = field(default_factory=dict)
    latency_ms: dict[str, float] = field(default_factory=dict)
    request_bytes: dict[str, int] = field(default_factory=dict)
    onnx_bytes: dict[str, int] = field(default_factory=dict)
    mask_fraction: dict[str, float] = field(default_factory=dict)


def run_demo(
    *,
    model: str = "sam2.1_hiera_tiny",
    checkpoints_dir: Path = Path("checkpoints"),
    work_dir: Path = Path(".demo"),
    output: Path = Path("outputs/demo_overlay.png"),
    image_path: Path | None = None,
    protocol: str = "http",
    download: bool = True,
) -> DemoReport:
    """Export ``model``, serve it with the embedded Triton, segment a click and a box.

    Args:
        model: registry name of the variant.
        checkpoints_dir: where a downloaded checkpoint would be.
        work_dir: where the demo's model repository is built (replaced on each run).
        output: overlay PNG path.
        image_path: image to segment (default: the built-in synthetic scene).
        protocol: ``"http"`` or ``"grpc"``.
        download: download the checkpoint when it is not in ``checkpoints_dir`` (falls
            back to random weights when that fails, e.g. offline).
    """
    stages: dict[str, float] = {}
    t0 = time.perf_counter()
    spec, repo, build = build_local_repository(model, checkpoints_dir, work_dir, download=download)
    stages["export+repository"] = time.perf_counter() - t0

    image = np.asarray(Image.open(image_path).convert("RGB")) if image_path else sample_image()
    h, w = image.shape[:2]
    click = dict(point_coords=[[0.3 * w, 0.42 * h]], point_labels=[1])
    box = dict(box=[0.55 * w, 0.3 * h, 0.85 * w, 0.8 * h])

    random_weights = build.checkpoint is None
    report = DemoReport(model, random_weights, output, stages, onnx_bytes=build.onnx_bytes)
    t0 = time.perf_counter()
    with EmbeddedTriton(repo, http_port=0, grpc_port=0, metrics_port=0) as server:
        stages["server start"] = time.perf_counter() - t0
        url = server.http_url if protocol == "http" else server.grpc_url
        with SAM2TritonClient(url, model_type=spec.family.family, protocol=protocol) as client:
            client.set_image(image)
            report.latency_ms.update(client.last_timings_ms)
            report.request_bytes["set_image"] = client.last_request_bytes
            masks = []
            for name, prompt in (("click", click), ("box", box)):
                m, _ = client.predict(**prompt)
                masks.append(m[0, 0] > 0)
                report.mask_fraction[name] = float(masks[-1].mean())
                for stage, ms in client.last_timings_ms.items():
                    report.latency_ms[f"{name} {stage}"] = ms
                report.request_bytes[f"predict ({name})"] = client.last_request_bytes
    write_overlay(image, masks, [click["point_coords"][0]], box["box"], output)
    return report


def build_local_repository(
    model: str | ModelSpec,
    checkpoints_dir: Path,
    work_dir: Path,
    *,
    download: bool = False,
    fuse_attention: bool = True,
    checkpoint: Path | None = None,
    everything: bool = False,
) -> tuple[ModelSpec, Path, RepositoryBuild]:
    """Export ``model`` into ``work_dir/model_repository`` (the production ``onnxruntime``
    target, as ``docker compose`` serves it) and return the repository the embedded server
    serves: its CPU twin on Triton's onnxruntime backend (``embedded_repository``).

    Uses the checkpoint :func:`demo_checkpoint` finds (downloading it when ``download``);
    otherwise the official config's random weights, with a loud warning; ``checkpoint``, a
    file of the variant's architecture, is exported instead when given (a benchmark that runs
    a reference in-process on the same weights). ``everything`` adds the segment-everything
    models, as ``setup`` writes them. ``fuse_attention`` as in
    :func:`~triton_sam.repository.writer.embedded_repository`.
    """
    spec = get_model(model) if isinstance(model, str) else model
    if checkpoint is None:
        checkpoint = demo_checkpoint(spec, checkpoints_dir, download=download)
    repo = work_dir / "model_repository"
    build = build_repository(
        spec,
        repo,
        checkpoint=checkpoint,
        random_init=checkpoint is None,
        export_options=ExportOptions(),
        repository_options=RepositoryOptions(),
        checkpoints_dir=checkpoints_dir,
        everything=everything,
    )
    return spec, embedded_repository(repo, fuse_attention=fuse_attention), build


def demo_checkpoint(
    spec: ModelSpec, checkpoints_dir: Path, *, download: bool, timeout_s: float = 15.0
) -> Path | None:
    """The verified checkpoint of ``spec`` for the demo, or None for random weights.

    A valid file in ``checkpoints_dir`` is used as is. Otherwise, with ``download``, it is
    downloaded (resumable, verified, progress bar); when that fails (offline, HTTP error,
    bad hash) the demo goes on with random weights and says why, loudly.
    """
    try:
        return resolve_checkpoint(spec.checkpoint, None, checkpoints_dir)
    except (CheckpointError, IntegrityError) as e:
        reason: Exception = e
    if download:
        log.info("downloading %s from %s (for real masks)", spec.name, spec.checkpoint.url)
        try:
            return download_checkpoint(spec.checkpoint, checkpoints_dir, timeout_s=timeout_s)
        except (DownloadError, IntegrityError, CheckpointError) as e:
            reason = e
    log.warning(
        "\n%s\n!! No usable checkpoint for %s (%s).\n!! Using RANDOM WEIGHTS from the "
        "official config: the pipeline is real, the masks are meaningless.\n!! For real "
        "masks: `triton-sam download %s` on a connected machine, then rerun.\n%s",
        "!" * 78,
        spec.name,
        reason,
        spec.name,
        "!" * 78,
    )
    return None


def write_overlay(
    image: np.ndarray,
    masks: list[np.ndarray],
    clicks: list[list[float]],
    box: list[float],
    path: Path,
) -> Path:
    """Blend binary masks over the image, mark clicks and the box, save a PNG atomically."""
    out = image.astype(np.float32)
    for i, mask in enumerate(masks):
        color = _COLORS[i % len(_COLORS)]
        out[mask] = 0.45 * out[mask] + 0.55 * color
    img = Image.fromarray(out.clip(0, 255).astype(np.uint8))
    from PIL import ImageDraw

    draw = ImageDraw.Draw(img)
    for x, y in clicks:
        draw.ellipse([x - 6, y - 6, x + 6, y + 6], fill=(0, 255, 0), outline=(0, 0, 0))
    draw.rectangle(box, outline=(255, 255, 255), width=3)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")
    img.save(tmp)
    tmp.replace(path)
    return path
