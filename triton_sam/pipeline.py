"""The whole data flow in one call: checkpoint -> ONNX pair -> Triton model repository.

The CLI, the demo and the tests all go through :func:`build_repository`, so what the tests
check is what users run.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from triton_sam.errors import InputValidationError
from triton_sam.export import ExportOptions, ExportResult, export_model, save_random_checkpoint
from triton_sam.models.checkpoints import download_checkpoint, resolve_checkpoint
from triton_sam.models.spec import ModelSpec
from triton_sam.repository.config import RepositoryOptions
from triton_sam.repository.writer import write_pair

log = logging.getLogger(__name__)


@dataclass
class RepositoryBuild:
    """What :func:`build_repository` produced.

    Attributes:
        export: paths, timings and errors of the export (paths point into a removed scratch
            directory once the call returns; the writer copied the files into the repository,
            and their sizes are kept in ``onnx_bytes``).
        models: Triton model names written, encoder first.
        onnx_bytes: size of each model's ONNX file(s) in bytes, by model name.
        checkpoint: the checkpoint used, or None for random init.
    """

    export: ExportResult
    models: tuple[str, str]
    onnx_bytes: dict[str, int]
    checkpoint: Path | None


def obtain_checkpoint(
    spec: ModelSpec,
    *,
    checkpoint: Path | None,
    checkpoints_dir: Path,
    download: bool = True,
    progress: bool = True,
) -> Path:
    """Return a verified checkpoint: the given file, the cached one, or a fresh download.

    Raises:
        CheckpointError / DownloadError / IntegrityError: with what to do next.
    """
    if checkpoint is not None or not download:
        return resolve_checkpoint(spec.checkpoint, checkpoint, checkpoints_dir)
    return download_checkpoint(spec.checkpoint, checkpoints_dir, progress=progress)


def build_repository(
    spec: ModelSpec,
    repository: Path,
    *,
    checkpoint: Path | None,
    random_init: bool = False,
    export_options: ExportOptions | None = None,
    repository_options: RepositoryOptions | None = None,
    work_dir: Path | None = None,
) -> RepositoryBuild:
    """Export ``spec`` and write its encoder/decoder models into ``repository``.

    Args:
        spec: the variant.
        repository: Triton model repository directory (created if needed).
        checkpoint: a verified official-format checkpoint; required unless ``random_init``.
        random_init: export the official config's random initialisation instead (offline
            testing); a random-init checkpoint is written to the scratch dir and loaded
            through the same path as a real one.
        export_options / repository_options: see their classes.
        work_dir: scratch parent for the export (default: the repository's parent; never
            the repository itself, where Triton would try to load the scratch directory).

    Raises:
        InputValidationError: neither a checkpoint nor ``random_init``.
        ExportError, ExportValidationError, RepositoryError: from the stages.
    """
    if checkpoint is None and not random_init:
        raise InputValidationError(
            "checkpoint", "no checkpoint given; download one or pass random_init=True"
        )
    repository.mkdir(parents=True, exist_ok=True)
    scratch = Path(
        tempfile.mkdtemp(
            prefix=f".{repository.resolve().name}.export-",
            dir=work_dir or repository.resolve().parent,
        )
    )
    try:
        if random_init:
            log.warning("exporting %s with RANDOM weights: masks will be meaningless", spec.name)
            checkpoint = save_random_checkpoint(spec, scratch / spec.checkpoint.filename)
            used: Path | None = None
        else:
            used = checkpoint
        result = export_model(spec, checkpoint, scratch / "onnx", export_options)
        names = write_pair(
            repository,
            spec.family,
            encoder_onnx=result.encoder,
            decoder_onnx=result.decoder,
            options=repository_options or RepositoryOptions(),
        )
        sizes = {
            name: sum(p.stat().st_size for p in _graph_files(result, graph))
            for name, graph in zip(names, ("encoder", "decoder"), strict=True)
        }
        return RepositoryBuild(export=result, models=names, onnx_bytes=sizes, checkpoint=used)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _graph_files(result: ExportResult, graph: str) -> list[Path]:
    path = result.encoder if graph == "encoder" else result.decoder
    return [p for p in result.files() if p.name.startswith(path.stem)]
