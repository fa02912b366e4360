"""Embedded tritonserver: the real Triton binary of the nvidia-pytriton wheel, as a child process.

No Docker, no GPU needed. :class:`EmbeddedTriton` starts the server over a model repository on
localhost, with the backends :mod:`triton_sam.server.backends` assembles (the python backend
around this interpreter's stub, Triton's onnxruntime backend when the repository needs it),
waits until it is ready and stops it without leaving processes behind
(:mod:`triton_sam.server.process`). Configs are loaded strictly (no auto-completion from the
graphs), so what loads here is exactly what the config says.

    with EmbeddedTriton("model_repository", http_port=0, grpc_port=0, metrics_port=0) as server:
        client = SAM2TritonClient(server.http_url)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from triton_sam.errors import (
    InputValidationError,
    RepositoryError,
    ServerStartError,
)
from triton_sam.server import admin_key as admin
from triton_sam.server import process
from triton_sam.server.backends import (
    backend_dir,
    dist_dir,
    find_onnxruntime_backend,
    find_tritonserver,
    required_backends,
    server_env,
)
from triton_sam.server.data_roots import environment as data_roots_environment
from triton_sam.server.lifecycle import Service
from triton_sam.serving.protocol.tenancy import FORWARD_PATTERN

ModelControl = Literal["none", "explicit", "poll"]
MODEL_CONTROLS = ("none", "explicit", "poll")
# Python backend shared memory per model instance: start small, grow in steps big enough
# for a SAM2 embedding set (~16 MiB) so one encoder response needs at most one growth.
SHM_DEFAULT_BYTES = 4 * 2**20
SHM_GROWTH_BYTES = 16 * 2**20
_RESTRICTION_FLAGS = ("--http-restricted-api", "--grpc-restricted-protocol")


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
        data_roots: the directories the large-image models may read datasets under, name
            -> directory or ``{"path": dir, "tenants": [...]}`` (:mod:`.data_roots`); none
            by default.
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
        data_roots: Mapping[str, Any] | None = None,
    ) -> None:
        self.repository = Path(repository)
        if not self.repository.is_dir():
            raise RepositoryError(f"{self.repository}: model repository not found")
        _check_arguments(
            model_control=model_control,
            extra_args=extra_args,
            ports={"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port},
            startup_timeout_s=startup_timeout_s,
            counts={
                "log_verbose": log_verbose,
                "exit_timeout_s": exit_timeout_s,
                "repository_poll_s": repository_poll_s,
            },
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
        self.environment = data_roots_environment(data_roots)  # checked before any start
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
            process.terminate(self._process, grace_s, self._shm_prefix)
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
        backends = backend_dir(self._workdir, ort_backend)
        self._ports = process.resolve_ports(self.host, self._requested_ports)
        self._keep_log = False
        self._log_path = self._user_log_path or process.temp_log()
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.model_control == "poll":
            process.precompile(self.repository)
        cmd = [str(binary), *self._args(backends)]
        with open(self._log_path, "wb") as log:
            self._process = process.spawn(cmd, log, server_env() | self.environment)
        # Last resort for a server nobody stopped (interpreter exit, lost reference).
        self._finalizer = weakref.finalize(
            self, process.cleanup, self._process, self._shm_prefix, self._workdir
        )

    def _args(self, backends: Path) -> list[str]:
        ports = self._ports
        args = [
            f"--model-repository={self.repository.resolve()}",
            f"--backend-directory={backends}",
            f"--cache-directory={dist_dir() / 'caches'}",
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
        return process.start_error(what, self._log_path)


def _check_arguments(
    *,
    model_control: str,
    extra_args: Sequence[str],
    ports: dict[str, int],
    startup_timeout_s: float,
    counts: dict[str, int],
) -> None:
    """Refuse the arguments of :class:`EmbeddedTriton` that Triton would refuse or misread.

    Raises:
        InputValidationError: naming the argument, what was given and what is expected.
    """
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
    for field, port in ports.items():
        process.check_port(field, port)
    if startup_timeout_s <= 0:
        raise InputValidationError("startup_timeout_s", f"got {startup_timeout_s}, expected > 0")
    for field, value in counts.items():
        if not isinstance(value, int) or value < 0:
            raise InputValidationError(field, f"got {value!r}, expected an integer >= 0")
    if counts["repository_poll_s"] < 1:  # 0 would turn Triton's scans off: no self-heal
        raise InputValidationError(
            "repository_poll_s", f"got {counts['repository_poll_s']}, expected an integer >= 1"
        )
