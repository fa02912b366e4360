"""Backends of the embedded tritonserver: the python backend around this interpreter's stub,
and Triton's onnxruntime backend, found and linked into one backend folder.

The nvidia-pytriton wheel ships ``tritonserver`` (Triton 2.51), the python backend and one
python-backend stub per Python version, but no onnxruntime backend. :func:`backend_dir`
assembles a backend folder with the python backend around the stub of the running
interpreter and, when the repository holds ``onnxruntime_onnx`` models, Triton's own
onnxruntime backend built for this server (see :func:`find_onnxruntime_backend`);
:func:`server_env` is the environment that lets the stub start this interpreter.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from triton_sam.errors import BackendNotFoundError, ServerStartError

STUB_NAME = "triton_python_backend_stub"
# Triton's onnxruntime backend (a folder holding libtriton_onnxruntime.so and the
# libonnxruntime it links, RUNPATH $ORIGIN): where it is looked for, first match wins.
ORT_BACKEND_ENV = "TRITON_SAM_ONNXRUNTIME_BACKEND"
ORT_BACKEND_LIBRARY = "libtriton_onnxruntime.so"
# `make onnxruntime-backend` builds it here, under the virtualenv (sys.prefix).
BUILT_ORT_BACKEND = Path("tools") / "triton-onnxruntime-backend" / "onnxruntime"
# A prebuilt copy shared beside checkouts (CI machines): <ancestor>/shared/... of the checkout.
SHARED_ORT_BACKEND = Path("shared") / "triton-onnxruntime-backend" / "onnxruntime"
MACHINE_ORT_BACKEND = Path("/work") / SHARED_ORT_BACKEND
_ELF_MAGIC = b"\x7fELF"


def find_tritonserver() -> Path:
    """Path of the ``tritonserver`` binary shipped in the nvidia-pytriton wheel.

    Raises:
        ServerStartError: nvidia-pytriton is not installed, or its binary is missing.
    """
    binary = dist_dir() / "bin" / "tritonserver"
    if not binary.is_file():
        raise ServerStartError(
            f"tritonserver: {binary} not found; reinstall with `pip install nvidia-pytriton`"
        )
    return binary


def dist_dir() -> Path:
    """The ``tritonserver`` folder of the nvidia-pytriton wheel (binary, backends, stubs).

    Raises:
        ServerStartError: nvidia-pytriton is not installed.
    """
    # find_spec locates the package without importing it (pytriton's import is heavy).
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServerStartError(
            "tritonserver: the nvidia-pytriton package, which ships the tritonserver binary, "
            "is not installed: `pip install nvidia-pytriton` (or `pip install triton-sam[serve]`)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "tritonserver"


def backend_dir(workdir: Path, onnxruntime: Path | None = None) -> Path:
    """``<workdir>/backends/``: ``python/`` = the wheel's python backend + this Python's stub;
    ``onnxruntime/`` = the given onnxruntime backend, when there is one.

    The python backend runs ``<its dir>/triton_python_backend_stub``; the wheel keeps one stub
    per Python version elsewhere, so (like pytriton) we assemble a backend dir around the
    right one. Symlinks keep the stub's RPATH ($ORIGIN -> nvidia_pytriton.libs) valid.
    """
    dist = dist_dir()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = dist / "python_backend_stubs" / version / STUB_NAME
    if not stub.is_file():
        have = sorted(p.name for p in (dist / "python_backend_stubs").glob("3.*"))
        raise ServerStartError(
            f"tritonserver: no python-backend stub for Python {version} in nvidia-pytriton "
            f"(it has {have}); use one of those Python versions"
        )
    python_dir = workdir / "backends" / "python"
    python_dir.mkdir(parents=True)
    for item in (dist / "backends" / "python").iterdir():
        if item.is_file():
            (python_dir / item.name).symlink_to(item)
    (python_dir / STUB_NAME).symlink_to(stub)
    if onnxruntime is not None:
        link_backend(onnxruntime, python_dir.parent / "onnxruntime")
    return python_dir.parent


def required_backends(repository: str | os.PathLike[str]) -> set[str]:
    """Backends the models of ``repository`` name (``"onnxruntime"`` for
    ``platform: "onnxruntime_onnx"``), read from their ``config.pbtxt``."""
    from triton_sam.repository.config import parse_config

    needed = set()
    for config_path in Path(repository).glob("*/config.pbtxt"):
        if config_path.parent.name.startswith("."):
            continue
        config = parse_config(config_path)
        if config.platform == "onnxruntime_onnx":
            needed.add("onnxruntime")
        elif config.backend:
            needed.add(config.backend)
    return needed


def onnxruntime_backend_candidates() -> list[Path]:
    """Where :func:`find_onnxruntime_backend` looks when neither an argument nor
    ``$TRITON_SAM_ONNXRUNTIME_BACKEND`` names a folder, in order.

    1. ``<sys.prefix>/tools/triton-onnxruntime-backend/onnxruntime``: what
       ``make onnxruntime-backend`` builds for this environment's server and onnxruntime;
    2. ``<ancestor>/shared/triton-onnxruntime-backend/onnxruntime`` for every ancestor of the
       checkout this package runs from and of the working directory (a prebuilt copy next
       to the clone, as on CI machines);
    3. ``/work/shared/triton-onnxruntime-backend/onnxruntime``.
    """
    roots = [Path(__file__).resolve().parents[2], Path.cwd().resolve()]
    candidates = [Path(sys.prefix) / BUILT_ORT_BACKEND]
    for root in roots:
        candidates += [ancestor / SHARED_ORT_BACKEND for ancestor in (root, *root.parents)]
    candidates.append(MACHINE_ORT_BACKEND)
    return list(dict.fromkeys(candidates))


def find_onnxruntime_backend(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The folder of Triton's onnxruntime backend for the embedded server.

    Args:
        explicit: a folder given by the caller (``--onnxruntime-backend``); it must hold the
            backend, nothing else is tried. Otherwise ``$TRITON_SAM_ONNXRUNTIME_BACKEND``,
            when set, is the only folder tried; otherwise the first of
            :func:`onnxruntime_backend_candidates` holding ``libtriton_onnxruntime.so``.

    Raises:
        BackendNotFoundError: no backend there; the message lists where it looked and what
            to do (set the variable, or build one with ``make onnxruntime-backend``).
    """
    if explicit is not None:
        source, tried = "the onnxruntime_backend argument", [Path(explicit)]
    elif os.environ.get(ORT_BACKEND_ENV):
        source, tried = f"${ORT_BACKEND_ENV}", [Path(os.environ[ORT_BACKEND_ENV])]
    else:
        source, tried = "the default locations", onnxruntime_backend_candidates()
    for folder in tried:
        if (folder / ORT_BACKEND_LIBRARY).is_file():
            return folder.resolve()
    listed = "\n  ".join(str(p) for p in tried)
    raise BackendNotFoundError(
        f"Triton's onnxruntime backend ({ORT_BACKEND_LIBRARY}) not found in {source}; "
        f"looked in:\n  {listed}\n"
        "The repository has onnxruntime_onnx models, which the tritonserver of the "
        f"nvidia-pytriton wheel cannot run without it. Either set {ORT_BACKEND_ENV} (or "
        "pass --onnxruntime-backend) to a folder holding the backend built for this server "
        "(e.g. ../shared/triton-onnxruntime-backend/onnxruntime), or build one from "
        "Triton's sources with `make onnxruntime-backend` (needs network access to "
        "github.com, cmake, g++ and rapidjson-dev)."
    )


def link_backend(source: Path, dest: Path) -> None:
    """Link every file of the backend folder ``source`` into ``dest``.

    A file whose whole content is the name of another file of the folder is a symbolic
    link stored as text (what a copy or checkout without symlink support leaves of
    ``libonnxruntime.so.1 -> libonnxruntime.so.1.32.0``); it is linked to that file, since
    the dynamic loader would read the text as a truncated library ("file too short").

    Raises:
        BackendNotFoundError: a shared library of the backend is not a loadable file.
    """
    dest.mkdir(parents=True)
    for item in sorted(source.iterdir()):
        target = item
        # libonnxruntime.so -> libonnxruntime.so.1 -> libonnxruntime.so.1.32.0: follow chains
        for _ in range(8):
            named = _link_text(target)
            if named is None:
                break
            target = source / named
        (dest / item.name).symlink_to(target.resolve())
    for library in sorted(dest.glob("lib*.so*")):
        if not _is_elf(library):
            raise BackendNotFoundError(
                f"{source / library.name}: not a shared library (nor a link to one in "
                f"{source}); rebuild the backend folder (`make onnxruntime-backend`)"
            )


def _link_text(path: Path) -> str | None:
    """The sibling file name ``path`` holds as its only content, if it is such a stand-in."""
    if path.is_symlink() or not path.is_file() or path.stat().st_size > 255:
        return None
    name = path.read_bytes().strip().decode("utf-8", errors="replace")
    if name and "/" not in name and name != path.name and (path.parent / name).is_file():
        return name
    return None


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == _ELF_MAGIC
    except OSError:
        return False


def server_env() -> dict[str, str]:
    """The server's environment: this one, plus what lets the stub start this interpreter
    and import its packages."""
    env = dict(os.environ)
    # The stub links libpython3.X.so.1.0: use the running interpreter's, not a system one.
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    libs = [libdir, str(dist_dir().parent.parent / "nvidia_pytriton.libs")]
    env["LD_LIBRARY_PATH"] = _join_paths(libs, env.get("LD_LIBRARY_PATH"))
    # The stub's embedded interpreter ignores PYTHONPATH and PYTHONHOME (measured on the
    # 2.51 stub); it derives sys.prefix by finding `python3` on PATH, so putting this
    # interpreter's bin dir first makes it adopt this environment (a venv via pyvenv.cfg)
    # and its site-packages (numpy, onnxruntime). pytriton does the same.
    env["PATH"] = _join_paths([str(Path(sys.executable).parent)], env.get("PATH"))
    return env


def _join_paths(first: Sequence[str], existing: str | None) -> str:
    return os.pathsep.join([p for p in first if p] + ([existing] if existing else []))
