"""The whole data flow in one call: checkpoint -> ONNX pair -> Triton model repository.

The CLI, the demo and the tests all go through :func:`build_repository`, so what the tests
check is what users run.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triton_sam.errors import InputValidationError
from triton_sam.export import ExportOptions, ExportResult, export_model, save_random_checkpoint
from triton_sam.models.checkpoints import provenance, resolve_checkpoint
from triton_sam.models.download import download_checkpoint
from triton_sam.models.registry import is_concept_family
from triton_sam.models.spec import GraphSpec, ModelSpec
from triton_sam.repository.artifacts import graph_artifacts
from triton_sam.repository.concept import ConceptOptions
from triton_sam.repository.config import RepositoryOptions
from triton_sam.repository.everything_job import everything_artifact, serves_everything
from triton_sam.repository.lambda_config import lambda_artifact_for
from triton_sam.repository.large_config import large_artifact, serves_large
from triton_sam.repository.session_config import SessionOptions, session_artifact
from triton_sam.repository.video_config import TrackerOptions
from triton_sam.repository.writer import write_models

log = logging.getLogger(__name__)


@dataclass
class RepositoryBuild:
    """What :func:`build_repository` produced.

    Attributes:
        export: paths, timings and errors of the export (paths point into a removed scratch
            directory once the call returns; the writer copied the files into the repository,
            and their sizes are kept in ``onnx_bytes``).
        models: Triton model names written, encoder first (concept families: vision, text,
            decoder, then the serving model).
        onnx_bytes: size of each model's ONNX file(s) in bytes, by model name.
        checkpoint: the checkpoint used, or None for random init.
        session_model: the server-side embedding session model written, or None.
        metadata: what was written into the graphs' ONNX ``metadata_props``: the variant and
            the checkpoint's file name, sha256 and origin (published / recorded / user).
        not_written: optional models refused by their export gate, by model name, with the
            gate's message (the everything decoder, and the everything job model over it).
            Everything else was written; a caller reports these and fails (the CLI exits 1).
    """

    export: ExportResult
    models: tuple[str, ...]
    onnx_bytes: dict[str, int]
    checkpoint: Path | None
    session_model: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    not_written: dict[str, str] = field(default_factory=dict)


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
    if spec.checkpoint.hf_repo:
        return _obtain_hf_checkpoint(spec, checkpoint, checkpoints_dir, download, progress)
    if checkpoint is not None or not download:
        return resolve_checkpoint(spec.checkpoint, checkpoint, checkpoints_dir)
    return download_checkpoint(spec.checkpoint, checkpoints_dir, progress=progress)


def _obtain_hf_checkpoint(
    spec: ModelSpec, checkpoint: Path | None, checkpoints_dir: Path, download: bool, progress: bool
) -> Path:
    """A Hugging Face model directory: the given one, a cached snapshot, or a download."""
    from triton_sam.errors import CheckpointError
    from triton_sam.models.hf_hub import download_hf_checkpoint

    local = checkpoint if checkpoint is not None else checkpoints_dir / spec.checkpoint.filename
    if (local / "config.json").is_file() and (checkpoint is not None or not download):
        return local
    if checkpoint is not None or not download:
        raise CheckpointError(
            f"checkpoint: {local} is not a Hugging Face model directory (no config.json); "
            f"run `triton-sam download {spec.name}` (gated: `hf auth login` first)"
        )
    return download_hf_checkpoint(spec.checkpoint, checkpoints_dir, progress=progress)


def build_repository(
    spec: ModelSpec,
    repository: Path,
    *,
    checkpoint: Path | None,
    random_init: bool = False,
    export_options: ExportOptions | None = None,
    repository_options: RepositoryOptions | None = None,
    work_dir: Path | None = None,
    session: SessionOptions | None = SessionOptions(),  # noqa: B008 - frozen, immutable
    checkpoints_dir: Path = Path("checkpoints"),
    concept: ConceptOptions | None = None,
    everything: bool = False,
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
        session: bounds of the ``<family>_session`` model (server-side embeddings, see
            ``serving/embedding_cache_model.py``), written beside the pair; None writes none.
            SAM2.1 also gets the ``sam2`` model over it (the Lambda seed's JSON contract,
            ``repository/lambda_config.py``), unless a ``sam2`` model of the user's own is
            there. With ``everything``, SAM1 and SAM2.1 also get ``<family>_everything``
            over it (segment everything, ``repository/everything_job.py``), and SAM1 and
            SAM2.1 always get ``<family>_large`` (large images, ``repository/large_config.py``).
        checkpoints_dir: the checkpoints directory, to tell a verified download from a
            user's file in the recorded provenance.
        concept: bounds of a concept family's serving model (``ConceptOptions``; default
            when None). Concept families write four graphs and the serving model instead
            of a pair (``repository/concept.py``).
        everything: also export and write ``<family>_everything_decoder`` (SAM1, SAM2.1:
            segment everything, ``repository/everything_decoder.py``), after the pair's models.
            Optional: if its export gate refuses it, everything else is still written and the
            refusal is in ``RepositoryBuild.not_written`` (and logged as a warning).

    Raises:
        InputValidationError: neither a checkpoint nor ``random_init``.
        ExportError, ExportValidationError, RepositoryError: from the stages.
    """
    with _scratch(spec, repository, checkpoint, random_init, work_dir, "export") as work:
        scratch, weights = work
        if random_init:
            used: Path | None = None
            origin = {
                "triton_sam.checkpoint": "random-init",
                "triton_sam.checkpoint_origin": "random",
            }
        else:
            used = weights
            origin = provenance(spec.checkpoint, weights, checkpoints_dir)
            log.info(
                "exporting %s from %s (sha256 %s, %s)",
                spec.name,
                weights,
                origin["triton_sam.checkpoint_sha256"],
                origin["triton_sam.checkpoint_origin"],
            )
        metadata = {"triton_sam.variant": spec.name, **origin}
        options = repository_options or RepositoryOptions()
        if is_concept_family(spec.family):
            return _build_concept(
                spec,
                repository,
                weights,
                used,
                scratch,
                export_options,
                options,
                concept,
                metadata,
            )
        result = export_model(spec, weights, scratch / "onnx", export_options, metadata=metadata)
        graphs = spec.family.graphs
        artifacts = graph_artifacts(graphs, result.graphs, options)
        extra, refused = _everything_artifacts(spec, weights, scratch, options, everything)
        if session is not None:
            artifacts.append(session_artifact(spec.family, options, session))
            contract = lambda_artifact_for(repository, spec.family, options, session)
            if contract is not None:
                artifacts.append(contract)
            if serves_large(spec.family):  # images larger than SAM's input, over the session
                artifacts.append(large_artifact(spec.family))
            if everything and serves_everything(spec.family):  # over the session + its graph
                job = everything_artifact(spec.family, session)
                if refused:
                    refused[job.name] = "not written: its everything decoder was refused"
                else:
                    artifacts.append(job)
        # One atomic set: a restarted server never sees a new encoder beside an old session
        # model, or the other way round.
        written = [p.name for p in write_models(repository, artifacts + extra)]
        names = tuple(written[: len(graphs)])
        session_model = written[len(graphs)] if session is not None else None
        return RepositoryBuild(
            export=result,
            models=names,
            onnx_bytes=_onnx_bytes(result, graphs, names),
            checkpoint=used,
            session_model=session_model,
            metadata=metadata,
            not_written=refused,
        )


def _everything_artifacts(
    spec: ModelSpec, weights: Path, scratch: Path, options: RepositoryOptions, everything: bool
) -> tuple[list, dict[str, str]]:
    """The everything decoder of ``spec`` (exported from the same weights) as an artifact,
    and the models refused by its export gate (model name -> why).

    The decoder is optional: if its gate refuses it, the pair and the session model are
    still written (one optional graph must not take the whole repository down), and the
    refusal is logged as a warning and returned, never swallowed.
    """
    from triton_sam.errors import ExportValidationError
    from triton_sam.export.everything import export_for_spec
    from triton_sam.repository.everything_decoder import everything_decoder_artifact
    from triton_sam.serving.everything import graph_name

    if not everything:
        return [], {}
    try:
        path = export_for_spec(spec, weights, scratch / "onnx")
    except ExportValidationError as e:
        name = graph_name(spec.family.family)
        log.warning("%s NOT written (the other models are): %s", name, e)
        return [], {name: str(e)}
    return [everything_decoder_artifact(spec.family, path, options)], {}


@contextmanager
def _scratch(
    spec: ModelSpec,
    repository: Path,
    checkpoint: Path | None,
    random_init: bool,
    work_dir: Path | None,
    stage: str,
) -> Iterator[tuple[Path, Path]]:
    """A scratch directory for an export of ``spec`` into ``repository`` and the weights to
    export: ``checkpoint``, or the official config's random initialisation saved into the
    scratch directory (loaded through the same path as a real checkpoint). The scratch
    directory sits beside the repository (never in it, where Triton would try to load it)
    and is removed when the block ends.

    Raises:
        InputValidationError: neither a checkpoint nor ``random_init``.
    """
    if checkpoint is None and not random_init:
        raise InputValidationError(
            "checkpoint", "no checkpoint given; download one or pass random_init=True"
        )
    repository.mkdir(parents=True, exist_ok=True)
    scratch = Path(
        tempfile.mkdtemp(
            prefix=f".{repository.resolve().name}.{stage}-",
            dir=work_dir or repository.resolve().parent,
        )
    )
    try:
        if random_init:
            log.warning("exporting %s with RANDOM weights: masks will be meaningless", spec.name)
            checkpoint = save_random_checkpoint(spec, scratch / spec.checkpoint.filename)
        assert checkpoint is not None  # checked above
        yield scratch, checkpoint
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _build_concept(
    spec: ModelSpec,
    repository: Path,
    checkpoint: Path | None,
    used: Path | None,
    scratch: Path,
    export_options: ExportOptions | None,
    options: RepositoryOptions,
    concept: ConceptOptions | None,
    metadata: dict[str, str],
) -> RepositoryBuild:
    """Export a concept family's four graphs and write them with the serving model."""
    from triton_sam.export import graph_edits
    from triton_sam.export.concept_graphs import export_graphs
    from triton_sam.repository.concept import write_concept_models

    result = export_graphs(spec, checkpoint, scratch / "onnx", export_options)
    for path in result.graphs.values():
        graph_edits.set_metadata(path, metadata)
    names = write_concept_models(
        repository,
        spec.family,
        graphs=result.graphs,
        tokenizer=result.tokenizer,
        pad_token_id=result.pad_token_id,
        options=options,
        concept=concept,
    )
    return RepositoryBuild(
        export=result,  # type: ignore[arg-type]  # same reporting fields as ExportResult
        models=tuple(names),
        onnx_bytes=_onnx_bytes(result, spec.family.graphs, names),
        checkpoint=used,
        session_model=names[-1],
        metadata=metadata,
    )


def _onnx_bytes(result: Any, graphs: Sequence[GraphSpec], names: Sequence[str]) -> dict[str, int]:
    """Bytes of each graph's files (graph and sidecars), by the model name it was written as.

    ``result`` is an export result with ``graphs`` (role -> path) and ``files()``.
    """
    files = result.files()
    return {
        name: sum(p.stat().st_size for p in files if p.name.startswith(result.graphs[g.role].stem))
        for g, name in zip(graphs, names, strict=False)
    }


@dataclass
class VideoRepositoryBuild:
    """What :func:`build_video_repository` produced.

    Attributes:
        models: Triton model names written (five graphs, then the tracker).
        max_abs_error: the export's ORT-vs-torch errors per ``graph.output``.
        seconds: wall time per export stage.
    """

    models: list[str]
    max_abs_error: dict[str, float]
    seconds: dict[str, float]


def build_video_repository(
    spec: ModelSpec,
    repository: Path,
    *,
    checkpoint: Path | None,
    random_init: bool = False,
    export_options: ExportOptions | None = None,
    repository_options: RepositoryOptions | None = None,
    tracker_options: TrackerOptions | None = None,
    work_dir: Path | None = None,
) -> VideoRepositoryBuild:
    """Export the tracking graphs of ``spec`` and write them with its tracker model
    (``sam2_tracker`` for SAM2.1 variants, ``sam3_tracker`` for sam3_tracker).

    Raises:
        InputValidationError: neither a checkpoint nor ``random_init``; another family.
        ExportError, ExportValidationError, RepositoryError: from the stages.
    """
    from triton_sam.export.sam2_video import export_video
    from triton_sam.repository.video_config import write_video_models

    if spec.family.family == "sam3":
        from triton_sam.setup.sam3_video import build_sam3_video

        return VideoRepositoryBuild(
            *build_sam3_video(
                repository,
                checkpoint=checkpoint,
                random_init=random_init,
                export_options=export_options,
                repository_options=repository_options,
                tracker_options=tracker_options,
                work_dir=work_dir,
            )
        )
    if spec.family.family != "sam2":
        raise InputValidationError(
            "model",
            f"video tracking is exported for SAM2.1 variants and sam3_tracker, got {spec.name!r}",
        )
    with _scratch(spec, repository, checkpoint, random_init, work_dir, "video-export") as work:
        scratch, weights = work
        result = export_video(spec, weights, scratch / "onnx", export_options)
        models = write_video_models(
            repository,
            result.graphs,
            result.tracker_config,
            repository_options or RepositoryOptions(),
            tracker_options,
        )
        return VideoRepositoryBuild(models, result.max_abs_error, result.seconds)
