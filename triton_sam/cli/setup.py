"""Everything before serving: list the variants, print the configuration, download, export,
import a pre-exported pair, and ``setup`` (all of it, Paintera's bundle included).

The export pipeline (onnx, torch, hydra) and the repository writers are imported inside the
commands: ``triton-sam --help`` must not load them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from triton_sam.cli.app import app
from triton_sam.cli.options import (
    Fp16Opt,
    ModelArg,
    OverridesArg,
    RandomInitOpt,
    RepositoryOpt,
    SuffixOpt,
    TargetOpt,
    paintera_option,
)
from triton_sam.models import sam3
from triton_sam.models.hf_hub import download_hf_files
from triton_sam.models.registry import get_family, get_model, model_names
from triton_sam.setup.settings import load_config, model_spec, section

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from triton_sam.models.spec import ModelSpec

#: Where `download-onnx` puts the onnx-community SAM3 tracker pair and `import-onnx` reads it.
ONNX_COMMUNITY_DIR = Path("checkpoints/sam3-tracker-ONNX")
#: The MODEL of `setup` that writes the three encoders Paintera uses.
PAINTERA_BUNDLE = "paintera"
NEXT_SERVE = "next: `docker compose up -d` (GPU) or `triton-sam serve` (embedded)"


@app.command("models", short_help="List the model variants.")
def models_cmd() -> None:
    """List the model variants that can be downloaded and exported."""
    for name in model_names():
        spec = get_model(name)
        typer.echo(f"{name:28s} {spec.family.family:5s} {spec.description}")


@app.command("config", short_help="Print the configuration (defaults + overrides) as YAML.")
def config_cmd(
    model: Annotated[str | None, typer.Argument()] = None, overrides: OverridesArg = None
) -> None:
    """Print the composed configuration (defaults + overrides) as YAML."""
    from omegaconf import OmegaConf

    typer.echo(OmegaConf.to_yaml(load_config(model, overrides or [])))


@app.command("download", short_help="Download a checkpoint (resumable, sha256-verified).")
def download_cmd(
    model: ModelArg,
    checkpoints: Annotated[Path, typer.Option(help="Checkpoint directory.")] = Path("checkpoints"),
) -> None:
    """Download a checkpoint (resumable, sha256-verified; skipped when already valid).

    Hugging Face checkpoints (SAM3: gated facebook/sam3) need `hf auth login` or HF_TOKEN.
    """
    from triton_sam.setup.pipeline import obtain_checkpoint

    path = obtain_checkpoint(get_model(model), checkpoint=None, checkpoints_dir=checkpoints)
    typer.echo(f"checkpoint ready: {path}")


def _pair_names(suffix: str) -> tuple[str, str]:
    """The onnx-community encoder and decoder file names at a precision ``suffix``."""
    encoder, decoder = sam3.ONNX_COMMUNITY_ENCODER, sam3.ONNX_COMMUNITY_DECODER
    return f"{Path(encoder).stem}{suffix}.onnx", f"{Path(decoder).stem}{suffix}.onnx"


@app.command("download-onnx", short_help="Download the pre-exported SAM3 tracker ONNX pair.")
def download_onnx_cmd(
    dest: Annotated[Path, typer.Option(help="Download directory.")] = ONNX_COMMUNITY_DIR,
    repo: Annotated[str, typer.Option(help="Hugging Face repository.")] = (
        "onnx-community/sam3-tracker-ONNX"
    ),
    suffix: SuffixOpt = "",
) -> None:
    """Download the pre-exported SAM3 tracker ONNX pair (graphs + .onnx_data), no token needed."""
    names = [f"onnx/{graph}{ext}" for graph in _pair_names(suffix) for ext in ("", "_data")]
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
    from triton_sam.repository.config import RepositoryOptions
    from triton_sam.repository.importer import find_pair, import_onnx_pair

    encoder, decoder = find_pair(directory, *_pair_names(suffix))
    repo = repository or Path("model_repository")
    options = RepositoryOptions(target=target)  # type: ignore[arg-type]
    names = import_onnx_pair(
        repo, get_family(family), encoder_onnx=encoder, decoder_onnx=decoder, options=options
    )
    for name in names:
        typer.echo(f"wrote {repo / name}")
    typer.echo(NEXT_SERVE)


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
    target: TargetOpt = None,
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
    target: TargetOpt = None,
    repository: RepositoryOpt = None,
    sam1: paintera_option("SAM1 variant.") = "sam1_vit_h",
    sam1_checkpoint: paintera_option("SAM1 checkpoint file.", Path | None) = None,
    sam2: paintera_option("SAM2.1 variant.") = "sam2.1_hiera_large",
    sam2_checkpoint: paintera_option("SAM2.1 checkpoint file.", Path | None) = None,
    sam3_checkpoint: paintera_option("SAM3 tracker checkpoint directory.", Path | None) = None,
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


def session_options(values: dict, options: type) -> object | None:
    """The ``session:`` section as SessionOptions, or None when ``enabled`` is false."""
    values = dict(values)
    return options(**values) if values.pop("enabled", True) else None


@dataclass(frozen=True)
class ExportPlan:
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


def export_plan(
    model: str,
    overrides: list[str] | None,
    checkpoint: Path | None,
    *,
    random_init: bool,
    target: str | None,
    repository: Path | None,
    fp16: bool = False,
    download: bool = True,
) -> ExportPlan:
    """The options as config overrides, composed once; the checkpoint obtained (verified,
    downloaded when ``download``) unless the composed ``export.random_init`` is true."""
    from triton_sam.export import ExportOptions
    from triton_sam.repository.config import RepositoryOptions
    from triton_sam.setup.pipeline import obtain_checkpoint

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
    return ExportPlan(cfg, spec, repository or Path(cfg.paths.repository), args)


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
    from triton_sam.repository.everything_job import serves_everything
    from triton_sam.repository.session_config import SessionOptions
    from triton_sam.setup.pipeline import build_repository

    plan = export_plan(
        model, overrides, checkpoint, random_init=random_init, fp16=fp16, target=target,
        repository=repository, download=download,
    )  # fmt: skip
    repo = plan.repository
    session = session_options(section(plan.cfg, "session"), SessionOptions)
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
    # An optional model refused by its export gate: the rest is written and servable, but the
    # command must not look like a success (a script would ship a repository without it).
    for name, why in build.not_written.items():
        typer.echo(f"NOT written: {name}: {why}", err=True)
    if build.not_written:
        raise typer.Exit(1)
    typer.echo(NEXT_SERVE)
