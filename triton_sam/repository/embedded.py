"""The repository the embedded server (a CPU host) serves, derived from a production one.

Each model's twin is decided here by its kind (:func:`embedded_twin`), with the rules of
:mod:`~triton_sam.repository.cpu_twin`; the repository-wide choices (which decoder and
encoder a session model calls, and so gets sized, bounded, fused or niced) are made in
:func:`embedded_repository`. The production repository's graphs are never changed.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

from triton_sam.errors import InputValidationError, RepositoryError
from triton_sam.repository import cpu_graphs
from triton_sam.repository.config import (
    ONNX_FILE_PARAM,
    ONNX_FILENAME,
    TARGETS,
    ModelConfig,
    Target,
    config_to_text,
    model_config_pb2,
    model_kind,
    parse_config,
)
from triton_sam.repository.cpu_twin import (
    CPU_MAX_CONCURRENT_EMBEDS,
    CPU_MAX_WAITING_EMBEDS,
    background_cpu_encoder,
    bounded_cpu_encoder,
    decoder_slots,
    size_cpu_decoder,
    to_cpu_twin,
    to_python_target,
    unbatched_cpu_decoder,
    with_cpu_instances,
    with_warmup,
)
from triton_sam.repository.onnx_check import check_onnx_config
from triton_sam.repository.writer import (
    CONFIG_FILENAME,
    OUR_PACKAGES,
    RUNNER_MODULES,
    RUNNER_NAME,
    RUNNER_SOURCE,
    VERSION,
    ModelFiles,
    list_models,
    read_model,
    shipped_modules,
    write_models,
)
from triton_sam.serving import protocol
from triton_sam.serving.protocol import embedding_cache


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
    for this host's cores (:func:`~triton_sam.repository.cpu_twin.size_cpu_decoder`), unless
    its config sets ``intra_op_thread_count`` itself; the session model's clicks run on an
    unbatched copy of it (:func:`~.cpu_twin.unbatched_cpu_decoder`, same files; the session
    model bounds and cancels them itself), while clients calling the decoder keep its
    batcher; and with ``fuse_attention`` the encoder it calls is served as a copy with fused
    attention where its family has a fusion (:mod:`~triton_sam.repository.cpu_graphs`;
    faster on CPU, fp32 parity); with ``background_encoder`` the session model's embeds run
    on a copy of that encoder at a lower CPU priority, so clicks keep the cores during a storm
    of embeds (:func:`~.cpu_twin.background_cpu_encoder`). The production repository's graphs
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
    serves (:data:`~.cpu_twin.CPU_MAX_CONCURRENT_EMBEDS` at once, at most
    :data:`~.cpu_twin.CPU_MAX_WAITING_EMBEDS` waiting) and the onnxruntime encoders they call
    at batch 1 (:func:`~.cpu_twin.bounded_cpu_encoder`)."""
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
    """``twins`` plus a background copy (:func:`~.cpu_twin.background_cpu_encoder`, same
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
    twin serves some encoders at batch 1 (:func:`~.cpu_twin.bounded_cpu_encoder`)."""
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


def embedded_twin(model: ModelFiles, target: Target) -> ModelFiles:
    """The model a CPU host serves in place of ``model``: a pure function of the artifact
    (config and file references in, twin config and file references out), by its kind.

    - python BLS models (kinds ``protocol.KINDS``): one ``KIND_CPU`` instance, same files;
    - ONNX graphs on the python runner: as they are;
    - python models of the user's own (:func:`written_by_triton_sam` says no): as they are,
      ``KIND_GPU`` instance groups made ``KIND_CPU``;
    - ensembles: as they are (they run the models they name);
    - ``onnxruntime`` graphs: with ``target="onnxruntime"`` the same config on Triton's
      onnxruntime backend built for CPU (:func:`~.cpu_twin.to_cpu_twin`), checked against its
      graph as that backend checks it; with ``target="python"`` the runner twin
      (:func:`~.cpu_twin.to_python_target`) with the runner's files added, the fallback for a
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


__all__ = [
    "embedded_repository",
    "embedded_twin",
    "single_cpu_instance",
    "written_by_triton_sam",
]
