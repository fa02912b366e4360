"""A local nginx running the image-affine proxy configuration, and its access log.

:class:`NginxProxy` writes :func:`~triton_sam.scaleout.nginx.render_nginx_conf` for the given
replicas on free ports and runs Debian's nginx in the foreground; :func:`read_access_log`
reads back which replica answered each request (the spread, the retries, the owner of each
image), in the format of :data:`~triton_sam.scaleout.nginx.LOG_FIELDS`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from triton_sam.errors import ServerStartError
from triton_sam.scaleout.nginx import (
    LOG_FIELDS,
    ProxyConfig,
    render_nginx_conf,
    tokens_text,
    write_tokens_file,
)
from triton_sam.server.lifecycle import Service, stopped_on_error


def find_nginx() -> Path:
    """The ``nginx`` binary (PATH, then /usr/sbin).

    Raises:
        ServerStartError: not installed (says how to install it).
    """
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise ServerStartError(
            "nginx: not found on PATH or in /usr/sbin; install it "
            "(`apt-get install nginx-light`, or `make proxy-tools`)"
        )
    return Path(found)


class NginxProxy(Service):
    """A local nginx process running :func:`render_nginx_conf` (context manager).

    Args:
        http_backends / grpc_backends: replica endpoints, as in :class:`ProxyConfig`.
        fail_timeout_s: as in :class:`ProxyConfig`.
        host: address the proxy listens on.
        tokens: bearer token -> tenant name: tokens on (written owner-only into the proxy's
            directory, see :func:`~triton_sam.scaleout.nginx.write_tokens_file`); None: off.

    The ports are chosen free at start (:attr:`http_address`, :attr:`grpc_address`); the
    access log is :attr:`access_log`, read with :func:`read_access_log`.
    """

    def __init__(
        self,
        http_backends: Sequence[str] = (),
        grpc_backends: Sequence[str] = (),
        *,
        fail_timeout_s: int = 10,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 10.0,
        tokens: Mapping[str, str] | None = None,
    ) -> None:
        self.host = host
        self._tokens = dict(tokens) if tokens is not None else None
        if self._tokens is not None:
            tokens_text(self._tokens)  # refuse a bad token or tenant before starting
        self.startup_timeout_s = startup_timeout_s
        self._backends = (tuple(http_backends), tuple(grpc_backends))
        self._fail_timeout_s = fail_timeout_s
        self._workdir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self.config: ProxyConfig | None = None

    @property
    def http_address(self) -> str:
        """``host:port`` of the proxy's HTTP listener."""
        return self._require_config().http_listen

    @property
    def grpc_address(self) -> str:
        """``host:port`` of the proxy's gRPC listener."""
        return self._require_config().grpc_listen

    @property
    def access_log(self) -> Path:
        """The access log (LOG_FIELDS, one request per line)."""
        return Path(self._require_config().access_log or "")

    def start(self) -> NginxProxy:
        """Write the configuration, start nginx, wait until both listeners accept.

        Raises:
            ServerStartError: nginx missing, refused the configuration, or did not listen.
        """
        binary = find_nginx()
        self._workdir = Path(tempfile.mkdtemp(prefix="triton_sam_nginx_"))
        # nginx workers run as an unprivileged user when started as root: they write
        # request bodies under the prefix
        self._workdir.chmod(0o755)
        for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self._workdir / sub).mkdir(mode=0o777)
            (self._workdir / sub).chmod(0o777)
        http_port, grpc_port = _free_ports(self.host, 2)
        tokens_file = None
        if self._tokens is not None:
            tokens_file = str(write_tokens_file(self._workdir / "tokens.map", self._tokens))
        self.config = ProxyConfig(
            http_backends=self._backends[0],
            grpc_backends=self._backends[1],
            http_listen=f"{self.host}:{http_port}",
            grpc_listen=f"{self.host}:{grpc_port}",
            fail_timeout_s=self._fail_timeout_s,
            access_log=str(self._workdir / "access.log"),
            prefix=str(self._workdir),
            tokens_file=tokens_file,
        )
        conf = self._workdir / "nginx.conf"
        conf.write_text(render_nginx_conf(self.config))
        cmd = [str(binary), "-p", str(self._workdir), "-c", str(conf)]
        log = open(self._workdir / "stderr.log", "wb")  # noqa: SIM115 - the child keeps it
        self._process = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        with stopped_on_error(self):
            self._wait_listening()
        return self

    def stop(self) -> None:
        """Stop nginx (QUIT: finish requests, then TERM/KILL) and remove its files."""
        if self._process is not None:
            if self._process.poll() is None:
                self._process.send_signal(signal.SIGQUIT)
                try:
                    self._process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
            self._process = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def _require_config(self) -> ProxyConfig:
        if self.config is None:
            raise ServerStartError("nginx proxy: not started; call start() first")
        return self.config

    def _wait_listening(self) -> None:
        assert self._process is not None and self.config is not None and self._workdir
        deadline = time.monotonic() + self.startup_timeout_s
        listeners = [
            a
            for a, used in (
                (self.config.http_listen, self.config.http_backends),
                (self.config.grpc_listen, self.config.grpc_backends),
            )
            if used
        ]
        while not all(_accepts(a) for a in listeners):
            code = self._process.poll()
            if code is not None or time.monotonic() > deadline:
                logs = [self._workdir / "stderr.log", self._workdir / "error.log"]
                log = "".join(p.read_text(errors="replace") for p in logs if p.exists())
                what = f"exited with code {code}" if code is not None else "is not listening"
                raise ServerStartError(f"nginx {what}: {log.strip()[-2000:]}")
            time.sleep(0.05)


@dataclass(frozen=True)
class LogEntry:
    """One proxied request (a line of the access log).

    Attributes:
        upstreams: the replicas it was sent to, in order (more than one: nginx retried).
        statuses: the replicas' HTTP statuses (``502``, ``504`` for a failed attempt).
        status: the status the client got; grpc_status: the gRPC status trailer ('' for HTTP).
        key: the routing header ('' when absent); request_length: bytes of the request.
        request_time: seconds; uri: the request path.
    """

    upstreams: tuple[str, ...]
    statuses: tuple[str, ...]
    status: int
    grpc_status: str
    key: str
    request_length: int
    request_time: float
    uri: str

    @property
    def upstream(self) -> str:
        """The replica that answered (the last one tried)."""
        return self.upstreams[-1] if self.upstreams else ""


def read_access_log(path: str | os.PathLike[str]) -> list[LogEntry]:
    """Parse the proxy's access log (LOG_FIELDS); unparseable lines are skipped."""
    entries = []
    for line in Path(path).read_text(errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) != len(LOG_FIELDS):
            continue
        addr, ustatus, status, grpc_status, key, length, rtime, uri = parts
        entries.append(
            LogEntry(
                upstreams=_split_upstreams(addr),
                statuses=_split_upstreams(ustatus),
                status=int(status) if status.isdigit() else 0,
                grpc_status="" if grpc_status == "-" else grpc_status,
                key="" if key == "-" else key,
                request_length=int(length) if length.isdigit() else 0,
                request_time=float(rtime) if rtime.replace(".", "", 1).isdigit() else 0.0,
                uri=uri,
            )
        )
    return entries


def _split_upstreams(value: str) -> tuple[str, ...]:
    # nginx joins retries with ", " and internal redirects with " : "
    if value in ("", "-"):
        return ()
    return tuple(v.strip() for v in value.replace(" : ", ", ").split(",") if v.strip())


def _free_ports(host: str, count: int) -> list[int]:
    held = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            held.append(s)
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def _accepts(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False
