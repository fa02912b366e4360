"""Write models into a Triton model repository, atomically.

Layout per model::

    <repo>/<name>/config.pbtxt
    <repo>/<name>/1/model.onnx       (+ external-data sidecars, under their own names)
    <repo>/<name>/1/model.py         (python target only: a copy of runner_model.py)

A model is built in a hidden staging directory beside the repository (in its parent, so the
final rename stays on one filesystem) and swapped in with renames, so a crash leaves either the
old model or the new one, never half of either. Leftovers of a crash are cleaned (or the old
model restored) by the next write of that name. Staging never lives inside the repository:
Triton tries to load every subdirectory, hidden ones included (seen on 2.51), so a leftover
there would stop the server (and the docker container) from starting.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from triton_sam.errors import InputValidationError, RepositoryError
from triton_sam.models.spec import FamilySpec, GraphSpec
from triton_sam.repository import cpu_graphs
from triton_sam.repository.config import (
    CPU_MAX_CONCURRENT_EMBEDS,
    CPU_MAX_WAITING_EMBEDS,
    ONNX_FILE_PARAM,
    ONNX_FILENAME,
    TARGETS,
    ModelConfig,
    RepositoryOptions,
    Target,
    background_cpu_encoder,
    bounded_cpu_encoder,
    check_model_name,
    config_to_text,
    decoder_slots,
    graph_config,
    model_config_pb2,
    model_kind,
    parse_config,
    size_cpu_decoder,
    to_cpu_twin,
    to_python_target,
    unbatched_cpu_decoder,
    with_cpu_instances,
    with_warmup,
)
from triton_sam.repository.onnx_check import check_onnx_config
from triton_sam.repository.shipping import imported_modules
from triton_sam.serving import protocol
from triton_sam.serving.protocol import embedding_cache

CONFIG_FILENAME = "config.pbtxt"
VERSION = "1"
RUNNER_NAME = "model.py"  # what the python backend loads
SERVING_DIR = Path(__file__).resolve().parent.parent / "serving"
RUNNER_SOURCE = SERVING_DIR / "runner_model.py"
RUNNER_MODULES = imported_modules(RUNNER_SOURCE)  # what it imports
SHIPPED_PACKAGE = protocol.SHIPPED_PACKAGE  # what a python model imports beside its model.py
# Every package a triton-sam has shipped beside its python models' model.py: today's, and the
# tracking package of the first trackers. A python model whose version directory holds one was
# written by triton-sam; any other python model is the user's own (see embedded_twin).
OUR_PACKAGES = (SHIPPED_PACKAGE, "triton_sam_tracking")
_STAGING = ".{repo}.{name}.staging-"
_RETIRED = ".{repo}.{name}.old-"


def shipped_modules(modules: Sequence[str]) -> dict[str, Path]:
    """Version-directory files that ship ``triton_sam.serving`` modules as ``SHIPPED_PACKAGE``.

    Args:
        modules: paths relative to ``triton_sam/serving`` without ``.py``
            (``"protocol/tracker"``); every package ``__init__`` on the way must be listed.
    """
    return {f"{SHIPPED_PACKAGE}/{m}.py": SERVING_DIR / f"{m}.py" for m in modules}


def write_model(
    repo_dir: str | os.PathLike[str],
    name: str,
    onnx_path: str | os.PathLike[str],
    config_text: str,
    *,
    target: Target,
    external_data_files: Sequence[str | os.PathLike[str]] = (),
    link: bool = False,
) -> Path:
    """Write ``repo_dir/<name>/{config.pbtxt, 1/model.onnx}`` atomically.

    Args:
        repo_dir: the model repository (created if missing).
        name: Triton model name; must equal the ``name`` in ``config_text``.
        onnx_path: the ONNX graph, copied to ``1/model.onnx``.
        config_text: the ``config.pbtxt`` content (see ``render_config``).
        target: ``"onnxruntime"`` or ``"python"`` (adds ``1/model.py``, the onnxruntime runner).
        external_data_files: weight sidecars of ``onnx_path``, copied beside it under their
            own names (the graph refers to them by name).
        link: symlink the ONNX files instead of copying them (for repositories that reuse
            another repository's files, see :func:`embedded_repository`).

    Returns:
        The model directory.

    Raises:
        InputValidationError: a bad model name.
        RepositoryError: a missing source file, a config that disagrees with ``name`` or
            ``target``, or a filesystem error (the message names the path).
    """
    repo_dir = Path(repo_dir)
    sources = _model_sources(name, onnx_path, config_text, target, external_data_files)
    return _write_staged(repo_dir, name, config_text, sources, link=link)


def _model_sources(
    name: str,
    onnx_path: str | os.PathLike[str],
    config_text: str,
    target: Target,
    external_data_files: Sequence[str | os.PathLike[str]],
) -> dict[str, Path]:
    """What goes into ``<name>/1/``: file name there -> source file (checked to exist)."""
    check_model_name(name)
    _check_target(name, config_text, target)
    sidecars = {Path(p).name: Path(p) for p in external_data_files}
    if {ONNX_FILENAME, RUNNER_NAME} & set(sidecars):
        raise RepositoryError(
            f"{name}: an external-data file is named {ONNX_FILENAME} or {RUNNER_NAME}: "
            f"{sorted(sidecars)}; those names are the model's own files"
        )
    sources = {ONNX_FILENAME: Path(onnx_path)} | sidecars
    if target == "python":
        sources[RUNNER_NAME] = RUNNER_SOURCE
        sources |= shipped_modules(RUNNER_MODULES)
    _check_sources(sources)
    return sources


def _stage(
    repo_dir: Path,
    name: str,
    config_text: str,
    sources: dict[str, Path],
    *,
    link: bool,
    extra: Mapping[str, Path] | None = None,
) -> Path:
    """A complete model directory beside the repository, ready to be renamed into it."""
    try:
        repo_dir.mkdir(parents=True, exist_ok=True)
        _recover(repo_dir, name)
        staging = Path(
            tempfile.mkdtemp(prefix=_prefix(_STAGING, repo_dir, name), dir=_side_dir(repo_dir))
        )
    except OSError as e:
        raise RepositoryError(f"{repo_dir}: cannot prepare the repository: {e}") from e
    try:
        _fill(staging, config_text, sources, link=link, extra=extra or {})
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise RepositoryError(
            f"{repo_dir / name}: writing the model failed, left unchanged: {e}"
        ) from e
    return staging


def _write_staged(
    repo_dir: Path, name: str, config_text: str, sources: dict[str, Path], *, link: bool
) -> Path:
    """Stage one model beside the repository, then swap it in (or leave the old one)."""
    staging = _stage(repo_dir, name, config_text, sources, link=link)
    dest = repo_dir / name
    try:
        _swap(staging, dest)
    except OSError as e:
        raise RepositoryError(f"{dest}: writing the model failed, left unchanged: {e}") from e
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


@dataclass(frozen=True)
class ModelFiles:
    """One model to write: its name, its ``config.pbtxt`` and what goes into ``<name>/1/``.

    Attributes:
        name: Triton model name (the directory; must equal the name in ``config_text``).
        config_text: the ``config.pbtxt`` content.
        files: path under ``<name>/1/`` (``model.onnx``, ``model.py``, ``pkg/mod.py``...) ->
            source file to copy there.
        extra: path under ``<name>/`` outside ``1/`` (another version, a labels file beside
            the config) -> source file; what a model of the user's own may hold, carried as
            it is (our models have none).
    """

    name: str
    config_text: str
    files: Mapping[str, Path]
    extra: Mapping[str, Path] = field(default_factory=dict)


def write_pair(
    repo_dir: str | os.PathLike[str], family: FamilySpec, **graphs: Any
) -> tuple[str, str]:
    """Write a family's encoder and decoder models as one atomic set.

    Args:
        repo_dir: the model repository.
        family: the family spec.
        graphs: :func:`pair_artifacts`' keyword arguments (``encoder_onnx``,
            ``decoder_onnx``, ``options``, optional ``encoder_name`` / ``decoder_name``).

    Returns:
        The two model names, encoder first.

    Raises:
        RepositoryError / InputValidationError: as :func:`pair_artifacts` and
            :func:`write_models`.
    """
    encoder, decoder = pair_artifacts(family, **graphs)
    write_models(repo_dir, [encoder, decoder])
    return encoder.name, decoder.name


def pair_artifacts(
    family: FamilySpec,
    *,
    encoder_onnx: str | os.PathLike[str],
    decoder_onnx: str | os.PathLike[str],
    options: RepositoryOptions,
    encoder_name: str | None = None,
    decoder_name: str | None = None,
) -> list[ModelFiles]:
    """A family's encoder and decoder (configs rendered from ``options``), encoder first:
    :func:`graph_artifacts` of ``family.graphs``.

    Raises:
        RepositoryError / InputValidationError: as :func:`graph_artifacts`.
    """
    return graph_artifacts(
        family.graphs,
        {"encoder": encoder_onnx, "decoder": decoder_onnx},
        options,
        names={"encoder": encoder_name, "decoder": decoder_name},
    )


def graph_artifacts(
    graphs: Sequence[GraphSpec],
    onnx: Mapping[str, str | os.PathLike[str]],
    options: RepositoryOptions,
    *,
    names: Mapping[str, str | None] | None = None,
    configs: Mapping[str, ModelConfig] | None = None,
) -> list[ModelFiles]:
    """The models of a family's declared graphs, however many, in the order given.

    Args:
        graphs: the graphs (``family.graphs``).
        onnx: role -> the exported ``.onnx``; its external-data sidecars go along.
        options: target and serving options (bounds per ``GraphSpec.batching``).
        names: role -> Triton model name (None or absent: ``GraphSpec.model``).
        configs: role -> a config already built (by :func:`~.config.graph_config`) where
            the caller adjusts it; the others are rendered from ``options``.

    Raises:
        RepositoryError / InputValidationError: as :func:`write_model`; a role without a
            graph; for the ``onnxruntime`` target also a config its graph contradicts in a
            way Triton's onnxruntime backend refuses (see ``repository.onnx_check``), before
            anything is written.
    """
    names, configs = names or {}, configs or {}
    artifacts = []
    for graph in graphs:
        if graph.role not in onnx:
            raise RepositoryError(f"no exported graph for {graph.role!r}: got {sorted(onnx)}")
        if graph.role in configs:
            config = configs[graph.role]
        else:
            config = graph_config(graph, options, name=names.get(graph.role))
        artifacts.append(onnx_artifact(config, onnx[graph.role], target=options.target))
    return artifacts


def onnx_artifact(
    config: ModelConfig, onnx_path: str | os.PathLike[str], *, target: Target
) -> ModelFiles:
    """The model of one ONNX graph with its config; for the ``onnxruntime`` target the
    config is first checked against the graph as the GPU container would check it.

    Raises:
        RepositoryError / InputValidationError: as :func:`onnx_model_files`, or a config
            the graph contradicts.
    """
    if target == "onnxruntime":
        check_onnx_config(config, Path(onnx_path))
    return onnx_model_files(config.name, onnx_path, config_to_text(config), target=target)


def onnx_model_files(
    name: str, onnx_path: str | os.PathLike[str], config_text: str, *, target: Target
) -> ModelFiles:
    """The files of an ONNX model: the graph, its external-data sidecars, and for the
    ``python`` target the runner (see :func:`write_model`).

    Raises:
        InputValidationError / RepositoryError: as :func:`write_model`.
    """
    path = Path(onnx_path)
    sources = _model_sources(name, path, config_text, target, _sidecars(path))
    return ModelFiles(name, config_text, sources)


def write_models(
    repo_dir: str | os.PathLike[str], models: Sequence[ModelFiles], *, link: bool = False
) -> list[Path]:
    """Write any number of models atomically as a set: every model is staged (copied) beside
    the repository first, then all are swapped in; a failure leaves every old model in place.

    Args:
        link: symlink the files instead of copying them, python sources excepted (for
            repositories that reuse another repository's files, see
            :func:`embedded_repository`).

    Returns:
        The model directories, in the order given.

    Raises:
        InputValidationError: a bad model name.
        RepositoryError: a missing source file, a config naming another model, a duplicate
            name, or a filesystem error (the message names the path).
    """
    repo_dir = Path(repo_dir)
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise RepositoryError(f"{repo_dir}: duplicate model names in one write: {names}")
    staged: list[tuple[Path, Path]] = []
    try:
        for model in models:
            check_model_name(model.name)
            if parse_config(model.config_text).name != model.name:
                raise RepositoryError(
                    f"{model.name}: config.pbtxt names another model; Triton requires it to "
                    "equal the directory name"
                )
            sources = {k: Path(v) for k, v in model.files.items()}
            extra = {k: Path(v) for k, v in model.extra.items()}
            _check_sources(sources | extra)
            staging = _stage(
                repo_dir, model.name, model.config_text, sources, link=link, extra=extra
            )
            staged.append((staging, repo_dir / model.name))
        _swap_all(staged)
    finally:
        for staging, _ in staged:
            shutil.rmtree(staging, ignore_errors=True)
    return [dest for _, dest in staged]


def _swap_all(staged: Sequence[tuple[Path, Path]]) -> None:
    """Swap every (staging, dest) in; on a failure, put back the ones already swapped."""
    done: list[tuple[Path, Path | None]] = []  # (dest, retired old model)
    try:
        for staging, dest in staged:
            done.append((dest, _swap_in(staging, dest)))
    except OSError as e:
        for dest, retired in reversed(done):
            shutil.rmtree(dest, ignore_errors=True)
            if retired is not None:
                os.rename(retired, dest)
        raise RepositoryError(
            f"{staged[len(done)][1]}: writing the models failed, left unchanged: {e}"
        ) from e
    for _, retired in done:
        if retired is not None:
            shutil.rmtree(retired, ignore_errors=True)


def list_models(repo_dir: str | os.PathLike[str]) -> list[str]:
    """Names of the models in ``repo_dir`` (directories holding a ``config.pbtxt``), sorted.

    Raises:
        RepositoryError: ``repo_dir`` is not a directory.
    """
    repo_dir = Path(repo_dir)
    if not repo_dir.is_dir():
        raise RepositoryError(f"{repo_dir}: model repository not found (not a directory)")
    return sorted(
        p.name
        for p in repo_dir.iterdir()
        if not p.name.startswith(".") and (p / CONFIG_FILENAME).is_file()
    )


def embedded_repository(
    repo_dir: str | os.PathLike[str],
    twin_dir: str | os.PathLike[str] | None = None,
    *,
    target: Target = "onnxruntime",
    fuse_attention: bool = True,
    background_encoder: bool = True,
) -> Path:
    """A repository the embedded tritonserver (a CPU host) can serve, derived from ``repo_dir``.

    Reads every model as an artifact (:func:`read_model`), maps each through
    :func:`embedded_twin` (the one place that decides a model's twin, by its kind) and writes
    the result. The changes on top are CPU choices, not CPU limits, all measured (on the
    onnxruntime backend): the decoder a session model calls gets instances and threads sized
    for this host's cores (:func:`~triton_sam.repository.config.size_cpu_decoder`), unless
    its config sets ``intra_op_thread_count`` itself; the session model's clicks run on an
    unbatched copy of it (:func:`~.config.unbatched_cpu_decoder`, same files; the session
    model bounds and cancels them itself), while clients calling the decoder keep its
    batcher; and with ``fuse_attention`` the encoder it calls is served as a copy with fused
    attention where its family has a fusion (:mod:`~triton_sam.repository.cpu_graphs`;
    faster on CPU, fp32 parity); with ``background_encoder`` the session model's embeds run
    on a copy of that encoder at a lower CPU priority, so clicks keep the cores during a storm
    of embeds (:func:`~.config.background_cpu_encoder`). The production repository's graphs
    are never changed.
    Models of the user's own are served as they are (see :func:`embedded_twin`).
    When nothing changes, ``repo_dir`` itself is returned; otherwise the twins are written to
    ``twin_dir`` (default: ``<repo>_embedded`` beside it) as one atomic set, with symlinks to
    the original ONNX files, so nothing large is copied; models no longer in ``repo_dir`` are
    removed from it.

    Raises:
        InputValidationError: an unknown ``target``.
        RepositoryError: no models, or as :func:`embedded_twin` (a model on a backend the
            embedded server lacks, a stale python model of ours, a missing export, an
            onnxruntime config its graph contradicts).
    """
    if target not in TARGETS:
        raise InputValidationError("target", f"got {target!r}, expected one of {list(TARGETS)}")
    repo_dir = Path(repo_dir)
    names = list_models(repo_dir)
    if not names:
        raise RepositoryError(f"{repo_dir}: no models (directories with {CONFIG_FILENAME})")
    models = [read_model(repo_dir, name) for name in names]
    twins = [embedded_twin(model, target) for model in models]
    twin_dir = Path(twin_dir) if twin_dir else repo_dir.with_name(repo_dir.name + "_embedded")
    if target == "onnxruntime":  # decoders behind a session model: sized for this host's cores
        twins = _size_session_decoders(twins, len(os.sched_getaffinity(0)))
        twins = _bound_session_embeds(twins)
        if fuse_attention:
            twins = _fuse_session_encoders(twins, cpu_graphs.cache_dir_for(twin_dir))
        if background_encoder:
            twins = _background_session_encoders(twins, len(os.sched_getaffinity(0)))
    twins = _fit_ensembles(twins)
    if len(twins) == len(models) and all(
        _same_model(m, t) for m, t in zip(models, twins, strict=True)
    ):
        return repo_dir
    write_models(twin_dir, twins, link=True)
    for stale in set(list_models(twin_dir)) - {t.name for t in twins}:
        shutil.rmtree(twin_dir / stale, ignore_errors=True)
    return twin_dir


def _size_session_decoders(twins: list[ModelFiles], cores: int) -> list[ModelFiles]:
    """``twins`` with the decoders their session models call sized for ``cores``, plus an
    unbatched copy of each (same files) that the session models call instead, with their
    ``decoder_slots``. A decoder without a dynamic batcher (a twin's copy, served again) is
    called as it is."""
    configs = [parse_config(t.config_text) for t in twins]
    key, slots = embedding_cache.PARAM_DECODER_MODEL, embedding_cache.PARAM_DECODER_SLOTS
    decoders = _session_callees(configs, key)
    taken = {t.name for t in twins}
    out, clicks = [], {}  # decoder name -> the config of the model its clicks run on
    for t, c in zip(twins, configs, strict=True):
        if t.name not in decoders:
            out.append(t)
            continue
        c = with_warmup(size_cpu_decoder(c, cores))
        out.append(ModelFiles(t.name, config_to_text(c), t.files))
        clicks[t.name] = c
        if c.HasField("dynamic_batching"):
            copy = unbatched_cpu_decoder(c)
            if copy.name not in taken:
                clicks[t.name] = copy
                out.append(ModelFiles(copy.name, config_to_text(copy), t.files))
    for t, c in zip(twins, configs, strict=True):
        if model_kind(c) != protocol.KIND_EMBEDDING_CACHE or key not in c.parameters:
            continue
        decoder = clicks.get(c.parameters[key].string_value)
        if decoder is None or decoder.HasField("dynamic_batching"):
            continue
        before = config_to_text(c)
        c.parameters[key].string_value = decoder.name
        if slots not in c.parameters:
            c.parameters[slots].string_value = str(decoder_slots(decoder))
        if config_to_text(c) != before:
            out[out.index(t)] = ModelFiles(t.name, config_to_text(c), t.files)
    return out


def _bound_session_embeds(twins: list[ModelFiles]) -> list[ModelFiles]:
    """``twins`` with the session models' embed admission lowered to what a CPU host
    serves (:data:`~.config.CPU_MAX_CONCURRENT_EMBEDS` at once, at most
    :data:`~.config.CPU_MAX_WAITING_EMBEDS` waiting) and the onnxruntime encoders they call
    at batch 1 (:func:`~.config.bounded_cpu_encoder`)."""
    configs = [parse_config(t.config_text) for t in twins]
    encoders = _session_callees(configs, embedding_cache.PARAM_ENCODER_MODEL)
    limits = {
        embedding_cache.PARAM_MAX_CONCURRENT_EMBEDS: CPU_MAX_CONCURRENT_EMBEDS,
        embedding_cache.PARAM_MAX_WAITING_EMBEDS: CPU_MAX_WAITING_EMBEDS,
    }
    out = []
    for t, c in zip(twins, configs, strict=True):
        before = config_to_text(c)
        if model_kind(c) == protocol.KIND_EMBEDDING_CACHE:
            for key, limit in limits.items():
                value = c.parameters[key].string_value if key in c.parameters else ""
                lowest = 1 if key == embedding_cache.PARAM_MAX_CONCURRENT_EMBEDS else 0
                if not value.isdigit() or not lowest <= int(value) <= limit:  # 0 slots: no bound
                    c.parameters[key].string_value = str(limit)
        elif t.name in encoders and _is_onnxruntime(c):
            c = bounded_cpu_encoder(c)
        text = config_to_text(c)
        out.append(t if text == before else ModelFiles(t.name, text, t.files))
    return out


def _background_session_encoders(twins: list[ModelFiles], cores: int) -> list[ModelFiles]:
    """``twins`` plus a background copy (:func:`~.config.background_cpu_encoder`, same
    files and the runner's) of each onnxruntime encoder a session model calls, which those
    session models call instead."""
    configs = [parse_config(t.config_text) for t in twins]
    key = embedding_cache.PARAM_ENCODER_MODEL
    encoders = _session_callees(configs, key)
    taken = {t.name for t in twins}
    added, renamed = [], {}
    for t, c in zip(twins, configs, strict=True):
        if t.name not in encoders or not _is_onnxruntime(c):
            continue
        background = background_cpu_encoder(c, cores)
        if background.name not in taken:
            files = dict(t.files) | {RUNNER_NAME: RUNNER_SOURCE} | shipped_modules(RUNNER_MODULES)
            added.append(ModelFiles(background.name, config_to_text(background), files))
        renamed[t.name] = background.name
    out = []
    for t, c in zip(twins, configs, strict=True):
        callee = c.parameters[key].string_value if key in c.parameters else None
        if model_kind(c) == protocol.KIND_EMBEDDING_CACHE and callee in renamed:
            c.parameters[key].string_value = renamed[callee]
            # image ids stay those of the encoder the clients know
            identity = embedding_cache.PARAM_ENCODER_IDENTITY
            if identity not in c.parameters:
                c.parameters[identity].string_value = callee
            t = ModelFiles(t.name, config_to_text(c), t.files)
        out.append(t)
    return out + added


def _fit_ensembles(twins: list[ModelFiles]) -> list[ModelFiles]:
    """``twins`` with each ensemble's ``max_batch_size`` lowered to the smallest of the models
    it runs: Triton refuses to load an ensemble that allows more than a step does, and a CPU
    twin serves some encoders at batch 1 (:func:`~.config.bounded_cpu_encoder`)."""
    configs = {t.name: parse_config(t.config_text) for t in twins}
    out = []
    for t in twins:
        c = configs[t.name]
        if c.platform != "ensemble":
            out.append(t)
            continue
        steps = [
            configs[s.model_name] for s in c.ensemble_scheduling.step if s.model_name in configs
        ]
        fit = min([c.max_batch_size, *(s.max_batch_size for s in steps if s.max_batch_size)])
        if fit == c.max_batch_size:
            out.append(t)
            continue
        c.max_batch_size = fit
        out.append(ModelFiles(t.name, config_to_text(c), t.files, t.extra))
    return out


def _session_callees(configs: list[ModelConfig], key: str) -> set[str]:
    """Names of the models session models call under parameter ``key``."""
    kind = protocol.KIND_EMBEDDING_CACHE
    return {
        c.parameters[key].string_value
        for c in configs
        if model_kind(c) == kind and key in c.parameters
    }


def _fuse_session_encoders(twins: list[ModelFiles], cache: Path) -> list[ModelFiles]:
    """``twins`` with the onnxruntime encoders session models call served with fused
    attention where :func:`~.cpu_graphs.fused_encoder_files` can fuse them."""
    configs = [parse_config(t.config_text) for t in twins]
    encoders = _session_callees(configs, embedding_cache.PARAM_ENCODER_MODEL)
    out = []
    for t, c in zip(twins, configs, strict=True):
        files = None
        if t.name in encoders and _is_onnxruntime(c):
            graph = c.default_model_filename or ONNX_FILENAME
            files = cpu_graphs.fused_encoder_files(t.name, dict(t.files), graph, cache)
        out.append(ModelFiles(t.name, t.config_text, files) if files else t)
    return out


def read_model(repo_dir: str | os.PathLike[str], name: str) -> ModelFiles:
    """The artifact of a model already in a repository: its config text, every file of its
    version directory (by path relative to it) and every other file of its directory
    (``extra``, by path relative to the model directory)."""
    model_dir = Path(repo_dir) / name
    extra = {
        path: source
        for path, source in _version_files(model_dir).items()
        if path != CONFIG_FILENAME and not path.startswith(f"{VERSION}/")
    }
    return ModelFiles(
        name,
        (model_dir / CONFIG_FILENAME).read_text(),
        _version_files(model_dir / VERSION),
        extra,
    )


def embedded_twin(model: ModelFiles, target: Target) -> ModelFiles:
    """The model a CPU host serves in place of ``model``: a pure function of the artifact
    (config and file references in, twin config and file references out), by its kind.

    - python BLS models (kinds ``protocol.KINDS``): one ``KIND_CPU`` instance, same files;
    - ONNX graphs on the python runner: as they are;
    - python models of the user's own (:func:`written_by_triton_sam` says no): as they are,
      ``KIND_GPU`` instance groups made ``KIND_CPU``;
    - ensembles: as they are (they run the models they name);
    - ``onnxruntime`` graphs: with ``target="onnxruntime"`` the same config on Triton's
      onnxruntime backend built for CPU (:func:`~.config.to_cpu_twin`), checked against its
      graph as that backend checks it; with ``target="python"`` the runner twin
      (:func:`~.config.to_python_target`) with the runner's files added, the fallback for a
      server without that backend.

    Raises:
        RepositoryError: a model on a backend the embedded server does not have, a python
            model of ours that is stale (see :func:`_python_twin`), a graph missing from the
            files (configs written, never exported), or an onnxruntime config its graph
            contradicts.
    """
    config = parse_config(model.config_text)
    if config.backend == "python":
        return _python_twin(model, config)
    if config.platform == "ensemble":
        return model
    if not _is_onnxruntime(config):
        raise RepositoryError(
            f"model {config.name!r}: platform={config.platform!r} backend={config.backend!r}; "
            "the embedded server runs onnxruntime, python and ensemble models only (serve "
            "this repository with the GPU container, or move the model out of it)"
        )
    graph = _graph_file(model, config.default_model_filename or ONNX_FILENAME)
    if target == "onnxruntime":
        twin = to_cpu_twin(config)
        check_onnx_config(twin, model.files[graph])
        return replace(model, config_text=config_to_text(twin))
    twin = to_python_target(config, onnx_file=graph)
    files = dict(model.files) | {RUNNER_NAME: RUNNER_SOURCE} | shipped_modules(RUNNER_MODULES)
    return replace(model, config_text=config_to_text(twin), files=files)


def written_by_triton_sam(model: ModelFiles) -> bool:
    """Whether triton-sam wrote this python model: its config declares a kind
    (:data:`protocol.KIND_PARAM`), or its version directory holds a package triton-sam ships
    beside ``model.py`` (:data:`OUR_PACKAGES`; every python model we have written ships one,
    kind or not). Anything else is a model of the user's own, whatever its name."""
    return model_kind(parse_config(model.config_text)) is not None or bool(_our_packages(model))


def _our_packages(model: ModelFiles) -> list[str]:
    return sorted({p.split("/")[0] for p in model.files} & set(OUR_PACKAGES))


def _python_twin(model: ModelFiles, config: ModelConfig) -> ModelFiles:
    """The CPU twin of a python-backend model (see :func:`embedded_twin`).

    Raises:
        RepositoryError: a model of ours that declares no kind (written by a triton-sam from
            before model kinds) or a kind this triton-sam does not know (a newer one): its
            twin cannot be told, and an old model.py would not speak today's protocol;
            a runner whose graph is missing.
    """
    kind = model_kind(config)
    if kind in protocol.KINDS:  # its state lives in its one instance
        return replace(model, config_text=config_to_text(single_cpu_instance(config)))
    if kind == protocol.KIND_RUNNER or (
        kind is None and _our_packages(model) and ONNX_FILE_PARAM in config.parameters
    ):  # the runner of a graph: a CPU host runs it as it is
        _graph_file(model, config.parameters[ONNX_FILE_PARAM].string_value)
        return model
    if kind is not None:
        raise RepositoryError(
            f"model {config.name!r}: declares {protocol.KIND_PARAM}={kind!r}, which this "
            f"triton-sam does not know (it knows {[*protocol.KINDS, protocol.KIND_RUNNER]}); "
            "written by a newer triton-sam: upgrade triton-sam, or rebuild the model with "
            "this one"
        )
    packages = _our_packages(model)
    if packages:
        raise RepositoryError(
            f"model {config.name!r}: a python model with triton-sam's package "
            f"{VERSION}/{packages[0]}/ but without the {protocol.KIND_PARAM!r} parameter, so "
            "written by an older triton-sam; rebuild it with the command that wrote it "
            "(`triton-sam setup <model>`, `triton-sam setup-video <model>`), or delete "
            f"the folder {config.name}/ if you no longer serve it"
        )
    twin = with_cpu_instances(config)  # the user's own model: as it is, on this host's CPU
    return model if twin == config else replace(model, config_text=config_to_text(twin))


def _graph_file(model: ModelFiles, graph: str) -> str:
    """``graph``, checked to be among the model's files.

    Raises:
        RepositoryError: it is not (configs written, models never exported).
    """
    if graph not in model.files:
        raise RepositoryError(
            f"{model.name}: its config needs {VERSION}/{graph}, which is missing: a model "
            "of triton-sam's never exported (run `triton-sam setup <model>` first, with "
            "--random-init when offline), or a model of your own without its graph"
        )
    return graph


def _same_model(a: ModelFiles, b: ModelFiles) -> bool:
    """Same files and the same config (as Triton reads it, not as its text is laid out)."""
    return (
        dict(a.files) == dict(b.files)
        and dict(a.extra) == dict(b.extra)
        and parse_config(a.config_text) == parse_config(b.config_text)
    )


def _is_onnxruntime(config: ModelConfig) -> bool:
    return config.platform == "onnxruntime_onnx" or config.backend == "onnxruntime"


def single_cpu_instance(config: ModelConfig) -> ModelConfig:
    """``config`` with one ``KIND_CPU`` instance (a BLS model's twin on a CPU host: its state
    lives in its one instance)."""
    twin = ModelConfig()
    twin.CopyFrom(config)
    del twin.instance_group[:]
    twin.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    return twin


def _version_files(version_dir: Path) -> dict[str, Path]:
    """Every file under a directory of a model (its version directory, or the model's own),
    by its path relative to it, compiled python caches left out."""
    return {
        p.relative_to(version_dir).as_posix(): p
        for p in sorted(version_dir.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def _check_target(name: str, config_text: str, target: Target) -> None:
    if target not in TARGETS:
        raise InputValidationError("target", f"got {target!r}, expected one of {list(TARGETS)}")
    config = parse_config(config_text)
    if config.name != name:
        raise RepositoryError(
            f"{name}: config.pbtxt names the model {config.name!r}; Triton requires it to "
            "equal the directory name"
        )
    if (config.backend == "python") != (target == "python"):
        raise RepositoryError(
            f"{name}: target={target!r} but the config has backend={config.backend!r} "
            f"platform={config.platform!r}; render the config for the same target"
        )


def _check_sources(sources: dict[str, Path]) -> None:
    for path in sources.values():
        if not path.is_file():
            raise RepositoryError(f"{path}: file not found")


def _fill(
    staging: Path,
    config_text: str,
    sources: dict[str, Path],
    *,
    link: bool,
    extra: Mapping[str, Path],
) -> None:
    version_dir = staging / VERSION  # made by its first file: a user's model may have no 1/
    if not sources and parse_config(config_text).platform == "ensemble":
        version_dir.mkdir()  # Triton loads an ensemble only with a version directory
    placed = {version_dir / name: source for name, source in sources.items()}
    placed |= {staging / name: source for name, source in extra.items()}
    for dest, source in placed.items():
        dest.parent.mkdir(parents=True, exist_ok=True)  # pkg/mod.py
        # Python sources are copied even when linking: small, and a python model's
        # directory then holds the code it runs, whatever later happens to the source.
        if link and source.suffix != ".py":
            dest.symlink_to(source.resolve())
        else:
            _copy(source, dest)
    (staging / CONFIG_FILENAME).write_text(config_text)


def _copy(source: Path, dest: Path) -> None:
    shutil.copyfile(source, dest)


def _swap(staging: Path, dest: Path) -> None:
    """Put ``staging`` at ``dest``: old aside, new in, old deleted; old restored on failure."""
    retired = _swap_in(staging, dest)
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)


def _swap_in(staging: Path, dest: Path) -> Path | None:
    """Old aside, new in; returns where the old model now is (None: there was none).

    On failure the old model is back at ``dest`` and the error propagates."""
    retired = None
    if dest.exists():
        retired = Path(
            tempfile.mkdtemp(
                prefix=_prefix(_RETIRED, dest.parent, dest.name), dir=_side_dir(dest.parent)
            )
        )
        retired.rmdir()  # only the unique name is wanted; rename needs it free
        os.rename(dest, retired)
    try:
        os.rename(staging, dest)
    except OSError:
        if retired is not None:
            os.rename(retired, dest)
        raise
    return retired


def _side_dir(repo_dir: Path) -> Path:
    """Where staging lives: the repository's parent (same filesystem, outside Triton's view)."""
    return repo_dir.resolve().parent


def _prefix(pattern: str, repo_dir: Path, name: str) -> str:
    return pattern.format(repo=repo_dir.resolve().name, name=name)


def _recover(repo_dir: Path, name: str) -> None:
    """Undo what a crashed write of ``name`` left: restore a retired model, drop staging."""
    dest = repo_dir / name
    side = _side_dir(repo_dir)
    for leftover in sorted(side.glob(_prefix(_RETIRED, repo_dir, name) + "*")):
        if not dest.exists():
            os.rename(leftover, dest)  # crashed between "old aside" and "new in"
        else:
            shutil.rmtree(leftover, ignore_errors=True)
    for leftover in side.glob(_prefix(_STAGING, repo_dir, name) + "*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _sidecars(onnx_path: Path) -> list[Path]:
    if not onnx_path.is_file():
        raise RepositoryError(f"{onnx_path}: file not found")
    from triton_sam.export.onnx_utils import external_data_files

    return external_data_files(onnx_path)
