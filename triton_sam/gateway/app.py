"""The gateway's ASGI app: options, shared state, request-size bound, and the routes mounted.

:func:`create_app` builds a Starlette app whose state (:class:`GatewayState`: the Triton
backend, the session registry, the work queues) every route reads from ``request.app.state``.
SAM_service's routes are one list (:func:`triton_sam.gateway.sam_service.routes`) mounted at
the root, where old clients expect them; other route lists (a browser page, a pass-through
to Triton's own API) can be mounted beside them from the same origin.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from triton_sam.gateway import sam_service
from triton_sam.gateway.backend import BackendOptions, TritonBackend
from triton_sam.gateway.errors import ERR_LIMIT, GatewayError
from triton_sam.gateway.work_queue import DEFAULT_MAX_SESSIONS, SessionRegistry, WorkQueue
from triton_sam.serving import bounds


@dataclass(frozen=True)
class GatewayOptions:
    """The gateway's bounds (defaults: one shared GPU, a lab's users).

    Attributes:
        backend: where Triton and the models are.
        workers: encodes sent to Triton at once; the rest wait in the gateway, where a
            cancel drops them (SAM_service: one per GPU).
        max_queued: encodes waiting at most, all sessions together (then 429).
        max_queued_per_session: encodes one session may have waiting (then 429).
        decode_workers / max_queued_decodes: the same for clicks (``/from_model``), on
            their own line so a click never waits behind an encode.
        max_upload_bytes: request body at most (then 413): an image file and the form.
        max_image_pixels: decoded image at most (then 413), checked before decoding.
        max_sessions: session ids kept (the least recently used idle one is forgotten).
    """

    backend: BackendOptions = field(default_factory=BackendOptions)
    workers: int = 2
    max_queued: int = 64
    max_queued_per_session: int = 8
    decode_workers: int = 4
    max_queued_decodes: int = 64
    max_upload_bytes: int = bounds.MAX_IMAGE_BYTES + 2**20
    max_image_pixels: int = bounds.MAX_IMAGE_PIXELS
    max_sessions: int = DEFAULT_MAX_SESSIONS


@dataclass
class GatewayState:
    """What the routes share (``request.app.state.gateway``)."""

    options: GatewayOptions
    backend: Any  # TritonBackend, or a test's stand-in with the same methods
    sessions: SessionRegistry
    embeds: WorkQueue
    decodes: WorkQueue


def create_app(
    options: GatewayOptions | None = None,
    *,
    backend: Any = None,
    extra_routes: list[BaseRoute] | None = None,
    on_close: list[Callable[[], Awaitable[None]]] | None = None,
) -> Starlette:
    """The gateway app.

    Args:
        options: bounds and where Triton is (defaults: :class:`GatewayOptions`).
        backend: the Triton side (default a :class:`TritonBackend` of ``options.backend``).
        extra_routes: more routes mounted beside SAM_service's (same origin).
        on_close: coroutines awaited at shutdown (what the extra routes opened).
    """
    options = options or GatewayOptions()
    state = GatewayState(
        options=options,
        backend=backend if backend is not None else TritonBackend(options.backend),
        sessions=SessionRegistry(max_sessions=options.max_sessions),
        embeds=WorkQueue(
            workers=options.workers,
            max_queued=options.max_queued,
            max_queued_per_session=options.max_queued_per_session,
        ),
        decodes=WorkQueue(
            workers=options.decode_workers,
            max_queued=options.max_queued_decodes,
            max_queued_per_session=options.max_queued_decodes,
        ),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        for closer in on_close or ():
            await closer()
        close = getattr(state.backend, "aclose", None)
        if close is not None:
            await close()

    app = Starlette(
        routes=[*sam_service.routes(), *(extra_routes or [])],
        middleware=[
            Middleware(MergeSlashes),
            Middleware(BodyLimit, max_bytes=options.max_upload_bytes),
        ],
        exception_handlers={GatewayError: _answer},
        lifespan=lifespan,
    )
    app.state.gateway = state
    return app


async def _answer(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return exc.response()


class MergeSlashes:
    """``//embedded_model`` is ``/embedded_model``: Paintera's default service URL ends in
    a slash and it appends ``/embedded_model`` (SAM_service sits behind nginx, whose
    ``merge_slashes`` does this)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and "//" in scope["path"]:
            path = "/" + "/".join(p for p in scope["path"].split("/") if p)
            scope = {**scope, "path": path, "raw_path": path.encode()}
        await self.app(scope, receive, send)


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with 413: at once from ``Content-Length``,
    or as soon as a chunked upload passes the bound (the route sees a :class:`GatewayError`
    from its form parser and answers it)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._too_large().response()(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise self._too_large()
            return message

        await self.app(scope, limited, send)

    def _too_large(self) -> GatewayError:
        return GatewayError(
            413, ERR_LIMIT, "body", f"more than {self.max_bytes} bytes; send a smaller image"
        )
