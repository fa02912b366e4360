"""The tritonserver child process: spawn, terminate, free ports, log reading and start-up hints.

Everything :class:`~triton_sam.server.embedded.EmbeddedTriton` does to the operating system:
the process runs in its own group under ``setpriv --pdeathsig`` (it dies with its parent),
stop reaps the server, its python-backend stubs and their shared memory, and a failed
start-up is explained from the server log (Triton's error lines, a hint, the tail).
"""

from __future__ import annotations

import compileall
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from typing import IO

from triton_sam.errors import InputValidationError, ServerStartError

_LOG_TAIL_LINES = 15


def precompile(repository: Path) -> None:
    """Write the ``__pycache__`` of every python-backend model before Triton polls.

    A stub writes it beside the ``model.py`` it imports, on the model's first load; in poll
    mode Triton sees the version folder change and loads the model again (measured: every
    python model twice, seconds after start). Compiled first, the stub finds it current and
    writes nothing. Best effort: a read-only repository is not written by the stub either.
    """
    compileall.compile_dir(str(repository), quiet=2, workers=1)


def spawn(cmd: list[str], log: IO[bytes], env: dict[str, str]) -> subprocess.Popen[bytes]:
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


def terminate(process: subprocess.Popen[bytes], grace_s: float, shm_prefix: str) -> None:
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


def cleanup(process: subprocess.Popen[bytes], shm_prefix: str, workdir: Path) -> None:
    terminate(process, 5.0, shm_prefix)
    shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def resolve_ports(host: str, requested: dict[str, int]) -> dict[str, int]:
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


def check_port(field: str, port: object) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise InputValidationError(field, f"got {port!r}, expected 0 (any free port) to 65535")


def temp_log() -> Path:
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


def start_error(what: str, log_path: Path | None) -> ServerStartError:
    """A start-up failure ``what``, explained from the server log at ``log_path``: Triton's
    error lines, a hint for the known causes, and the log's last lines."""
    lines = _read_log(log_path)
    # Triton's error lines ("E1121 12:00:00.0 ...") say why; the tail shows where it stopped.
    errors = [_clip(x) for x in lines if x[:1] == "E" and x[1:5].isdigit()]
    errors = [x for x in errors if "CudaDriverHelper has not been" not in x]  # CPU noise
    tail = lines[-_LOG_TAIL_LINES:]
    return ServerStartError(
        f"{what}.\nHint: {_hint(errors + tail)}\n"
        f"Errors logged:\n  " + "\n  ".join(errors[-8:] or ["(none)"]) + "\n"
        f"Log: {log_path}; last lines:\n" + "\n".join(tail)
    )
