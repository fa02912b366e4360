"""N embedded Triton replicas over one model repository, one of which can be killed.

Each replica is an :class:`~triton_sam.server.EmbeddedTriton` on free ports, as a pod or a
per-GPU container is in production: same repository, own process, own session cache.
:meth:`ReplicaSet.kill` ends one with SIGKILL (no drain: a node lost, an OOM kill), which is
the failure the proxy and the clients must absorb.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from triton_sam.errors import InputValidationError
from triton_sam.server import EmbeddedTriton
from triton_sam.server.lifecycle import Service, stopped_on_error

# Latency and queue-time quantiles on /metrics (nv_inference_request_summary_us...), off by
# default in Triton: the dashboard reads them. deploy/ passes the same flags.
METRICS_ARGS = (
    "--metrics-config=summary_latencies=true",
    "--metrics-config=summary_quantiles=0.5:0.05,0.95:0.01,0.99:0.001",
)


class ReplicaSet(Service):
    """``count`` embedded Triton servers on ``repository`` (context manager).

    Args:
        repository: a repository the embedded server can serve (``embedded_repository``).
        count: number of replicas (>= 1).
        startup_timeout_s: per replica.
        server_options: more keyword arguments for each :class:`EmbeddedTriton`.
    """

    def __init__(
        self,
        repository: str | os.PathLike[str],
        count: int,
        *,
        startup_timeout_s: float = 300.0,
        **server_options: object,
    ) -> None:
        if not isinstance(count, int) or count < 1:
            raise InputValidationError("replicas", f"got {count!r}, expected an integer >= 1")
        self.repository = Path(repository)
        self.servers = [
            EmbeddedTriton(
                self.repository,
                http_port=0,
                grpc_port=0,
                metrics_port=0,
                startup_timeout_s=startup_timeout_s,
                extra_args=METRICS_ARGS,
                **server_options,  # type: ignore[arg-type]
            )
            for _ in range(count)
        ]
        self.killed: set[int] = set()

    def start(self) -> ReplicaSet:
        """Start every replica at once, then wait until all are ready (stops all on error)."""
        with stopped_on_error(self):
            for server in self.servers:
                server.start(wait=False)
            for server in self.servers:
                server.wait_ready()
        return self

    def stop(self) -> None:
        """Stop every replica (idempotent)."""
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.stop(grace_s=5.0)

    def addresses(self, protocol: str) -> list[str]:
        """``host:port`` of each replica's ``"http"`` or ``"grpc"`` endpoint, in order."""
        if protocol not in ("http", "grpc"):
            raise InputValidationError("protocol", f"got {protocol!r}, expected 'http' or 'grpc'")
        return [s.http_address if protocol == "http" else s.grpc_address for s in self.servers]

    def index_of(self, address: str) -> int | None:
        """The replica listening on ``address`` (HTTP or gRPC ``host:port``), or None."""
        for i, server in enumerate(self.servers):
            if address in (server.http_address, server.grpc_address):
                return i
        return None

    def kill(self, index: int) -> None:
        """SIGKILL replica ``index`` and its backend stubs at once (no drain), then reap it."""
        server = self.servers[index]
        pid = server.pid
        if pid is not None:
            # the server leads its own process group (EmbeddedTriton starts a new session)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        server.stop(grace_s=5.0)
        self.killed.add(index)

    def alive(self) -> list[int]:
        """Indexes of the replicas not killed."""
        return [i for i in range(len(self.servers)) if i not in self.killed]
