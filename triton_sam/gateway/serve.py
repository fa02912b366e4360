"""Run the gateway on uvicorn (what ``triton-sam gateway`` calls)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.routing import BaseRoute

from triton_sam.gateway.app import GatewayOptions, create_app

#: Connections uvicorn serves at once; past it, it answers 503 at once. Each may hold an
#: upload of up to ``max_upload_bytes`` while it is parsed: this bounds the gateway's memory.
DEFAULT_MAX_CONNECTIONS = 64


def serve(
    options: GatewayOptions,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    log_level: str = "info",
    extra_routes: list[BaseRoute] | None = None,
    on_close: list[Callable[[], Awaitable[None]]] | None = None,
) -> None:
    """Serve the gateway until interrupted (blocks).

    Args:
        options: bounds and where Triton is.
        host: interface to listen on (localhost unless told otherwise).
        port: TCP port (SAM_service's nginx listens on 80/443, uvicorn's default is 8000:
            Triton's HTTP port, hence 8080).
        max_connections: uvicorn's ``limit_concurrency``.
        log_level: uvicorn's log level.
        extra_routes / on_close: as :func:`create_app`'s (the annotator's routes).
    """
    import uvicorn

    uvicorn.run(
        create_app(options, extra_routes=extra_routes, on_close=on_close),
        host=host,
        port=port,
        limit_concurrency=max_connections,
        log_level=log_level,
        access_log=log_level == "debug",  # one line per request: on when debugging
    )
