"""``triton-sam``: thin typer entry points over the package (logic lives in the modules).

User errors (TritonSamError) print their message and exit 1, without a traceback.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from triton_sam.bench.harness import Served, checkpoints_dir, served
from triton_sam.errors import TritonSamError

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from triton_sam.models.spec import ModelSpec

app = typer.Typer(
    name="triton-sam",
    help=(
        "Serve Segment Anything on NVIDIA Triton.\n\n"
        "Flow: download -> export (ONNX encoder/decoder, verified against torch) -> model "
        "repository -> serve (docker compose on GPU, or `triton-sam serve` anywhere) -> "
        "client (triton_sam.SAM2TritonClient).\n\n"
        "Commands taking OVERRIDES accept hydra-style key=value pairs, e.g. "
        "export.fp16=true repository.instance_count=2 (see `triton-sam config`)."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


class _BenchGroup(TyperGroup):
    """``triton-sam bench``: the measurements. Options with no subcommand (``triton-sam bench
    --model X``, the old spelling of ``bench users``) still run ``bench users``, with a note."""

    #: The order of `triton-sam bench --help`: what most users run first.
    ORDER = (
        "users",
        "click",
        "backends",
        "video",
        "concepts",
        "stress",
        "soak",
        "storm",
        "replicas",
        "perf-analyzer",
    )

    def list_commands(self, ctx: typer.Context) -> list[str]:
        rank = {name: i for i, name in enumerate(self.ORDER)}
        return sorted(super().list_commands(ctx), key=lambda name: rank.get(name, len(rank)))

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if args and args[0].startswith("-") and args[0] not in ctx.help_option_names:
            _renamed_note("bench", "bench users")
            args = ["users", *args]
        return super().parse_args(ctx, args)


bench_app = typer.Typer(
    name="bench",
    cls=_BenchGroup,
    help="Measure latency, throughput, cancellation, soak, scale-out.",
    no_args_is_help=True,
)
proxy_app = typer.Typer(
    name="proxy",
    help="The nginx proxy before Triton replicas: config, tokens.",
    no_args_is_help=True,
)
app.add_typer(bench_app)
app.add_typer(proxy_app)

ModelArg = Annotated[
    str, typer.Argument(help="Variant name, e.g. sam2.1_hiera_tiny (see `triton-sam models`).")
]
OverridesArg = Annotated[
    list[str] | None, typer.Argument(help="Config overrides, key=value (hydra syntax).")
]
RepositoryOpt = Annotated[
    Path | None, typer.Option("--repository", "-r", help="Model repository directory.")
]
RandomInitOpt = Annotated[
    bool, typer.Option("--random-init", help="Skip the download; export random weights.")
]
Fp16Opt = Annotated[bool, typer.Option("--fp16", help="fp16 weights/compute, fp32 I/O.")]


def _PainteraOpt(help: str, kind: Any = str) -> Any:  # noqa: N802 - reads as a type
    """An option of `setup paintera`, shown in its own help panel."""
    return Annotated[kind, typer.Option(help=help, rich_help_panel="MODEL paintera")]


SuffixOpt = Annotated[str, typer.Option(help="Precision suffix: '' (fp32), _fp16, _q4...")]
ProtocolOpt = Annotated[str, typer.Option(help="grpc | http.")]
ServerUrlOpt = Annotated[str | None, typer.Option(help="Server URL (default $TRITON_URL).")]
RunningUrlOpt = Annotated[
    str | None, typer.Option(help="A running server instead of an embedded one.")
]
ModelTypeOpt = Annotated[str, typer.Option(help="Model family of --url's models.")]
VariantOpt = Annotated[str, typer.Option(help="Variant to serve or benchmark.")]
ImageOpt = Annotated[Path | None, typer.Option(help="Image (default: synthetic).")]
SessionsOpt = Annotated[int, typer.Option(min=1, help="Concurrent sessions.")]
ReportDirOpt = Annotated[Path, typer.Option(help="Report directory.")]

#: Where `download-onnx` puts the onnx-community SAM3 tracker pair and `import-onnx` reads it.
ONNX_COMMUNITY_DIR = Path("checkpoints/sam3-tracker-ONNX")


@app.command("models", short_help="List the model variants.")
def models_cmd() -> None:
    """List the model variants that can be downloaded and exported."""
    from triton_sam.models.registry import get_model, model_names

    for name in model_names():
        spec = get_model(name)
        typer.echo(f"{name:28s} {spec.family.family:5s} {spec.description}")


@app.command("config", short_help="Print the configuration (defaults + overrides) as YAML.")
def config_cmd(
    model: Annotated[str | None, typer.Argument()] = None, overrides: OverridesArg = None
) -> None:
    """Print the composed configuration (defaults + overrides) as YAML."""
    from omegaconf import OmegaConf

    from triton_sam.setup.settings import load_config

    typer.echo(OmegaConf.to_yaml(load_config(model, overrides or [])))


@app.command("download", short_help="Download a checkpoint (resumable, sha256-verified).")
def download_cmd(
    model: ModelArg,
    checkpoints: Annotated[Path, typer.Option(help="Checkpoint directory.")] = Path("checkpoints"),
) -> None:
    """Download a checkpoint (resumable, sha256-verified; skipped when already valid).

    Hugging Face checkpoints (SAM3: gated facebook/sam3) need `hf auth login` or HF_TOKEN.
    """
    from triton_sam.models.registry import get_model
    from triton_sam.setup.pipeline import obtain_checkpoint

    path = obtain_checkpoint(get_model(model), checkpoint=None, checkpoints_dir=checkpoints)
    typer.echo(f"checkpoint ready: {path}")


@app.command("download-onnx", short_help="Download the pre-exported SAM3 tracker ONNX pair.")
def download_onnx_cmd(
    dest: Annotated[Path, typer.Option(help="Download directory.")] = ONNX_COMMUNITY_DIR,
    repo: Annotated[str, typer.Option(help="Hugging Face repository.")] = (
        "onnx-community/sam3-tracker-ONNX"
    ),
    suffix: SuffixOpt = "",
) -> None:
    """Download the pre-exported SAM3 tracker ONNX pair (graphs + .onnx_data), no token needed."""
    from triton_sam.models import sam3
    from triton_sam.models.hf_hub import download_hf_files

    names = [
        f"onnx/{Path(graph).stem}{suffix}.onnx{ext}"
        for graph in (sam3.ONNX_COMMUNITY_ENCODER, sam3.ONNX_COMMUNITY_DECODER)
        for ext in ("", "_data")
    ]
    for path in download_hf_files(repo, names, dest):
        typer.echo(f"downloaded {path}")
    typer.echo(f"next: `triton-sam import-onnx {dest}`")


@app.command("import-onnx", short_help="Write a pre-exported ONNX pair into the repository.")
def import_onnx_cmd(
    directory: Annotated[
        Path, typer.Argument(help="Folder with the pair (or its onnx/).")
    ] = ONNX_COMMUNITY_DIR,
    family: Annotated[str, typer.Option(help="Tensor contract of the pair.")] = (
        "sam3_onnx_community"
    ),
    suffix: SuffixOpt = "",
    target: Annotated[str, typer.Option(help="onnxruntime (GPU container) | python.")] = (
        "onnxruntime"
    ),
    repository: RepositoryOpt = None,
) -> None:
    """Write a pre-exported pair (onnx-community layout) into the repository, as is."""
    from triton_sam.models import sam3
    from triton_sam.models.registry import get_family
    from triton_sam.repository.config import RepositoryOptions
    from triton_sam.repository.importer import find_pair, import_onnx_pair

    fam = get_family(family)
    encoder, decoder = find_pair(
        directory,
        f"{Path(sam3.ONNX_COMMUNITY_ENCODER).stem}{suffix}.onnx",
        f"{Path(sam3.ONNX_COMMUNITY_DECODER).stem}{suffix}.onnx",
    )
    repo = repository or Path("model_repository")
    names = import_onnx_pair(
        repo,
        fam,
        encoder_onnx=encoder,
        decoder_onnx=decoder,
        options=RepositoryOptions(target=target),  # type: ignore[arg-type]
    )
    for name in names:
        typer.echo(f"wrote {repo / name}")
    typer.echo("next: `docker compose up -d` (GPU) or `triton-sam serve` (embedded)")


@app.command("export", short_help="Export a variant to ONNX, verified against torch.")
def export_cmd(
    model: ModelArg,
    overrides: OverridesArg = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            help="Checkpoint file (a model directory for SAM3), e.g. a fine-tuned one "
            "(MedSAM, micro-sam): checked against the variant's architecture, its sha256 "
            "recorded in the ONNX metadata. Default: the downloaded, hash-verified one."
        ),
    ] = None,
    random_init: Annotated[
        bool, typer.Option("--random-init", help="Export random weights (offline testing).")
    ] = False,
    fp16: Fp16Opt = False,
    target: Annotated[
        str | None, typer.Option(help="Repository target: onnxruntime (GPU container) | python.")
    ] = None,
    repository: RepositoryOpt = None,
) -> None:
    """Export a variant to ONNX, verify it against torch and write it into the repository.

    Fine-tuned checkpoints need nothing special: `triton-sam export sam1_vit_b --checkpoint
    medsam_vit_b.pth` (the variant must be the architecture it was fine-tuned from).
    """
    _export(model, overrides, checkpoint, random_init, fp16, target, repository, download=False)


@app.command("setup", short_help="Download, export, write the repository: all before serve.")
def setup_cmd(
    model: ModelArg,
    overrides: OverridesArg = None,
    random_init: RandomInitOpt = False,
    fp16: Fp16Opt = False,
    target: Annotated[str | None, typer.Option(help="onnxruntime | python.")] = None,
    repository: RepositoryOpt = None,
    sam1: _PainteraOpt("SAM1 variant.") = "sam1_vit_h",
    sam1_checkpoint: _PainteraOpt("SAM1 checkpoint file.", Path | None) = None,
    sam2: _PainteraOpt("SAM2.1 variant.") = "sam2.1_hiera_large",
    sam2_checkpoint: _PainteraOpt("SAM2.1 checkpoint file.", Path | None) = None,
    sam3_checkpoint: _PainteraOpt("SAM3 tracker checkpoint directory.", Path | None) = None,
) -> None:
    """Download (if needed), export and write the repository: everything before serving.

    MODEL `paintera` writes the three encoders Paintera uses, under its names."""
    if model == PAINTERA_BUNDLE:
        variants = {"sam1": sam1, "sam2": sam2, "sam3": "sam3_tracker"}
        ckpts = {"sam1": sam1_checkpoint, "sam2": sam2_checkpoint, "sam3": sam3_checkpoint}
        for family, variant in variants.items():
            _export(
                variant, overrides, ckpts[family], random_init and ckpts[family] is None,
                fp16, target, repository, download=True, paintera=True,
            )  # fmt: skip
        typer.echo("Paintera: its gRPC address is http://<host>:8001 (docs/paintera.md)")
        return
    _export(model, overrides, None, random_init, fp16, target, repository, download=True)


PAINTERA_BUNDLE = "paintera"


def _session_options(values: dict, options: type) -> object | None:
    """The ``session:`` section as SessionOptions, or None when ``enabled`` is false."""
    values = dict(values)
    return options(**values) if values.pop("enabled", True) else None


@dataclass(frozen=True)
class _ExportPlan:
    """What `export`, `setup` and `setup-video` build, from the composed configuration.

    Attributes:
        cfg: the composed configuration (defaults + overrides + the command's options).
        spec: the variant; ``repository``: where its models are written.
        build_args: the keyword arguments every ``pipeline.build_*`` takes from the
            configuration: ``checkpoint`` (verified; None for random weights),
            ``random_init``, and the ``export:`` / ``repository:`` sections as
            ``export_options`` / ``repository_options``.
    """

    cfg: DictConfig
    spec: ModelSpec
    repository: Path
    build_args: dict[str, Any]

    @property
    def checkpoint(self) -> Path | None:
        """The checkpoint exported, or None for random weights."""
        return self.build_args["checkpoint"]


def _export_plan(
    model: str,
    overrides: list[str] | None,
    checkpoint: Path | None,
    *,
    random_init: bool,
    target: str | None,
    repository: Path | None,
    fp16: bool = False,
    download: bool = True,
) -> _ExportPlan:
    """The options as config overrides, composed once; the checkpoint obtained (verified,
    downloaded when ``download``) unless the composed ``export.random_init`` is true."""
    from triton_sam.export import ExportOptions
    from triton_sam.repository.config import RepositoryOptions
    from triton_sam.setup.pipeline import obtain_checkpoint
    from triton_sam.setup.settings import load_config, model_spec, section

    extra = list(overrides or [])
    extra += ["export.fp16=true"] if fp16 else []
    extra += [f"repository.target={target}"] if target else []
    extra += ["export.random_init=true"] if random_init else []
    cfg = load_config(model, extra)
    spec = model_spec(cfg)
    export_cfg = section(cfg, "export")
    random_init = bool(export_cfg.pop("random_init"))
    ckpt = None
    if not random_init:
        ckpt = obtain_checkpoint(
            spec,
            checkpoint=checkpoint,
            checkpoints_dir=Path(cfg.paths.checkpoints),
            download=download,
        )
    args = {
        "checkpoint": ckpt,
        "random_init": random_init,
        "export_options": ExportOptions(**export_cfg),
        "repository_options": RepositoryOptions(**section(cfg, "repository")),
    }
    return _ExportPlan(cfg, spec, repository or Path(cfg.paths.repository), args)


def _export(
    model: str,
    overrides: list[str] | None,
    checkpoint: Path | None,
    random_init: bool,
    fp16: bool,
    target: str | None,
    repository: Path | None,
    *,
    download: bool,
    paintera: bool = False,
) -> None:
    from triton_sam.repository.everything_config import serves_everything
    from triton_sam.repository.session_config import SessionOptions
    from triton_sam.setup.pipeline import build_repository
    from triton_sam.setup.settings import section

    plan = _export_plan(
        model, overrides, checkpoint, random_init=random_init, fp16=fp16, target=target,
        repository=repository, download=download,
    )  # fmt: skip
    repo = plan.repository
    session = _session_options(section(plan.cfg, "session"), SessionOptions)
    args = {**plan.build_args, "checkpoints_dir": Path(plan.cfg.paths.checkpoints)}
    if paintera:
        from triton_sam.setup.paintera import build_paintera_family

        built = build_paintera_family(plan.spec, repo, **args, session=session)
        build = built.build
        for name in built.entry_models:
            typer.echo(f"wrote {repo / name}  (Paintera's entry model)")
    else:
        # SAM1 / SAM2.1: segment everything too (its graph and the model serving it)
        everything = session is not None and serves_everything(plan.spec.family)
        build = build_repository(plan.spec, repo, **args, session=session, everything=everything)
    if plan.checkpoint is not None:
        meta = build.metadata
        typer.echo(
            f"checkpoint {plan.checkpoint}: sha256 {meta['triton_sam.checkpoint_sha256']} "
            f"({meta['triton_sam.checkpoint_origin']}; recorded in the ONNX metadata)"
        )
    for name in build.models:
        size = build.onnx_bytes.get(name)  # None: a model without ONNX (session, serving)
        typer.echo(
            f"wrote {repo / name}" + ("" if size is None else f"  ({size / 2**20:.1f} MiB ONNX)")
        )
    errs = ", ".join(f"{k}={v:.1e}" for k, v in build.export.max_abs_error.items())
    typer.echo(f"onnxruntime vs torch max abs error: {errs or 'not verified'}")
    typer.echo("next: `docker compose up -d` (GPU) or `triton-sam serve` (embedded)")


@app.command("setup-video", short_help="Export the SAM2.1 video graphs and the tracker model.")
def setup_video_cmd(
    model: ModelArg,
    overrides: OverridesArg = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            help="SAM2.1 checkpoint file, e.g. a fine-tuned one: checked against the "
            "variant's architecture. Default: the downloaded, hash-verified one."
        ),
    ] = None,
    random_init: RandomInitOpt = False,
    target: Annotated[str | None, typer.Option(help="onnxruntime | python.")] = None,
    repository: RepositoryOpt = None,
) -> None:
    """Export the SAM2.1 video graphs (verified against torch) and write them with the
    sam2_tracker model into the repository (next to the image models).

    A fine-tuned checkpoint: `triton-sam setup-video sam2.1_hiera_tiny --checkpoint
    my_finetuned.pt` (the variant must be the architecture it was fine-tuned from).
    """
    from triton_sam.setup.pipeline import build_video_repository

    plan = _export_plan(
        model, overrides, checkpoint, random_init=random_init, target=target, repository=repository
    )
    repo = plan.repository
    build = build_video_repository(plan.spec, repo, **plan.build_args)
    for name in build.models:
        typer.echo(f"wrote {repo / name}")
    worst = max(build.max_abs_error.values(), default=float("nan"))
    typer.echo(f"onnxruntime vs torch max abs error over the graphs: {worst:.1e}")
    typer.echo("next: `triton-sam serve`, then `triton-sam track VIDEO --click x,y --out DIR`")


@app.command("track", short_help="Segment objects through a video or 3-D stack from clicks.")
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
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("outputs/track"),
    url: Annotated[
        str | None, typer.Option(help="Triton server (default: an embedded one over --repository).")
    ] = None,
    protocol: Annotated[str, typer.Option(help="grpc | http.")] = "grpc",
    direction: Annotated[str, typer.Option(help="both | forward | reverse.")] = "both",
    repository: RepositoryOpt = None,
) -> None:
    """Segment objects through a video or a 3-D stack from a few clicks: label PNGs per frame,
    or one label TIFF stack for a volume."""
    import numpy as np
    from tqdm import tqdm

    from triton_sam.client.track import parse_box, parse_click, track_video
    from triton_sam.client.video import SAM2VideoTritonClient
    from triton_sam.client.video_source import open_video

    prompts = [parse_click(c) for c in click or []] + [parse_box(b) for b in box or []]
    source = np.load(video) if video.suffix == ".npy" else video
    total = open_video(source).num_frames

    def run(target: str) -> None:
        with (
            SAM2VideoTritonClient(target, protocol=protocol) as client,
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
    from triton_sam.server import EmbeddedTriton

    repo = embedded_repository(repository or Path("model_repository"))
    with EmbeddedTriton(repo, http_port=0, grpc_port=0, metrics_port=0) as server:
        run(server.grpc_url if protocol == "grpc" else server.http_url)


@app.command("serve", short_help="Run the embedded tritonserver (no Docker) until Ctrl-C.")
def serve_cmd(
    repository: RepositoryOpt = None,
    http_port: Annotated[
        int | None, typer.Option(help="HTTP port (0 = any free port; default serve.http_port).")
    ] = None,
    grpc_port: Annotated[int | None, typer.Option(help="gRPC port (serve.grpc_port).")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Prometheus metrics port (serve.metrics_port).")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (serve.host).")] = None,
    target: Annotated[
        str,
        typer.Option(
            help="How onnxruntime models run: onnxruntime (Triton's onnxruntime backend, the "
            "production configs on CPU) | python (the python-backend runner, a fallback where "
            "that backend cannot be had)."
        ),
    ] = "onnxruntime",
    onnxruntime_backend: Annotated[
        Path | None,
        typer.Option(
            envvar="TRITON_SAM_ONNXRUNTIME_BACKEND",
            help="Folder of Triton's onnxruntime backend (libtriton_onnxruntime.so); default: "
            "built by `make onnxruntime-backend`, else ../shared/triton-onnxruntime-backend/"
            "onnxruntime beside the checkout.",
        ),
    ] = None,
    fuse_attention: Annotated[
        bool,
        typer.Option(
            "--fuse-attention/--no-fuse-attention",
            help="Serve the session models' encoders with fused attention where the family "
            "has a fusion (SAM2.1: onnxruntime's MultiHeadAttention, faster on CPU, same "
            "results to 1e-5); a copy beside the CPU twin, the repository's graphs unchanged.",
        ),
    ] = True,
    self_heal: Annotated[
        bool,
        typer.Option(
            "--self-heal/--no-self-heal",
            help="Probe the session models every 5 s and reload one whose python stub died "
            "(Triton 2.51 keeps such a model READY while every request fails). Runs the "
            "server in poll mode: it reloads a model whose files change, and refuses every "
            "load/unload request.",
        ),
    ] = True,
    admin_key_file: Annotated[
        Path | None,
        typer.Option(
            help="File of the admin key that unlocks the model-repository, shared-memory, "
            "trace and logging APIs (created owner-only on first use; $TRITON_ADMIN_KEY "
            "overrides it). Default: $XDG_CONFIG_HOME/triton-sam/admin-key.",
        ),
    ] = None,
    web: Annotated[
        bool, typer.Option("--web", help="Also serve the browser annotator (prints its URL).")
    ] = False,
    web_port: Annotated[int, typer.Option(help="The annotator's port (0 = any free).")] = 8080,
) -> None:
    """Run the embedded tritonserver (no Docker) until Ctrl-C / SIGTERM.

    A repository written for the GPU container (onnxruntime target) is served with its own
    configs on Triton's onnxruntime backend, changed only in what a CPU host cannot do
    (KIND_GPU -> KIND_CPU, no TensorRT); the twins are written next to it and use the same
    ONNX files. The control APIs need the admin key (`triton-sam admin-key`); inference,
    health, metadata and statistics are open to whoever reaches the ports.
    """
    from triton_sam.repository.writer import embedded_repository
    from triton_sam.server import EmbeddedTriton
    from triton_sam.server.admin_key import HTTP_HEADER, load_or_create
    from triton_sam.server.health import Watchdog, watched_models
    from triton_sam.setup.settings import load_config, section

    cfg = load_config()
    serve = section(cfg, "serve")  # the configuration's serve: section, options override it
    given = {"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port}
    serve.update({k: v for k, v in (*given.items(), ("host", host)) if v is not None})
    repo = embedded_repository(
        repository or Path(cfg.paths.repository),
        target=target,  # type: ignore[arg-type]
        fuse_attention=fuse_attention,
    )
    # Self-heal: poll mode, the watchdog touches a dead model's folders and Triton reloads it.
    serve["model_control"] = "poll" if self_heal else "none"
    key = load_or_create(admin_key_file)
    server = EmbeddedTriton(
        repo, onnxruntime_backend=onnxruntime_backend, admin_key=key.value, **serve
    )
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with server:
        typer.echo(f"HTTP    {server.http_url}\ngRPC    {server.grpc_url}")
        typer.echo(f"metrics {server.metrics_url}/metrics\nlog     {server.log_path}")
        typer.echo(f"admin   header {HTTP_HEADER}: the key in {key.source}")
        watched = watched_models(repo) if self_heal else {}
        watchdog = (
            Watchdog(server.http_address, watched, repository=repo).start() if watched else None
        )
        if watchdog is not None:
            typer.echo(f"self-heal: watching {', '.join(watched)}")
        page = _web_server(server, repo, web_port).start() if web else None
        if page is not None:
            typer.echo(f"web     {page.url}   <- open in a browser")
        typer.echo("ready; Ctrl-C to stop")
        try:
            signal.pause()
        except KeyboardInterrupt:
            typer.echo("stopping...")
        finally:
            if page is not None:
                page.stop()
            if watchdog is not None:
                watchdog.stop()


def _web_server(server, repo: Path, port: int):
    """The annotator (the gateway with the page) next to the embedded ``server``."""
    from triton_sam.web.serve import WebServer, served_family

    return WebServer(
        server.http_url,
        server.grpc_address,
        host=server.host,
        port=port,
        model_type=served_family(repo),
    )


@app.command("gateway", short_help="Serve Janelia SAM_service's HTTP API on top of Triton.")
def gateway_cmd(
    triton_url: Annotated[
        str, typer.Option(help="Triton's gRPC address (cancels reach Triton).")
    ] = "localhost:8001",
    protocol: ProtocolOpt = "grpc",
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    model_type: Annotated[str, typer.Option(help="Family served (SAM_service: sam1).")] = "sam1",
    workers: Annotated[int, typer.Option(help="Encodes sent to Triton at once.")] = 2,
    web: Annotated[
        bool, typer.Option("--web", help="Also serve the browser annotator at /web/.")
    ] = False,
    triton_http_url: Annotated[
        str | None,
        typer.Option(help="Triton's HTTP address for --web (default: --triton-url's host:8000)."),
    ] = None,
) -> None:
    """/embedded_model, /new_session_id, /cancel_pending, /from_model, /prediction, /models
    and /health as SAM_service answers them (docs/gateway.md); with --web, the annotator
    page and Triton's inference API (/v2) from the same origin (docs/web.md)."""
    from triton_sam.gateway import BackendOptions, GatewayOptions, serve

    backend = BackendOptions(url=triton_url, protocol=protocol, model_type=model_type)
    routes, on_close = [], []
    if web:
        from triton_sam.web import PassThroughOptions, web_routes

        http_url = triton_http_url or f"{triton_url.rsplit(':', 1)[0]}:8000"
        routes, close = web_routes(
            PassThroughOptions(http_url), triton_url if protocol == "grpc" else None
        )
        on_close = [close]
    serve(
        GatewayOptions(backend=backend, workers=workers),
        host=host,
        port=port,
        extra_routes=routes,
        on_close=on_close,
    )


@app.command("admin-key", short_help="Create or rotate the admin key (never printed).")
def admin_key_cmd(
    env_file: Annotated[
        Path | None,
        typer.Option(help="Also set TRITON_ADMIN_KEY in this dotenv file (0600), for compose."),
    ] = None,
    rotate: Annotated[
        bool, typer.Option("--rotate", help="Replace the key with a fresh one.")
    ] = False,
    key_file: Annotated[
        Path | None, typer.Option(help="Key file (default $XDG_CONFIG_HOME/triton-sam/admin-key).")
    ] = None,
) -> None:
    """Create (first use) or rotate the admin key, and say where it is; it is never printed.

    `triton-sam serve` reads it at start (restart it after --rotate); compose reads
    TRITON_ADMIN_KEY from .env: `triton-sam admin-key --env-file .env`.
    """
    from triton_sam.server.admin_key import (
        default_key_path,
        generate_key,
        load_or_create,
        write_env_file,
        write_key_file,
    )

    path = key_file or default_key_path()
    if rotate:
        write_key_file(path, generate_key())
    key = load_or_create(path)
    typer.echo(f"admin key: {key.source}")
    if env_file is not None:
        typer.echo(f"TRITON_ADMIN_KEY set in {write_env_file(env_file, key.value)} (mode 0600)")


@app.command("check", short_help="Smoke-test a running server: an encode and a click.")
def check_cmd(
    url: ServerUrlOpt = None,
    protocol: ProtocolOpt = "http",
    model_type: Annotated[str, typer.Option(help="sam2 | sam1 | sam3")] = "sam2",
    image: ImageOpt = None,
) -> None:
    """Smoke-test a running server: encode an image, predict a click, print timings."""
    import numpy as np

    from triton_sam.client import SAM2TritonClient
    from triton_sam.tools.sample import sample_image

    with SAM2TritonClient(url, model_type=model_type, protocol=protocol) as client:
        img = image if image is not None else sample_image()
        client.set_image(img)
        typer.echo(f"set_image: {client.last_timings_ms}")
        h, w = client.original_size
        masks, iou = client.predict(point_coords=[[w / 2, h / 2]], point_labels=[1])
        typer.echo(f"predict:   {client.last_timings_ms}, {client.last_request_bytes} bytes sent")
        typer.echo(
            f"mask {masks.shape}, {float(np.mean(masks[0, 0] > 0)):.1%} foreground, iou {iou}"
        )


@app.command("segment", short_help="Segment every instance of a phrase (SAM3 concept model).")
def segment_cmd(
    image: Annotated[Path, typer.Argument(help="Image to segment.")],
    text: Annotated[
        list[str], typer.Option("--text", "-t", help="Noun phrase; repeat for several.")
    ],
    out: Annotated[
        Path, typer.Option(help="Overlay PNG to write; the COCO JSON goes beside it (.json).")
    ] = Path("outputs/segment.png"),
    url: ServerUrlOpt = None,
    protocol: ProtocolOpt = "http",
    threshold: Annotated[float, typer.Option(help="Score threshold (Sam3Processor's).")] = 0.3,
    max_instances: Annotated[
        int | None, typer.Option(help="At most this many instances per phrase.")
    ] = None,
) -> None:
    """Segment every instance of each phrase (SAM3 concept model): overlay PNG + COCO JSON."""
    from triton_sam.tools.segment import segment_image

    result = segment_image(
        image, text, out, url=url, protocol=protocol, threshold=threshold,
        max_instances=max_instances,
    )  # fmt: skip
    prediction = result.prediction
    for i, phrase in enumerate(prediction.phrases):
        count = int((prediction.phrase_index == i).sum())
        typer.echo(f"{phrase!r}: {count} instances (presence {prediction.presence[i]:.2f})")
    typer.echo(f"timings: {result.timings_ms}; predict request {_size(result.request_bytes)}")
    typer.echo(f"wrote {result.overlay} and {result.coco}")


@app.command("everything", short_help="Segment everything in images (automatic mask generator).")
def everything_cmd(
    images: Annotated[list[Path], typer.Argument(help="Images to segment.")],
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("outputs/everything"),
    url: Annotated[
        str | None, typer.Option(help="Server's gRPC address (default $TRITON_URL).")
    ] = None,
    model_type: Annotated[str, typer.Option(help="sam2 (SAM2.1) | sam1.")] = "sam2",
    points_per_side: Annotated[int | None, typer.Option(help="Grid points per side.")] = None,
    points_per_batch: Annotated[int | None, typer.Option(help="Points per decoder run.")] = None,
    pred_iou_thresh: Annotated[float | None, typer.Option(help="Predicted IoU cut.")] = None,
    stability_score_thresh: Annotated[float | None, typer.Option(help="Stability cut.")] = None,
    crop_n_layers: Annotated[int | None, typer.Option(help="Crop layers (0: none).")] = None,
    params: Annotated[
        str | None, typer.Option(help="Other parameters as JSON, e.g. '{\"box_nms_thresh\": 0.6}'.")
    ] = None,
) -> None:
    """Every instance in each image, as the official automatic mask generator finds them:
    <out>/<stem>.png (overlay) and <out>/<stem>.json (coco_rle records). Ctrl-C cancels the
    job on the server."""
    import json

    from tqdm import tqdm

    from triton_sam.errors import InputValidationError
    from triton_sam.tools.everything import segment_everything

    try:
        given = json.loads(params) if params else {}
    except json.JSONDecodeError as e:
        raise InputValidationError("params", f"not JSON: {e}") from e
    if not isinstance(given, dict):
        raise InputValidationError("params", "expected a JSON object")
    named = {
        "points_per_side": points_per_side,
        "points_per_batch": points_per_batch,
        "pred_iou_thresh": pred_iou_thresh,
        "stability_score_thresh": stability_score_thresh,
        "crop_n_layers": crop_n_layers,
    }
    given |= {k: v for k, v in named.items() if v is not None}
    bars: list[Any] = []

    def progress(image: Path) -> Any:
        def update(done: int, total: int) -> None:
            if not bars or bars[-1].desc != image.name:  # the server's first answer: a bar
                bars.append(tqdm(desc=image.name, unit="batch", total=total))
            bars[-1].n = done
            bars[-1].refresh()

        return update

    try:
        written = segment_everything(
            images, out, url=url, model_type=model_type, params=given, progress=progress
        )
    finally:
        for bar in bars:
            bar.close()
    for files in written:
        typer.echo(
            f"{files.image.name}: {len(files.result)} instances in {files.seconds:.1f} s -> "
            f"{files.overlay}, {files.annotations}"
        )


@bench_app.command("concepts", short_help="Concept segmentation through Triton vs Sam3Model.")
def bench_concepts_cmd(
    checkpoint: Annotated[
        Path | None,
        typer.Option(help="facebook/sam3 model directory (default: small random weights)."),
    ] = None,
    images: Annotated[int, typer.Option(min=1, help="New images timed per path.")] = 3,
    repeats: Annotated[int, typer.Option(min=1, help="Timed predict calls per path.")] = 3,
    text: Annotated[list[str] | None, typer.Option("--text", "-t", help="Phrases.")] = None,
    work_dir: Annotated[Path, typer.Option(help="Scratch directory.")] = Path(".bench_concepts"),
    out: Annotated[Path, typer.Option(help="Markdown report.")] = Path("outputs/bench_concepts.md"),
) -> None:
    """Concept segmentation through the embedded Triton vs Sam3Model in-process, one run."""
    from triton_sam.bench.concepts import bench_local

    phrases = text or ["cat", "red car", "person", "a cell"]
    report = bench_local(
        work_dir, checkpoint=checkpoint, phrases=phrases, images=images, repeats=repeats
    )
    table = report.markdown()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"{report.settings}\n\n{table}\n")
    typer.echo(f"{report.settings}\n{table}\nwrote {out}")


def _size(n: int) -> str:
    """Bytes for people: a click's few hundred bytes must not print as 0.00 MiB."""
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


@app.command("demo", short_help="End to end here: export, serve, a click and a box, a PNG.")
def demo_cmd(
    model: VariantOpt = "sam2.1_hiera_tiny",
    protocol: ProtocolOpt = "http",
    image: ImageOpt = None,
    output: Annotated[Path, typer.Option(help="Overlay PNG.")] = Path("outputs/demo_overlay.png"),
    download: Annotated[
        bool,
        typer.Option(
            help="Download the checkpoint when it is not in checkpoints/ (verified, "
            "resumable). Offline, or with --no-download, the demo uses random weights."
        ),
    ] = True,
) -> None:
    """End to end on this machine: export, embedded Triton, a click and a box, an overlay PNG.

    Real weights when it can get them (checkpoints/, else a download); random weights,
    loudly, when it cannot.
    """
    from triton_sam.tools.demo import run_demo

    report = run_demo(
        model=model, protocol=protocol, image_path=image, output=output, download=download
    )
    typer.echo(
        f"\n== demo: {report.model} ({'RANDOM weights' if report.random_weights else 'checkpoint'})"
    )
    for stage, s in report.stages_s.items():
        typer.echo(f"  {stage:28s} {s:8.2f} s")
    for stage, ms in report.latency_ms.items():
        typer.echo(f"  {stage:28s} {ms:8.1f} ms")
    for what, n in report.request_bytes.items():
        typer.echo(f"  bytes sent {what:17s} {_size(n):>12s}")
    for name, n in report.onnx_bytes.items():
        typer.echo(f"  onnx {name:23s} {n / 2**20:8.1f} MiB")
    typer.echo(f"  overlay: {report.overlay}")


@bench_app.command(
    "users", short_help="What users run: encode, click, box, refinement; goal ratios."
)
def bench_cmd(
    model: Annotated[
        str, typer.Option(help="Comma-separated variants, e.g. sam1_vit_b,sam2.1_hiera_tiny.")
    ] = "sam2.1_hiera_tiny",
    n_encode: Annotated[int, typer.Option(min=1, help="Timed encodes per path.")] = 3,
    n_decode: Annotated[
        int, typer.Option(min=1, help="Timed calls per prompt kind and caller (c=4: 4x).")
    ] = 30,
    concurrency: Annotated[str, typer.Option(help="Comma-separated concurrency levels.")] = "1,4",
    protocols: Annotated[str, typer.Option(help="Comma-separated: grpc, http.")] = "grpc,http",
    official: Annotated[
        bool, typer.Option(help="Time the official predictor (PyTorch) in-process too.")
    ] = True,
    runner: Annotated[
        bool, typer.Option(help="Time the session path on the python-runner twins too.")
    ] = True,
    encoder_variants: Annotated[
        str,
        typer.Option(
            help="Comma-separated encoder exports to time (encode rows + agreement with fp32): "
            "fp32 (as exported), fused (fused attention: what `triton-sam serve` serves for "
            "families with a fusion; skipped for the others), int8 (int8 weights)."
        ),
    ] = "fp32,fused",
    during_encode: Annotated[
        bool, typer.Option(help="Time a session click sent during another image's encode.")
    ] = True,
    isolate: Annotated[
        bool, typer.Option(help="Each model in its own child process (bounds the run's memory).")
    ] = True,
    work_dir: Annotated[Path, typer.Option(help="Exports (reused).")] = Path(".bench_users"),
    output: Annotated[Path, typer.Option(help="Report directory.")] = Path("outputs/bench"),
) -> None:
    """What users run, in one run: encode, click, box and refinement through the official
    predictor and onnxruntime in-process, and our client on the embedded server (session
    model and stateless decoder, onnxruntime backend; the python runner as one more row),
    a click during another image's encode, and encoder export variants; p50/p95/p99,
    throughput, the same-run goal ratios and peak memory (JSON, markdown, PNG)."""
    from triton_sam.bench.users import (
        BASE_VARIANT,
        ENCODER_VARIANTS,
        prepare_model,
        run_user_benchmark,
        write_report,
    )
    from triton_sam.tools.sample import sample_image

    levels = _levels(concurrency)
    names = [m.strip() for m in model.split(",") if m.strip()]
    chosen = [p.strip() for p in protocols.split(",") if p.strip()]
    if not names or not chosen or set(chosen) - {"grpc", "http"}:
        raise typer.BadParameter("give at least one model and protocols from grpc, http")
    variants = list(dict.fromkeys(v.strip() for v in encoder_variants.split(",") if v.strip()))
    if not variants or set(variants) - set(ENCODER_VARIANTS):
        raise typer.BadParameter(
            f"--encoder-variants: got {encoder_variants!r}, expected from {list(ENCODER_VARIANTS)}"
        )
    if BASE_VARIANT not in variants:
        variants.insert(0, BASE_VARIANT)  # the other variants are compared with it
    models = [prepare_model(n, work_dir, runner=runner, encoder_variants=variants) for n in names]
    report = run_user_benchmark(
        models,
        sample_image(),
        protocols=chosen,
        concurrency=levels,
        n_encode=n_encode,
        n_decode=n_decode,
        official=official,
        during_encode=during_encode,
        encoder_variants=variants,
        isolate=isolate,
    )
    paths = write_report(report, output)
    typer.echo(paths["md"].read_text())
    typer.echo("wrote " + ", ".join(str(p) for p in paths.values()))


@bench_app.command("click", short_help="Where a session click's time goes, stage by stage.")
def bench_click_cmd(
    model: Annotated[str, typer.Option(help="Variant, e.g. sam2.1_hiera_tiny.")] = (
        "sam2.1_hiera_tiny"
    ),
    n: Annotated[int, typer.Option(min=1, help="Timed clicks per variant.")] = 50,
    protocol: Annotated[str, typer.Option(help="grpc or http.")] = "grpc",
    cpu_features: Annotated[
        str, typer.Option(help="Comma-separated feature stores: shared_memory, process.")
    ] = "process,shared_memory",
    concurrency: Annotated[
        int, typer.Option(min=0, help="Also time clicks/s with this many callers (0: no).")
    ] = 0,
    decoder_sizing: Annotated[
        str,
        typer.Option(
            help="Comma-separated decoder sizings to compare, INSTANCESxTHREADS (e.g. 2x1,1x2); "
            "'default' is what the repository writer chose for this host."
        ),
    ] = "default",
    work_dir: Annotated[Path, typer.Option(help="Exports (reused).")] = Path(".bench_users"),
    output: Annotated[Path, typer.Option(help="Report directory.")] = Path("outputs/bench-click"),
) -> None:
    """Where a session click's time goes: client stages, Triton's per-model statistics and
    the session model's own stage counters, per click, beside onnxruntime in process on the
    same decoder; one table per (feature store, decoder sizing) of the session model (JSON
    too)."""
    import json
    import os

    from triton_sam.bench import breakdown
    from triton_sam.bench.paths import ort_sessions
    from triton_sam.bench.users import prepare_model
    from triton_sam.server import EmbeddedTriton
    from triton_sam.tools.sample import sample_image

    if protocol not in ("grpc", "http"):
        raise typer.BadParameter(f"protocol: got {protocol!r}, expected grpc or http")
    stores = [v.strip() for v in cpu_features.split(",") if v.strip()]
    sizings = [_sizing(v.strip()) for v in decoder_sizing.split(",") if v.strip()]
    served = prepare_model(model, work_dir, runner=False)
    family = served.spec.family
    sessions = ort_sessions(served.repository, family)
    image = sample_image()
    output.mkdir(parents=True, exist_ok=True)
    reports = {}
    for store, sizing in ((st, sz) for st in stores for sz in sizings):
        label = store if sizing is None else f"{store}-{sizing[0]}x{sizing[1]}"
        repo = breakdown.variant_repository(
            served.repository, work_dir / model / f"click-{label}", family,
            cpu_features=store, decoder_sizing=sizing,
        )  # fmt: skip
        with EmbeddedTriton(repo, http_port=0, grpc_port=0, metrics_port=0) as server:
            urls = {"grpc": server.grpc_url, "http": server.http_url,
                    "stats": server.http_url, "metrics": server.metrics_url}  # fmt: skip
            report = breakdown.run_breakdown(family, urls, sessions, image, protocol=protocol, n=n)
            if concurrency:
                report.throughput = breakdown.click_throughput(
                    family, urls[protocol], sessions, image, protocol=protocol,
                    concurrency=concurrency, n=max(n, 4 * concurrency),
                )  # fmt: skip
        report.settings |= {"cpu_features": store, "cpu_count": os.cpu_count(),
                            "decoder_sizing": label.removeprefix(store).lstrip("-") or "default",
                            "load_average": list(os.getloadavg())}  # fmt: skip
        reports[label] = report.as_dict()
        typer.echo(f"## {model}, {label}, {protocol}, n={n}\n")
        typer.echo(breakdown.markdown(report) + "\n")
    path = output / f"{model}.json"
    path.write_text(json.dumps(reports, indent=1))
    typer.echo(f"wrote {path}")


def _sizing(text: str) -> tuple[int, int] | None:
    """``INSTANCESxTHREADS`` (e.g. ``2x1``) as a pair; ``default`` as None."""
    if text == "default":
        return None
    try:
        instances, threads = (int(v) for v in text.lower().split("x"))
    except ValueError:
        instances = threads = 0
    if instances < 1 or threads < 1:
        raise typer.BadParameter(
            f"decoder_sizing: got {text!r}, expected INSTANCESxTHREADS such as 2x1, or default"
        )
    return instances, threads


@bench_app.command("backends", short_help="onnxruntime backend vs the python-backend runner.")
def bench_backends_cmd(
    model: VariantOpt = "sam2.1_hiera_tiny",
    protocol: ProtocolOpt = "grpc",
    n_encode: Annotated[int, typer.Option(min=1, help="Timed encodes per path.")] = 10,
    n_click: Annotated[int, typer.Option(min=1, help="Timed session clicks per path.")] = 50,
    output: ReportDirOpt = Path("outputs/bench"),
) -> None:
    """Encode and click (session path) latency on Triton's onnxruntime backend vs the
    python-backend runner: the same repository served both ways at once, requests
    alternating, in one run (JSON + markdown)."""
    from triton_sam.bench.backends import compare_backends, write_report
    from triton_sam.repository.writer import embedded_repository
    from triton_sam.server import EmbeddedTriton
    from triton_sam.tools.demo import build_local_repository
    from triton_sam.tools.sample import sample_image

    work = Path(".bench")
    # Both servers run the graphs as exported (the runner has no fused CPU twin): like for like.
    spec, backend_repo, _ = build_local_repository(
        model, checkpoints_dir(), work, fuse_attention=False
    )
    runner_repo = embedded_repository(
        work / "model_repository", work / "model_repository_runner", target="python"
    )
    ports = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
    with EmbeddedTriton(backend_repo, **ports) as ort, EmbeddedTriton(runner_repo, **ports) as py:
        url = (lambda s: s.grpc_url) if protocol == "grpc" else (lambda s: s.http_url)
        report = compare_backends(
            {"onnxruntime": url(ort), "python": url(py)},
            spec.family,
            sample_image(),
            protocol=protocol,
            n_encode=n_encode,
            n_click=n_click,
            model_name=spec.name,
        )
    paths = write_report(report, output)
    _echo_report(paths)


@bench_app.command("video", short_help="Frames/s of video propagation vs SAM2VideoPredictor.")
def bench_video_cmd(
    model: VariantOpt = "sam2.1_hiera_tiny",
    frames: Annotated[int, typer.Option(min=2, help="Frames propagated.")] = 8,
    objects: Annotated[int, typer.Option(min=1, max=3, help="Objects tracked.")] = 1,
    repeats: Annotated[int, typer.Option(min=1, help="Timed propagations per path.")] = 1,
    output: ReportDirOpt = Path("outputs/bench"),
    work_dir: Annotated[Path, typer.Option(help="Graphs and repository.")] = Path(".bench_video"),
) -> None:
    """Frames/s of video propagation: embedded Triton (gRPC, HTTP) vs SAM2VideoPredictor and
    onnxruntime in-process, one run; bytes per propagated frame; server memory per session."""
    from triton_sam.bench.video import run_video_benchmark, write_video_report
    from triton_sam.export.sam2_video import GRAPH_KEYS, TRACKER_CONFIG_FILENAME, export_video
    from triton_sam.models import get_model
    from triton_sam.repository.config import RepositoryOptions
    from triton_sam.repository.video_config import write_video_models
    from triton_sam.server import EmbeddedTriton
    from triton_sam.serving.tracking.config import TrackerConfig

    spec = get_model(model)
    graphs_dir = work_dir / "graphs" / spec.name
    if not (graphs_dir / TRACKER_CONFIG_FILENAME).is_file():
        typer.echo(f"exporting {spec.name} (random weights) to {graphs_dir} ...")
        export_video(spec, None, graphs_dir)
    graphs = {key: graphs_dir / f"{key}.onnx" for key in GRAPH_KEYS}
    config = TrackerConfig.from_json((graphs_dir / TRACKER_CONFIG_FILENAME).read_text())
    repo = work_dir / "model_repository"
    write_video_models(repo, graphs, config, RepositoryOptions(target="python"))
    with EmbeddedTriton(repo, http_port=0, grpc_port=0, metrics_port=0) as server:
        report = run_video_benchmark(
            graphs_dir=graphs_dir,
            spec=spec,
            urls={"triton-grpc": server.grpc_url, "triton-http": server.http_url},
            work_dir=work_dir,
            frames=frames,
            objects=objects,
            repeats=repeats,
        )
    paths = write_video_report(report, output)
    _echo_report(paths)


@bench_app.command("everything", short_help="Segment everything: served vs official generator.")
def bench_everything_cmd(
    model: VariantOpt = "sam2.1_hiera_tiny",
    points_per_side: Annotated[int, typer.Option(min=1, help="Grid points per side.")] = 32,
    points_per_batch: Annotated[int, typer.Option(min=1, help="Prompts per decoder run.")] = 64,
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per row.")] = 1,
    served: Annotated[bool, typer.Option(help="Add the served row (embedded server).")] = True,
    work_dir: Annotated[Path, typer.Option(help="Graphs and repository.")] = Path(
        ".bench/everything"
    ),
) -> None:
    """Automatic mask generation, one run, same random-init weights, image and parameters:
    the official generator, onnxruntime with our batching, and the served model; speedups
    against the official generator and the server's peak memory."""
    from triton_sam.bench import everything

    argv = [
        f"--model={model}",
        f"--points-per-side={points_per_side}",
        f"--points-per-batch={points_per_batch}",
        f"--repeats={repeats}",
        f"--work={work_dir}",
        *(["--served"] if served else []),
    ]
    everything.main(argv)


@bench_app.command("perf-analyzer", short_help="Triton's perf_analyzer against the served models.")
def perf_analyzer_cmd(
    model: Annotated[str, typer.Option(help="Variant (its family gives shapes).")] = (
        "sam2.1_hiera_tiny"
    ),
    graph: Annotated[str, typer.Option(help="encoder | decoder")] = "decoder",
    url: Annotated[
        str | None, typer.Option(help="host:port of a running server (default: embedded).")
    ] = None,
    protocol: Annotated[str, typer.Option(help="http | grpc")] = "grpc",
    concurrency: Annotated[str, typer.Option(help="Comma-separated levels.")] = "1,4,16",
    requests: Annotated[int, typer.Option(min=1, help="Requests per measurement window.")] = 20,
) -> None:
    """Triton's own perf_analyzer against the served models, shapes taken from the spec.

    Install it first with `make perf-analyzer`. Without --url the model is exported and
    served by the embedded tritonserver for the run."""
    from triton_sam.bench.perf_analyzer import run_perf_analyzer
    from triton_sam.models.registry import get_model

    levels = _levels(concurrency)
    family = get_model(model).family

    def run(address: str) -> None:
        rows, commands = run_perf_analyzer(
            family, graph, address, protocol=protocol, concurrency=levels,
            requests_per_level=requests,
        )  # fmt: skip
        for cmd in commands:
            typer.echo(f"$ {cmd}")
        typer.echo("| concurrency | infer/s | p50 ms | p95 ms | p99 ms | queue ms | compute ms |")
        typer.echo("|---|---|---|---|---|---|---|")
        for r in rows:
            typer.echo(
                f"| {r['concurrency']:.0f} | {r['throughput']:.2f} | {r['p50']:.1f} | "
                f"{r['p95']:.1f} | {r['p99']:.1f} | {r['server_queue']:.1f} | "
                f"{r['server_compute']:.1f} |"
            )

    with served(url, protocol=protocol, model=model, model_type="", work=Path(".bench")) as s:
        run(s.url.split("://", 1)[-1])


def _echo_report(paths: dict[str, Path]) -> None:
    """Print a written benchmark report: its markdown, then where every file went."""
    typer.echo(paths["md"].read_text())
    typer.echo("wrote " + ", ".join(str(p) for p in paths.values()))


def _levels(text: str) -> list[int]:
    from triton_sam.errors import InputValidationError

    try:
        levels = [int(c) for c in text.split(",")]
    except ValueError as e:
        raise InputValidationError("concurrency", f"got {text!r}, expected e.g. 1,4,16") from e
    if min(levels) < 1:
        raise InputValidationError("concurrency", f"got {text!r}, expected integers >= 1")
    return levels


@bench_app.command("stress", short_help="Speculative decoding under simulated mouse drags.")
def stress_cmd(
    model: VariantOpt = "sam2.1_hiera_tiny",
    url: RunningUrlOpt = None,
    protocol: Annotated[str, typer.Option(help="grpc | http (no server-side cancel)")] = "grpc",
    http_url: Annotated[
        str | None, typer.Option(help="Statistics endpoint of --url (default: its host:8000).")
    ] = None,
    metrics_url: Annotated[
        str | None, typer.Option(help="Metrics endpoint of --url (default: its host:8002).")
    ] = None,
    model_type: ModelTypeOpt = "sam2",
    events: Annotated[int, typer.Option(min=1, help="Mouse events per drag.")] = 50,
    rate: Annotated[float, typer.Option(min=0.1, help="Events per second.")] = 100.0,
    sessions: SessionsOpt = 4,
    repeats: Annotated[int, typer.Option(min=1, help="Drags per session.")] = 1,
    modes: Annotated[str, typer.Option(help="Comma-separated.")] = "reference,cancel,latest",
    image: ImageOpt = None,
    output: ReportDirOpt = Path("outputs/stress"),
) -> None:
    """Speculative decoding under simulated mouse drags: the reference behaviour (send all,
    mark cancelled locally), real cancellation, and latest-wins, in one run; executed and
    cancelled requests from the server's own counters (JSON + markdown)."""
    from triton_sam.bench.stress import (
        DragSettings,
        check_modes,
        counter_urls,
        run_stress_on_server,
        write_report,
    )
    from triton_sam.tools.sample import sample_image

    settings = DragSettings(events=events, rate_hz=rate, sessions=sessions, repeats=repeats)
    chosen = [m.strip() for m in modes.split(",") if m.strip()]
    check_modes(chosen)  # before an export or a connection
    picture = image if image is not None else sample_image()

    def run(target: str, stats: str | None, metrics: str | None, family: str, name: str) -> None:
        report = run_stress_on_server(
            target,
            protocol=protocol,
            http_url=stats,
            metrics_url=metrics,
            image=picture,
            model_type=family,
            settings=settings,
            modes=chosen,
            model_name=name,
        )
        paths = write_report(report, output)
        _echo_report(paths)

    work = Path(".stress")
    with served(url, protocol=protocol, model=model, model_type=model_type, work=work) as s:
        stats, metrics = (s.http_url, s.metrics_url)
        if url:
            stats, metrics = counter_urls(url, http_url, metrics_url)
        run(s.url, stats, metrics, s.family, s.name)


@bench_app.command("soak", short_help="Many concurrent sessions for a while; exits 1 on a failure.")
def soak_cmd(
    model: VariantOpt = "sam2.1_hiera_tiny",
    url: RunningUrlOpt = None,
    protocol: ProtocolOpt = "grpc",
    model_type: ModelTypeOpt = "sam2",
    sessions: SessionsOpt = 16,
    duration: Annotated[float, typer.Option(min=1, help="Seconds of prompting.")] = 60.0,
    warmup: Annotated[
        float, typer.Option(min=0, help="Seconds of prompting before memory growth counts.")
    ] = 0.0,
    images: Annotated[
        int, typer.Option(min=0, help="Distinct images encoded (0 = one per session).")
    ] = 0,
    encode_every: Annotated[
        int, typer.Option(min=0, help="Re-encode after this many prompts (0 = never).")
    ] = 0,
    server_embeddings: Annotated[
        bool,
        typer.Option(
            "--server-embeddings/--stateless",
            help="Keep each image's features on the server (the <family>_session model, "
            "what the clients use by default) or send them with every click.",
        ),
    ] = True,
    output: ReportDirOpt = Path("outputs/soak"),
) -> None:
    """Many concurrent sessions for a while: failures, latency p50/p95/p99, and client and
    server memory (RSS) sampled throughout (JSON + markdown). Exits 1 on any failure."""
    from triton_sam.bench.soak import SoakSettings, run_soak_on_server, write_report

    settings = SoakSettings(
        sessions=sessions,
        duration_s=duration,
        warmup_s=warmup,
        images=images,
        encode_every=encode_every,
        server_embeddings=server_embeddings,
    )

    def run(s: Served) -> None:
        report = run_soak_on_server(
            s.url,
            settings=settings,
            protocol=protocol,
            model_type=s.family,
            server_pid=s.pid,
            model_name=s.name,
            progress=typer.echo,
            http_url=s.http_url,
            metrics_url=s.metrics_url,
        )
        paths = write_report(report, output)
        _echo_report(paths)
        if report.failures:
            raise typer.Exit(1)

    work = Path(".soak")
    with served(url, protocol=protocol, model=model, model_type=model_type, work=work) as s:
        run(s)


@bench_app.command("storm", short_help="Storms of concurrent embeds while users click.")
def bench_storm_cmd(
    model: VariantOpt = "sam2.1_hiera_tiny",
    url: RunningUrlOpt = None,
    model_type: ModelTypeOpt = "sam2",
    embeds: Annotated[
        str, typer.Option(help="Storm sizes (concurrent embeds), comma-separated.")
    ] = "64,256",
    clickers: Annotated[int, typer.Option(min=1, help="Users clicking meanwhile.")] = 16,
    think: Annotated[float, typer.Option(min=0, help="Clickers' pause between clicks (s).")] = 0.5,
    output: ReportDirOpt = Path("outputs/storm"),
) -> None:
    """Storms of concurrent embeds (distinct PNGs) while users click: typed refusals, zero
    transport errors, the server's peak memory twice per size, the clicks' p95 against their
    idle p95 (JSON + markdown). Exits 1 on any transport error."""
    from triton_sam.bench.storm import StormSettings, run_storm_on_server, write_report

    sizes = tuple(int(n) for n in embeds.split(",") if n.strip())
    settings = StormSettings(embeds=sizes, clickers=clickers, think_s=think)
    work = Path(".storm")
    with served(url, protocol="grpc", model=model, model_type=model_type, work=work) as s:
        report = run_storm_on_server(
            s.url,
            model=f"{s.family}_session",
            settings=settings,
            server_pid=s.pid,
            progress=typer.echo,
        )
    _echo_report(write_report(report, output))
    if report.transport_errors:
        raise typer.Exit(1)


@bench_app.command("replicas", short_help="Replicas behind nginx, one killed mid-run.")
def bench_replicas_cmd(
    model: VariantOpt = "sam2.1_hiera_tiny",
    protocol: Annotated[str, typer.Option(help="grpc | http | both")] = "both",
    replicas: Annotated[int, typer.Option(min=2, help="Triton replicas behind nginx.")] = 3,
    sessions: SessionsOpt = 16,
    clicks: Annotated[int, typer.Option(min=1, help="Clicks per session.")] = 30,
    images: Annotated[int, typer.Option(min=1, help="Distinct images.")] = 8,
    kill_after: Annotated[
        float, typer.Option(min=0.0, max=0.99, help="Fraction of clicks before a replica dies.")
    ] = 0.4,
    output: ReportDirOpt = Path("outputs/bench-replicas"),
    repository: RepositoryOpt = None,
) -> None:
    """Embedded Triton replicas behind a real nginx (image-affine consistent hashing), many
    sessions clicking, one replica SIGKILLed mid-run: failed clicks, requests per replica,
    images moved, re-embeds, masks vs one server (JSON + markdown). Needs nginx on PATH.
    Exits 1 on a failed click or a mask that differs from the single-server run."""
    from triton_sam.bench.replicas import (
        ReplicaBenchOptions,
        bench_images,
        run_replicas,
        run_sessions,
        write_report,
    )
    from triton_sam.errors import InputValidationError
    from triton_sam.scaleout.proxy import find_nginx
    from triton_sam.server import EmbeddedTriton
    from triton_sam.tools.demo import build_local_repository

    if protocol not in ("http", "grpc", "both"):
        raise InputValidationError("protocol", f"got {protocol!r}, expected http, grpc or both")
    find_nginx()  # fail before the export when nginx is missing
    protocols = ["http", "grpc"] if protocol == "both" else [protocol]
    options = ReplicaBenchOptions(
        replicas=replicas, sessions=sessions, clicks=clicks, images=images, kill_after=kill_after
    )
    if repository is None:  # export (verified checkpoint, else random weights) and serve it
        spec, repo, _ = build_local_repository(model, Path("checkpoints"), Path(".bench-replicas"))
    else:  # a production repository holding `model`'s session model, served as its CPU twin
        from triton_sam.models import get_model
        from triton_sam.repository.writer import embedded_repository

        spec, repo = get_model(model), embedded_repository(repository)
    names = {"model_type": spec.family.family}
    names["encoder_model"] = spec.family.encoder_model
    names["session_model"] = spec.family.session_model
    typer.echo("reference: the same sessions against one server")
    with EmbeddedTriton(repo, http_port=0, grpc_port=0, metrics_port=0) as server:
        reference = run_sessions(
            server.http_address,
            "http",
            bench_images(options),
            options,
            model_type=spec.family.family,
        )
    reports = []
    for p in protocols:
        typer.echo(f"{p}: {replicas} replicas behind nginx")
        reports.append(run_replicas(repo, p, options, reference=reference, **names))
    paths = write_report(reports, options, output)
    _echo_report(paths)
    if any(r.failed_clicks or r.mask_mismatches for r in reports):
        raise typer.Exit(1)


@proxy_app.command("config")
def proxy_config_cmd(
    replicas: Annotated[int, typer.Option(min=1, help="Triton replicas (one per GPU).")] = 2,
    host_pattern: Annotated[
        str, typer.Option(help="Replica host names; {i} is the replica index.")
    ] = "triton-{i}",
    tokens_file: Annotated[
        str | None,
        typer.Option(help="Bearer tokens on: the tokens file's path as nginx sees it."),
    ] = None,
) -> None:
    """Print the image-affine nginx configuration of deploy/compose for N replicas
    (consistent hash of the clients' x-sam-image-id header, HTTP and gRPC); with
    --tokens-file, requests need a bearer token and carry its tenant."""
    from triton_sam.scaleout.nginx import compose_config, render_nginx_conf

    config = compose_config(replicas, host_pattern=host_pattern, tokens_file=tokens_file)
    typer.echo(render_nginx_conf(config), nl=False)


@proxy_app.command("token")
def proxy_token_cmd(
    tenant: Annotated[str, typer.Argument(help="The tenant (team) the new token stands for.")],
    file: Annotated[
        Path, typer.Option(help="The proxy's tokens file (created owner-only if missing).")
    ] = Path("deploy/compose/tokens/tokens.map"),
) -> None:
    """Add a bearer token for TENANT to the proxy's tokens file and print it (once: only the
    file keeps it). Restart or reload the proxy to use it."""
    from triton_sam.scaleout.nginx import new_token, read_tokens_file, write_tokens_file

    tokens = read_tokens_file(file) if file.exists() else {}
    token = new_token()
    write_tokens_file(file, {**tokens, token: tenant})
    typer.echo(token)


#: Old command names -> their new spelling; kept, hidden, for one release.
RENAMED = {
    "bench-click": "bench click",
    "bench-backends": "bench backends",
    "bench-video": "bench video",
    "bench-concepts": "bench concepts",
    "bench-replicas": "bench replicas",
    "bench-storm": "bench storm",
    "perf-analyzer": "bench perf-analyzer",
    "stress": "bench stress",
    "soak": "bench soak",
    "proxy-config": "proxy config",
    "proxy-token": "proxy token",
}


def _renamed_note(old: str, new: str) -> None:
    typer.echo(
        f"`triton-sam {old}` is now `triton-sam {new}`; the old name goes in the next release",
        err=True,
    )


def _renamed_command(old: str, new: str) -> type[TyperCommand]:
    """A command class that prints the renaming note before anything else (--help included)."""

    class Renamed(TyperCommand):
        def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
            _renamed_note(old, new)
            return super().parse_args(ctx, args)

    return Renamed


def _add_renamed_commands() -> None:
    apps = {"bench": bench_app, "proxy": proxy_app}
    for old, new in RENAMED.items():
        group, name = new.split(" ", 1)
        info = next(c for c in apps[group].registered_commands if c.name == name)
        app.command(old, hidden=True, cls=_renamed_command(old, new), help=info.callback.__doc__)(
            info.callback
        )


_add_renamed_commands()


@app.callback()
def _global_options(
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Also show other libraries' INFO logs and warnings (onnxruntime's "
            "optimizer, onnx, torch's exporter).",
        ),
    ] = False,
) -> None:
    from triton_sam.cli.logs import setup_logging

    setup_logging(verbose=verbose)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except TritonSamError as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
