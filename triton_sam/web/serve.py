"""The annotator beside a running Triton: the gateway app with the page, on uvicorn in a
thread (what ``triton-sam serve --web`` starts next to the embedded server)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from triton_sam.errors import ServerStartError
from triton_sam.server.lifecycle import Service

DEFAULT_WEB_PORT = 8080
START_TIMEOUT_S = 30.0


def served_family(repository: str | Path, default: str = "sam2") -> str:
    """The family of the first ``<family>_session`` model in a repository (the gateway's
    SAM_service routes serve that family); ``default`` when there is none."""
    names = sorted(p.name for p in Path(repository).iterdir() if p.is_dir())
    families = [n.removesuffix("_session") for n in names if n.endswith("_session")]
    return families[0] if families else default


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket for uvicorn. Created with ``IPPROTO_TCP``, not 0: asyncio turns
    Nagle's algorithm off only on accepted sockets whose protocol says TCP, and with it on,
    every keep-alive request after the first waits ~40 ms for a delayed ACK."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


class WebServer(Service):
    """The gateway with the annotator page, on ``host:port`` (0 = any free port).

    Args:
        triton_http_url: Triton's HTTP endpoint (the page's ``/v2`` pass-through).
        triton_grpc_address: Triton's gRPC address (the gateway's SAM_service routes).
        model_type: the family the SAM_service routes serve.
    """

    def __init__(
        self,
        triton_http_url: str,
        triton_grpc_address: str,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_WEB_PORT,
        model_type: str = "sam2",
    ) -> None:
        self.triton_http_url, self.triton_grpc_address = triton_http_url, triton_grpc_address
        self.host, self.port, self.model_type = host, port, model_type
        self._server = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def url(self) -> str:
        """The page's address."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/web/"

    def start(self) -> WebServer:
        import uvicorn

        from triton_sam.gateway import BackendOptions, GatewayOptions, create_app
        from triton_sam.web import PassThroughOptions, web_routes

        routes, close = web_routes(
            PassThroughOptions(self.triton_http_url), self.triton_grpc_address
        )
        backend = BackendOptions(url=self.triton_grpc_address, model_type=self.model_type)
        app = create_app(GatewayOptions(backend=backend), extra_routes=routes, on_close=[close])
        try:
            self._sock = listening_socket(self.host, self.port)
        except OSError as e:
            raise ServerStartError(f"web: cannot listen on {self.host}:{self.port} ({e})") from e
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ServerStartError(f"web: uvicorn did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(START_TIMEOUT_S)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None
