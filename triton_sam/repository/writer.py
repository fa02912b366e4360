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
from dataclasses import dataclass, field
from pathlib import Path

from triton_sam.errors import InputValidationError, RepositoryError
from triton_sam.repository.checks import check_model_name
from triton_sam.repository.config import ONNX_FILENAME, TARGETS, Target, parse_config
from triton_sam.repository.moved_names import moved_name
from triton_sam.repository.shipping import imported_modules
from triton_sam.serving import protocol

CONFIG_FILENAME = "config.pbtxt"
VERSION = "1"
RUNNER_NAME = "model.py"  # what the python backend loads
SERVING_DIR = Path(__file__).resolve().parent.parent / "serving"
RUNNER_SOURCE = SERVING_DIR / "runner_model.py"
RUNNER_MODULES = imported_modules(RUNNER_SOURCE)  # what it imports
SHIPPED_PACKAGE = protocol.SHIPPED_PACKAGE  # what a python model imports beside its model.py
# Every package a triton-sam has shipped beside its python models' model.py: today's, and the
# tracking package of the first trackers. A python model whose version directory holds one was
# written by triton-sam; any other python model is the user's own (see embedded.embedded_twin).
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
            another repository's files, see :func:`~.embedded.embedded_repository`).

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


def write_models(
    repo_dir: str | os.PathLike[str], models: Sequence[ModelFiles], *, link: bool = False
) -> list[Path]:
    """Write any number of models atomically as a set: every model is staged (copied) beside
    the repository first, then all are swapped in; a failure leaves every old model in place.

    Args:
        link: symlink the files instead of copying them, python sources excepted (for
            repositories that reuse another repository's files, see
            :func:`~.embedded.embedded_repository`).

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


# The artifacts of graphs (artifacts.py) and the embedded server's twins (embedded.py) moved to
# modules of their own, which import this one: their names stay importable from here.
def __getattr__(name: str) -> object:
    from triton_sam.repository import artifacts, embedded

    return moved_name(__name__, name, artifacts, embedded)
