"""Embedded tritonserver: the real Triton binary of the nvidia-pytriton wheel, as a child process.

No Docker, no GPU needed. The wheel ships ``tritonserver`` (Triton 2.51), the python backend
and one python-backend stub per Python version, but no onnxruntime backend. This module
assembles a backend directory with the python backend around the stub of the running
interpreter and, when the repository holds ``onnxruntime_onnx`` models, Triton's own
onnxruntime backend built for this server (see :func:`find_onnxruntime_backend`); it starts
the server over a model repository on localhost, waits until it is ready and stops it without
leaving processes behind. Configs are loaded strictly (no auto-completion from the graphs), so
what loads here is exactly what the config says.

    with EmbeddedTriton("model_repository", http_port=0, grpc_port=0, metrics_port=0) as server:
        client = SAM2TritonClient(server.http_url)
"""

from __future__ import annotations

import compileall
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Literal

from triton_sam.errors import (
    BackendNotFoundError,
    InputValidationError,
    RepositoryError,
    ServerStartError,
)
from triton_sam.server import admin_key as admin
from triton_sam.server.lifecycle import Service
from triton_sam.serving.protocol.tenancy import FORWARD_PATTERN

ModelControl = Literal["none", "explicit", "poll"]
MODEL_CONTROLS = ("none", "explicit", "poll")
STUB_NAME = "triton_python_backend_stub"
# Python backend shared memory per model instance: start small, grow in steps big enough
# for a SAM2 embedding set (~16 MiB) so one encoder response needs at most one growth.
SHM_DEFAULT_BYTES = 4 * 2**20
SHM_GROWTH_BYTES = 16 * 2**20
_LOG_TAIL_LINES = 15
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
_RESTRICTION_FLAGS = ("--http-restricted-api", "--grpc-restricted-protocol")


def find_tritonserver() -> Path:
    """Path of the ``tritonserver`` binary shipped in the nvidia-pytriton wheel.

    Raises:
        ServerStartError: nvidia-pytriton is not installed, or its binary is missing.
    """
    binary = _dist_dir() / "bin" / "tritonserver"
    if not binary.is_file():
        raise ServerStartError(
            f"tritonserver: {binary} not found; reinstall with `pip install nvidia-pytriton`"
        )
    return binary


class EmbeddedTriton(Service):
    """A local tritonserver process over a model repository.

    Use as a context manager (starts and waits until ready; stops on exit, also when the
    start-up fails) or call :meth:`start` / :meth:`stop`.

    Args:
        repository: Triton model repository whose models a CPU host can run (see
            ``triton_sam.repository.writer.embedded_repository``, which derives one from a
            GPU repository).
        http_port / grpc_port / metrics_port: ports to bind; 0 picks a free one at start.
        host: address to bind; localhost by default.
        log_verbose: Triton ``--log-verbose`` level (0 = info only).
        startup_timeout_s: how long :meth:`start` waits for ``/v2/health/ready``.
        model_control: ``"none"`` (load everything, fixed), ``"poll"`` (load everything,
            reload a model whose files change; the repository API refuses every load and
            unload, so no request can bring a model of its own) or ``"explicit"`` (load
            ``load_models`` at start, then load/unload through the repository API, with
            the admin key).
        load_models: models loaded at start in ``"explicit"`` mode (``"*"`` = all).
        repository_poll_s: in ``"poll"`` mode, seconds between Triton's scans of the
            repository.
        admin_key: the secret that unlocks the model-repository, shared-memory, trace and
            logging APIs (:mod:`triton_sam.server.admin_key`); default: a fresh random key, so no
            server started here is ever unrestricted (read it back as :attr:`admin_key`).
        log_path: where server output goes; default: a temp file, deleted by :meth:`stop`
            unless the start-up failed (the error message names it).
        exit_timeout_s: on stop, how long Triton waits for in-flight requests and open client
            connections (an idle keep-alive connection holds it for the full time).
        extra_args: more ``tritonserver`` flags, appended after ours (not the restriction
            flags: those are ours, from ``admin_key``).
        onnxruntime_backend: folder of Triton's onnxruntime backend; default: found by
            :func:`find_onnxruntime_backend` at start, when the repository needs it.
        strict_config: load configs as written (``--disable-auto-complete-config``), so a
            model that loads here needs nothing filled in from its graph (docker compose
            allows auto-completion; our configs need none). False allows it here too.
    """

    def __init__(
        self,
        repository: str | os.PathLike[str],
        *,
        http_port: int = 8000,
        grpc_port: int = 8001,
        metrics_port: int = 8002,
        host: str = "127.0.0.1",
        log_verbose: int = 0,
        startup_timeout_s: float = 120.0,
        model_control: ModelControl = "none",
        load_models: Sequence[str] = ("*",),
        repository_poll_s: int = 1,
        admin_key: str | None = None,
        log_path: str | os.PathLike[str] | None = None,
        exit_timeout_s: int = 10,
        extra_args: Sequence[str] = (),
        onnxruntime_backend: str | os.PathLike[str] | None = None,
        strict_config: bool = True,
    ) -> None:
        self.repository = Path(repository)
        if not self.repository.is_dir():
            raise RepositoryError(f"{self.repository}: model repository not found")
        if model_control not in MODEL_CONTROLS:
            raise InputValidationError(
                "model_control", f"got {model_control!r}, expected one of {MODEL_CONTROLS}"
            )
        restricting = [a for a in extra_args if a.startswith(_RESTRICTION_FLAGS)]
        if restricting:
            raise InputValidationError(
                "extra_args",
                f"got {len(restricting)} restriction flag(s); the restricted APIs are set "
                "from admin_key (Triton refuses an API restricted twice)",
            )
        ports = {"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port}
        for field, port in ports.items():
            _check_port(field, port)
        if startup_timeout_s <= 0:
            raise InputValidationError(
                "startup_timeout_s", f"got {startup_timeout_s}, expected > 0"
            )
        numbers = (
            ("log_verbose", log_verbose),
            ("exit_timeout_s", exit_timeout_s),
            ("repository_poll_s", repository_poll_s),
        )
        for field, value in numbers:
            if not isinstance(value, int) or value < 0:
                raise InputValidationError(field, f"got {value!r}, expected an integer >= 0")
        if repository_poll_s < 1:  # 0 would turn Triton's scans off: no self-heal
            raise InputValidationError(
                "repository_poll_s", f"got {repository_poll_s}, expected an integer >= 1"
            )
        self.host = host
        self.log_verbose = log_verbose
        self.startup_timeout_s = startup_timeout_s
        self.model_control = model_control
        self.load_models = tuple(load_models)
        self.repository_poll_s = repository_poll_s
        self.admin_key = (
            admin.check_key(admin_key, "admin_key") if admin_key else admin.generate_key()
        )
        self.exit_timeout_s = exit_timeout_s
        self.extra_args = tuple(extra_args)
        self.onnxruntime_backend = Path(onnxruntime_backend) if onnxruntime_backend else None
        self.strict_config = strict_config
        self._shm_prefix = f"triton_sam_{uuid.uuid4().hex[:12]}_"
        self._requested_ports = {"http": http_port, "grpc": grpc_port, "metrics": metrics_port}
        self._ports = dict(self._requested_ports)
        self._user_log_path = Path(log_path) if log_path else None
        self._log_path: Path | None = self._user_log_path
        self._workdir: Path | None = None
        self._keep_log = False
        self._process: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize | None = None

    def __repr__(self) -> str:  # the admin key stays out of logs and tracebacks
        return f"EmbeddedTriton({str(self.repository)!r}, model_control={self.model_control!r})"

    @property
    def admin_headers(self) -> dict[str, str]:
        """HTTP headers that unlock the restricted APIs (tritonclient.http ``headers=``)."""
        return {admin.HTTP_HEADER: self.admin_key}

    @property
    def admin_metadata(self) -> dict[str, str]:
        """gRPC metadata that unlocks the restricted APIs (tritonclient.grpc ``headers=``)."""
        return {admin.GRPC_HEADER: self.admin_key}

    # -- endpoints --------------------------------------------------------------------------

    @property
    def http_url(self) -> str:
        """``http://host:port`` of the HTTP/REST endpoint (port known after start)."""
        return f"http://{self._address('http')}"

    @property
    def grpc_url(self) -> str:
        """``grpc://host:port`` of the gRPC endpoint (tritonclient wants ``grpc_address``)."""
        return f"grpc://{self._address('grpc')}"

    @property
    def metrics_url(self) -> str:
        """``http://host:port`` of the Prometheus endpoint (metrics under ``/metrics``)."""
        return f"http://{self._address('metrics')}"

    @property
    def http_address(self) -> str:
        """``host:port`` of the HTTP endpoint, as ``tritonclient.http`` takes it."""
        return self._address("http")

    @property
    def grpc_address(self) -> str:
        """``host:port`` of the gRPC endpoint, as ``tritonclient.grpc`` takes it."""
        return self._address("grpc")

    @property
    def log_path(self) -> Path | None:
        """The server log file (None before start, and after stop for a deleted temp log)."""
        return self._log_path

    @property
    def pid(self) -> int | None:
        """Process id of the running server, else None."""
        return self._process.pid if self.is_running() else None

    def is_running(self) -> bool:
        """True while the server process is alive (ready or not)."""
        return self._process is not None and self._process.poll() is None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, *, wait: bool = True) -> EmbeddedTriton:
        """Start tritonserver and, with ``wait``, block until it is ready.

        Raises:
            BackendNotFoundError: the repository has onnxruntime models and Triton's
                onnxruntime backend cannot be found (the message says how to get it).
            ServerStartError: the binary or stub is missing, the process exited, or it was not
                ready within ``startup_timeout_s`` (the message carries the log tail and a
                hint). The process is stopped before raising.
        """
        if self.is_running():
            raise ServerStartError(
                f"tritonserver already running (pid {self.pid}); stop() it first"
            )
        try:
            self._launch()
            if wait:
                self.wait_ready()
        except BaseException:
            self._keep_log = True  # the error message points at it
            self.stop()
            raise
        return self

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Poll ``/v2/health/ready`` until the server and all its models are ready.

        Raises:
            ServerStartError: not started, exited, or not ready within the timeout.
        """
        if self._process is None:
            raise ServerStartError("tritonserver: not started; call start() first")
        timeout_s = self.startup_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while not self._is_ready():
            code = self._process.poll()
            if code is not None:
                raise self._start_error(f"tritonserver exited with code {code} during start-up")
            if time.monotonic() > deadline:
                raise self._start_error(
                    f"tritonserver not ready after {timeout_s:.0f} s "
                    "(raise startup_timeout_s for large models)"
                )
            time.sleep(0.1)

    def stop(self, grace_s: float | None = None) -> None:
        """Stop the server: SIGTERM, then SIGKILL after ``grace_s``; reap every process.

        Args:
            grace_s: how long to wait after SIGTERM; default ``exit_timeout_s`` + 20 s, room
                for Triton's own drain timeout plus unloading the models.

        Safe to call more than once and on a server that never started.
        """
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._process is not None:
            grace_s = self.exit_timeout_s + 20.0 if grace_s is None else grace_s
            _terminate(self._process, grace_s, self._shm_prefix)
            self._process = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        if self._user_log_path is None and self._log_path is not None and not self._keep_log:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None

    # -- internals --------------------------------------------------------------------------

    def _launch(self) -> None:
        binary = find_tritonserver()
        ort_backend = None
        if self.onnxruntime_backend is not None or "onnxruntime" in required_backends(
            self.repository
        ):
            ort_backend = find_onnxruntime_backend(self.onnxruntime_backend)
        self._workdir = Path(tempfile.mkdtemp(prefix="triton_sam_server_"))
        backends = _backend_dir(self._workdir, ort_backend)
        self._ports = _resolve_ports(self.host, self._requested_ports)
        self._keep_log = False
        self._log_path = self._user_log_path or _temp_log()
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.model_control == "poll":
            _precompile(self.repository)
        cmd = [str(binary), *self._args(backends)]
        with open(self._log_path, "wb") as log:
            self._process = _spawn(cmd, log, _server_env())
        # Last resort for a server nobody stopped (interpreter exit, lost reference).
        self._finalizer = weakref.finalize(
            self, _cleanup, self._process, self._shm_prefix, self._workdir
        )

    def _args(self, backends: Path) -> list[str]:
        ports = self._ports
        args = [
            f"--model-repository={self.repository.resolve()}",
            f"--backend-directory={backends}",
            f"--cache-directory={_dist_dir() / 'caches'}",
            f"--http-address={self.host}",
            f"--http-port={ports['http']}",
            f"--grpc-address={self.host}",
            f"--grpc-port={ports['grpc']}",
            f"--metrics-address={self.host}",
            f"--metrics-port={ports['metrics']}",
            f"--log-verbose={self.log_verbose}",
            f"--model-control-mode={self.model_control}",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            *(["--disable-auto-complete-config"] if self.strict_config else []),
            # Python-backend shared-memory regions are named by this prefix: unique per
            # server, or two servers on one machine (parallel tests) collide; stop() also
            # uses it to delete regions a killed server could not.
            f"--backend-config=python,shm-region-prefix-name={self._shm_prefix}",
            f"--backend-config=python,shm-default-byte-size={SHM_DEFAULT_BYTES}",
            f"--backend-config=python,shm-growth-byte-size={SHM_GROWTH_BYTES}",
            *admin.restriction_args(self.admin_key),
            # The proxy's tenant header reaches the models as a request parameter.
            f"--http-header-forward-pattern={FORWARD_PATTERN}",
            f"--grpc-header-forward-pattern={FORWARD_PATTERN}",
        ]
        if self.model_control == "explicit":
            args += [f"--load-model={name}" for name in self.load_models]
        if self.model_control == "poll":
            args.append(f"--repository-poll-secs={self.repository_poll_s}")
        return args + list(self.extra_args)

    def _address(self, endpoint: str) -> str:
        # A wildcard bind is reachable through loopback; clients cannot dial 0.0.0.0 everywhere.
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        host = "[::1]" if host == "::" else (f"[{host}]" if ":" in host else host)
        return f"{host}:{self._ports[endpoint]}"

    def _is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _start_error(self, what: str) -> ServerStartError:
        lines = _read_log(self._log_path)
        # Triton's error lines ("E1121 12:00:00.0 ...") say why; the tail shows where it stopped.
        errors = [_clip(x) for x in lines if x[:1] == "E" and x[1:5].isdigit()]
        errors = [x for x in errors if "CudaDriverHelper has not been" not in x]  # CPU noise
        tail = lines[-_LOG_TAIL_LINES:]
        return ServerStartError(
            f"{what}.\nHint: {_hint(errors + tail)}\n"
            f"Errors logged:\n  " + "\n  ".join(errors[-8:] or ["(none)"]) + "\n"
            f"Log: {self._log_path}; last lines:\n" + "\n".join(tail)
        )


def _precompile(repository: Path) -> None:
    """Write the ``__pycache__`` of every python-backend model before Triton polls.

    A stub writes it beside the ``model.py`` it imports, on the model's first load; in poll
    mode Triton sees the version folder change and loads the model again (measured: every
    python model twice, seconds after start). Compiled first, the stub finds it current and
    writes nothing. Best effort: a read-only repository is not written by the stub either.
    """
    compileall.compile_dir(str(repository), quiet=2, workers=1)


def _dist_dir() -> Path:
    # find_spec locates the package without importing it (pytriton's import is heavy).
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServerStartError(
            "tritonserver: the nvidia-pytriton package, which ships the tritonserver binary, "
            "is not installed: `pip install nvidia-pytriton` (or `pip install triton-sam[serve]`)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "tritonserver"


def _backend_dir(workdir: Path, onnxruntime: Path | None = None) -> Path:
    """``<workdir>/backends/``: ``python/`` = the wheel's python backend + this Python's stub;
    ``onnxruntime/`` = the given onnxruntime backend, when there is one.

    The python backend runs ``<its dir>/triton_python_backend_stub``; the wheel keeps one stub
    per Python version elsewhere, so (like pytriton) we assemble a backend dir around the
    right one. Symlinks keep the stub's RPATH ($ORIGIN -> nvidia_pytriton.libs) valid.
    """
    dist = _dist_dir()
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
        _link_backend(onnxruntime, python_dir.parent / "onnxruntime")
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


def _link_backend(source: Path, dest: Path) -> None:
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


def _server_env() -> dict[str, str]:
    """Environment that lets the stub start this interpreter and import its packages."""
    env = dict(os.environ)
    # The stub links libpython3.X.so.1.0: use the running interpreter's, not a system one.
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    libs = [libdir, str(_dist_dir().parent.parent / "nvidia_pytriton.libs")]
    env["LD_LIBRARY_PATH"] = _join_paths(libs, env.get("LD_LIBRARY_PATH"))
    # The stub's embedded interpreter ignores PYTHONPATH and PYTHONHOME (measured on the
    # 2.51 stub); it derives sys.prefix by finding `python3` on PATH, so putting this
    # interpreter's bin dir first makes it adopt this environment (a venv via pyvenv.cfg)
    # and its site-packages (numpy, onnxruntime). pytriton does the same.
    env["PATH"] = _join_paths([str(Path(sys.executable).parent)], env.get("PATH"))
    return env


def _spawn(cmd: list[str], log: IO[bytes], env: dict[str, str]) -> subprocess.Popen[bytes]:
    # Own process group: stop() can reach the python-backend stubs even if the server dies.
    return subprocess.Popen(
        _die_with_parent(cmd),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def _die_with_parent(cmd: list[str]) -> list[str]:
    """``cmd`` under ``setpriv --pdeathsig TERM`` where that exists: the server gets SIGTERM
    (and stops its stubs) when this process dies.

    Without it a SIGKILLed parent (a timed-out test run, a killed notebook kernel) leaves a
    tritonserver holding ports, shared memory and gigabytes of RAM. setpriv execs the
    server in place (same pid); a preexec_fn would do the same but can deadlock in a
    threaded parent. Linux ties the signal to the creating *thread*, so it is only asked for
    from the main thread, whose end is the process's.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return cmd
    return [setpriv, "--pdeathsig", "TERM", "--", *cmd]


def _terminate(process: subprocess.Popen[bytes], grace_s: float, shm_prefix: str) -> None:
    """SIGTERM (Triton drains and unloads), SIGKILL the group after ``grace_s``, reap."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            process.wait()
    # Stubs orphaned by a crashed or killed server are still in the group.
    _kill_group(process.pid)
    # A killed server leaves its shared-memory regions behind in /dev/shm.
    for region in Path("/dev/shm").glob(f"{shm_prefix}*"):
        region.unlink(missing_ok=True)


def _cleanup(process: subprocess.Popen[bytes], shm_prefix: str, workdir: Path) -> None:
    _terminate(process, 5.0, shm_prefix)
    shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _resolve_ports(host: str, requested: dict[str, int]) -> dict[str, int]:
    """Replace 0 by free ports; sockets stay open until all are chosen so none repeats."""
    held, ports = [], dict(requested)
    bind_host = "" if host in ("0.0.0.0", "::") else host
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        for name, port in requested.items():
            if port == 0:
                s = socket.socket(family, socket.SOCK_STREAM)
                s.bind((bind_host, 0))
                held.append(s)
                ports[name] = s.getsockname()[1]
    finally:
        for s in held:
            s.close()
    return ports


def _check_port(field: str, port: object) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise InputValidationError(field, f"got {port!r}, expected 0 (any free port) to 65535")


def _join_paths(first: Sequence[str], existing: str | None) -> str:
    return os.pathsep.join([p for p in first if p] + ([existing] if existing else []))


def _temp_log() -> Path:
    fd, path = tempfile.mkstemp(prefix="triton_sam_server_", suffix=".log")
    os.close(fd)
    return Path(path)


def _read_log(path: Path | None, max_bytes: int = 1 << 20) -> list[str]:
    if path is None or not path.is_file():
        return ["(no log)"]
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
        return f.read().decode("utf-8", errors="replace").splitlines()


def _clip(line: str, limit: int = 600) -> str:
    return line if len(line) <= limit else line[:limit] + " ..."


_HINTS = (
    (
        "libpython",
        "the python-backend stub needs this Python's shared libpython3.X.so.1.0 "
        f"(looked in LIBDIR={sysconfig.get_config_var('LIBDIR')}); use a Python built with "
        "--enable-shared",
    ),
    (
        "No module named",
        "the python-backend stub cannot import a package; install it in this "
        f"interpreter's environment ({sys.prefix}), whose bin/ must hold a `python3`",
    ),
    ("ddress already in use", "a port is taken; pass port 0 to pick free ports"),
    ("shared memory", "python-backend shared memory failed; check free space in /dev/shm"),
    ("failed to load", "a model failed to load; see the errors logged below"),
)


def _hint(lines: list[str]) -> str:
    text = "\n".join(lines)
    for needle, hint in _HINTS:
        if needle in text:
            return hint
    return "see the log below; rerun with log_verbose=1 for details"
