"""Video and 3-D stacks: ``setup-video`` (the SAM2.1 video graphs and the tracker model),
``track`` (objects through a clip from a few clicks) and ``bench video``.

The export pipeline, the server and the benchmarks are imported inside the commands:
``triton-sam --help`` must not load them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from tqdm import tqdm

from triton_sam.bench.harness import embedded, protocol_url
from triton_sam.cli.app import app, bench_app
from triton_sam.cli.options import (
    DEFAULT_MODEL,
    ModelArg,
    OverridesArg,
    Protocol,
    ProtocolOpt,
    RandomInitOpt,
    ReportDirOpt,
    RepositoryOpt,
    TargetOpt,
    VariantOpt,
    WorkDirOpt,
    echo_report,
)
from triton_sam.cli.setup import export_plan
from triton_sam.client.track import parse_box, parse_click, track_video
from triton_sam.client.video import SAM2VideoTritonClient
from triton_sam.client.video_source import open_video


@app.command("setup-video", short_help="Export a video tracker's graphs and its tracker model.")
def setup_video_cmd(
    model: ModelArg,
    overrides: OverridesArg = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            help="SAM2.1 checkpoint file (checked against the variant's architecture) or, for "
            "sam3_tracker and sam3_concept_video, a Hugging Face model directory (the "
            "facebook/sam3 snapshot). "
            "Default: the downloaded, hash-verified one."
        ),
    ] = None,
    random_init: RandomInitOpt = False,
    target: TargetOpt = None,
    repository: RepositoryOpt = None,
) -> None:
    """Export the video graphs (verified against torch) and write them with the tracker model
    into the repository (next to the image models): SAM2.1 variants as sam2_tracker,
    sam3_tracker (transformers' Sam3TrackerVideoModel) as sam3_tracker.

    A fine-tuned checkpoint: `triton-sam setup-video sam2.1_hiera_tiny --checkpoint
    my_finetuned.pt` (the variant must be the architecture it was fine-tuned from).
    """
    from triton_sam.serving.protocol import concept_video

    if model == concept_video.MODEL:
        _setup_concept_video(checkpoint, random_init=random_init, repository=repository)
        return
    from triton_sam.setup.pipeline import build_video_repository

    plan = export_plan(
        model, overrides, checkpoint, random_init=random_init, target=target, repository=repository
    )
    repo = plan.repository
    build = build_video_repository(plan.spec, repo, **plan.build_args)
    for name in build.models:
        typer.echo(f"wrote {repo / name}")
    worst = max(build.max_abs_error.values(), default=float("nan"))
    typer.echo(f"onnxruntime vs torch max abs error over the graphs: {worst:.1e}")
    typer.echo("next: `triton-sam serve`, then `triton-sam track VIDEO --click x,y --out DIR`")


def _setup_concept_video(checkpoint: Path | None, *, random_init: bool, repository: Path | None):
    """``setup-video sam3_concept_video``: a Sam3VideoModel directory (the given one, or the
    facebook/sam3 snapshot the SAM3 tracker downloads: one checkpoint holds both) exported
    and written."""
    from triton_sam.errors import InputValidationError
    from triton_sam.setup.concept_video import build_concept_video_repository, load_checkpoint

    if random_init:
        raise InputValidationError(
            "--random-init",
            "sam3_concept_video ships no random-init variant (a random detector finds nothing "
            "to track); give --checkpoint DIR or none to download facebook/sam3",
        )
    if checkpoint is None:
        plan = export_plan("sam3_tracker", None, None, random_init=False, target=None,
                           repository=repository)  # fmt: skip
        checkpoint = plan.build_args["checkpoint"]
    repo = repository or Path("model_repository")
    video_model, tokenizer = load_checkpoint(checkpoint)
    build = build_concept_video_repository(repo, video_model, tokenizer)
    for name in build.models:
        typer.echo(f"wrote {repo / name}")
    typer.echo("next: `triton-sam serve`, then SAM3ConceptVideoClient over gRPC")


@app.command("track", short_help="Track clicks or a phrase through a video or 3-D stack.")
def track_cmd(
    video: Annotated[
        Path, typer.Argument(help="Folder of frames, mp4, multi-page TIFF stack or .npy volume.")
    ],
    click: Annotated[
        list[str] | None, typer.Option("--click", help="x,y[,frame][,obj] (repeatable).")
    ] = None,
    box: Annotated[
        list[str] | None, typer.Option("--box", help="x0,y0,x1,y1[,frame][,obj] (repeatable).")
    ] = None,
    phrase: Annotated[
        list[str] | None,
        typer.Option("--phrase", help="A concept to find and track (SAM3; repeatable)."),
    ] = None,
    settings: Annotated[
        str | None,
        typer.Option(
            help='With --phrase: settings to override as JSON, e.g. {"new_det_thresh": 0.8}.'
        ),
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("outputs/track"),
    url: Annotated[
        str | None, typer.Option(help="Triton server (default: an embedded one over --repository).")
    ] = None,
    protocol: ProtocolOpt = Protocol.grpc,
    direction: Annotated[str, typer.Option(help="both | forward | reverse.")] = "both",
    tracker: Annotated[
        str, typer.Option(help="Served tracker: sam2_tracker (SAM2.1) or sam3_tracker (SAM3).")
    ] = "sam2_tracker",
    repository: RepositoryOpt = None,
) -> None:
    """Segment objects through a video or a 3-D stack from a few clicks: label PNGs per frame,
    or one label TIFF stack for a volume. With --phrase, every instance of the concept instead
    (sam3_concept_video, gRPC): concepts.json (COCO RLE per frame) and labels.ome.zarr."""
    if phrase:
        if click or box:
            raise typer.BadParameter("clicks/boxes or phrases, not both", param_hint="--phrase")
        _track_concepts(video, phrase, out, url, repository, _settings(settings))
        return
    prompts = [parse_click(c) for c in click or []] + [parse_box(b) for b in box or []]
    source = np.load(video) if video.suffix == ".npy" else video
    total = open_video(source).num_frames

    def run(target: str) -> None:
        with (
            SAM2VideoTritonClient(target, protocol=protocol, model=tracker) as client,
            tqdm(total=total, unit="frame", desc="tracking") as bar,
        ):
            result = track_video(
                client, source, prompts, out, direction=direction, progress=bar.update
            )
        shares = ", ".join(f"object {o}: {f:.1%}" for o, f in result.foreground.items())
        typer.echo(f"{result.frames} frames, {shares}")
        typer.echo(
            "wrote "
            + (str(result.paths[0].parent) if len(result.paths) > 1 else str(result.paths[0]))
        )

    if url:
        run(url)
        return
    from triton_sam.repository.writer import embedded_repository

    with embedded(embedded_repository(repository or Path("model_repository"))) as server:
        run(protocol_url(server, protocol))


def _settings(text: str | None) -> dict | None:
    """``--settings`` as a JSON object (the server checks each field and its bounds)."""
    import json

    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise typer.BadParameter(f"not JSON ({e})", param_hint="--settings") from e
    if not isinstance(value, dict):
        raise typer.BadParameter("expected a JSON object", param_hint="--settings")
    return value


def _track_concepts(
    video: Path,
    phrases: list[str],
    out: Path,
    url: str | None,
    repository: Path | None,
    settings: dict | None,
) -> None:
    """``track --phrase``: the concept video model over gRPC (it streams; HTTP refuses it)."""
    from triton_sam.client.concept_video import SAM3ConceptVideoClient
    from triton_sam.client.track_concepts import track_concepts

    source = np.load(video) if video.suffix == ".npy" else video

    def run(target: str) -> None:
        with (
            SAM3ConceptVideoClient(target) as client,
            tqdm(unit="frame", desc="finding and tracking") as bar,
        ):

            def progress(done: int, total: int) -> None:
                bar.total = total
                bar.update(done - bar.n)

            result = track_concepts(
                client, source, phrases, out, settings=settings, progress=progress
            )
        found = ", ".join(f"{p!r}: {len(ids)} object(s)" for p, ids in result.objects.items())
        typer.echo(f"{result.frames} frames, {found}")
        typer.echo("wrote " + ", ".join(str(p) for p in result.paths))

    if url:
        run(url)
        return
    from triton_sam.repository.writer import embedded_repository

    with embedded(embedded_repository(repository or Path("model_repository"))) as server:
        run(server.grpc_url)


@bench_app.command("video", short_help="Frames/s of video propagation vs the upstream tracker.")
def bench_video_cmd(
    model: VariantOpt = DEFAULT_MODEL,
    frames: Annotated[int, typer.Option(min=2, help="Frames propagated.")] = 8,
    objects: Annotated[int, typer.Option(min=1, max=3, help="Objects tracked.")] = 1,
    repeats: Annotated[int, typer.Option(min=1, help="Timed propagations per path.")] = 1,
    output: ReportDirOpt = Path("outputs/bench"),
    work_dir: WorkDirOpt = Path(".bench_video"),
) -> None:
    """Frames/s of video propagation: embedded Triton (gRPC, HTTP) vs the upstream tracker
    (SAM2VideoPredictor; for sam3_tracker transformers' Sam3TrackerVideoModel on the seeded
    small config) and onnxruntime in-process, one run; per-frame latency percentiles; bytes
    per propagated frame; server memory per session."""
    from triton_sam.bench.video import write_video_report
    from triton_sam.bench.video_served import serve_and_bench_video

    report = serve_and_bench_video(
        model, work_dir=work_dir, frames=frames, objects=objects, repeats=repeats,
        progress=typer.echo,
    )  # fmt: skip
    echo_report(write_video_report(report, output))


@bench_app.command(
    "concept-video", short_help="Frames/s of concept video served vs Sam3VideoModel in-process."
)
def bench_concept_video_cmd(
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            help="Hugging Face Sam3VideoModel directory (facebook/sam3). Default: the seeded "
            "small model (its speed says how the paths compare, not how fast SAM3 is)."
        ),
    ] = None,
    video: Annotated[
        Path | None,
        typer.Option(help="Folder of frames, mp4, TIFF stack or .npy. Default: a synthetic clip."),
    ] = None,
    phrase: Annotated[
        str | None, typer.Option(help="The concept (the small model's: cat).")
    ] = None,
    frames: Annotated[int, typer.Option(min=2, help="Frames propagated (the first ones).")] = 8,
    repeats: Annotated[int, typer.Option(min=1, help="Propagations per path.")] = 1,
    output: ReportDirOpt = Path("outputs/bench"),
    work_dir: WorkDirOpt = Path(".bench_concept_video"),
) -> None:
    """Propagations of PHRASE through the video's first FRAMES frames: sam3_concept_video on an
    embedded Triton (gRPC stream) vs transformers' Sam3VideoModel in-process, same weights;
    frames/s, per-frame percentiles, frames answered and tracked, objects."""
    from dataclasses import asdict, replace

    from triton_sam.bench import concept_video_small as small
    from triton_sam.bench.concept_video import bench_concept_video, write_concept_video_report
    from triton_sam.bench.video import write_clip
    from triton_sam.serving.concept_video.service import SERVED_SETTINGS
    from triton_sam.serving.protocol.concept_video import MAX_OBJECTS

    settings = None
    if checkpoint is None:
        from triton_sam.errors import InputValidationError

        if phrase not in (None, small.SMALL_PHRASE):
            raise InputValidationError(
                "--phrase", f"the small model's thresholds were set for {small.SMALL_PHRASE!r}"
            )
        video_model, processor = small.small_video_model(), small.small_processor()
        phrase, weights = small.SMALL_PHRASE, "seeded small Sam3VideoModel"
        # the served defaults are facebook/sam3's: send the small model's thresholds
        served = replace(small.SMALL_SETTINGS, max_num_objects=MAX_OBJECTS)
        settings = {k: v for k, v in asdict(served).items() if v != getattr(SERVED_SETTINGS, k)}
    else:
        from transformers import Sam3VideoProcessor

        from triton_sam.setup.concept_video import load_checkpoint

        video_model, _ = load_checkpoint(checkpoint)
        processor = Sam3VideoProcessor.from_pretrained(checkpoint)
        weights = f"weights of {checkpoint}"
    if phrase is None:
        raise typer.BadParameter("give the concept to track", param_hint="--phrase")
    if video is None:
        video = write_clip(Path(work_dir) / "clip", frames, (240, 320))
    source = np.load(video) if video.suffix == ".npy" else video
    clip = open_video(source)
    pixels = [clip.pixels(i) for i in range(min(frames, clip.num_frames))]
    pixels = [p if p.ndim == 3 else np.repeat(p[..., None], 3, axis=-1) for p in pixels]
    report = bench_concept_video(
        video_model, processor, pixels, phrase, work_dir, settings=settings, repeats=repeats,
        weights=weights, progress=typer.echo,
    )  # fmt: skip
    echo_report(write_concept_video_report(report, output))
