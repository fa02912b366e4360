"""Triton's KServe v2 HTTP API on the gateway's origin: what the browser page calls.

Only the inference API passes, by an allow-list of paths and methods: server and model
health, metadata, config and statistics (``GET``) and ``POST .../infer``. Triton's
model-repository, shared-memory, trace and logging APIs are not routed at all (404), so the
admin key never has a reason to travel through here, and no client header but the few the
protocol needs is passed on (no cookies, no ``Authorization``, no admin key).

Bodies stream both ways (the gateway holds one chunk at a time, not the image file); the
request body is bounded by the gateway's ``BodyLimit`` (``max_upload_bytes``), which aborts
a chunked upload as soon as it passes the bound.

Tenants: the tenant header (:data:`~triton_sam.serving.protocol.tenancy.TENANT_HEADER`) is
passed on as the gateway's own routes read it (:func:`triton_sam.gateway.sam_service.
tenant_of`): once, at most 64 characters, else 400. Behind the shipped proxy with tokens on,
that value is the proxy's (it replaces whatever the browser sent), and a second tenant in the
request body is refused by the models. Without a proxy, whoever reaches the gateway can name
a tenant, exactly as whoever reaches Triton can: keep the gateway's port as private as
Triton's (docs/security.md).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from triton_sam.gateway.errors import GatewayError
from triton_sam.gateway.sam_service import tenant_of
from triton_sam.serving.protocol.tenancy import DEFAULT_TENANT, TENANT_HEADER

# Paths under /v2 that pass, and their methods. A model name is Triton's: letters, digits,
# '_', '-', '.'; a version is digits.
_MODEL = r"/models/[A-Za-z0-9_.\-]{1,128}(?:/versions/[0-9]{1,9})?"
ALLOWED: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^/v2/?$"), "GET"),
    (re.compile(r"^/v2/health/(?:live|ready)$"), "GET"),
    (re.compile(r"^/v2/models/stats$"), "GET"),
    (re.compile(rf"^/v2{_MODEL}(?:/ready|/config|/stats)?$"), "GET"),
    (re.compile(rf"^/v2{_MODEL}/infer$"), "POST"),
)
# Request headers passed on (lower case); the tenant is added from tenant_of().
FORWARD_REQUEST = ("content-type", "content-length", "inference-header-content-length")
FORWARD_RESPONSE = (
    "content-type",
    "content-length",
    "content-encoding",
    "inference-header-content-length",
)
CHUNK_BYTES = 2**16
# Bodies up to this size pass in one piece (a click and its masks): one write each way.
BUFFER_BYTES = 2**20


@dataclass(frozen=True)
class PassThroughOptions:
    """Where Triton's HTTP endpoint is.

    Attributes:
        url: ``http://host:port`` (or ``host:port``) of Triton's HTTP endpoint.
        timeout_s: a request's whole time at most (an encode on a CPU takes seconds).
    """

    url: str = "http://localhost:8000"
    timeout_s: float = 300.0

    @property
    def base(self) -> str:
        """The URL with a scheme and without a trailing slash."""
        url = self.url.rstrip("/")
        return url if "://" in url else f"http://{url}"


def allowed(method: str, path: str) -> bool:
    """Whether ``method path`` is on the inference API's allow-list."""
    return any(m == method and p.match(path) for p, m in ALLOWED)


class PassThrough:
    """The ``/v2/...`` route's handler: one aiohttp session, made on first use (it belongs
    to the event loop that serves the gateway) and closed by :meth:`aclose`."""

    def __init__(self, options: PassThroughOptions) -> None:
        self.options = options
        self._session = None

    def routes(self) -> list[Route]:
        """The route that answers every ``/v2`` path (refusing what is not allowed)."""
        return [Route("/v2{rest:path}", self.handle, methods=["GET", "POST"])]

    async def handle(self, request: Request) -> Response:
        """Pass one request on to Triton, or refuse it."""
        import aiohttp

        path = request.url.path
        if not allowed(request.method, path):
            raise GatewayError(
                404,
                "NotFound",
                "path",
                f"{request.method} {path} is not part of the inference API served here",
            )
        headers = {k: v for k, v in request.headers.items() if k in FORWARD_REQUEST}
        # Uncompressed answers: Triton's gzip costs CPU next to the models for a few KB of
        # JSON and RLE (aiohttp would ask for it by default).
        headers["accept-encoding"] = "identity"
        tenant = tenant_of(request)
        if tenant != DEFAULT_TENANT:
            headers[TENANT_HEADER] = tenant
        body = None
        if request.method == "POST":
            length = request.headers.get("content-length", "")
            small = length.isdigit() and int(length) <= BUFFER_BYTES
            body = await request.body() if small else _stream(request)
        url = self.options.base + path + (f"?{request.url.query}" if request.url.query else "")
        session = self._client_session()
        try:
            upstream = await session.request(request.method, url, headers=headers, data=body)
        except (aiohttp.ClientError, OSError) as e:
            raise GatewayError(
                503, "Unavailable", "triton", f"cannot reach Triton: {e}", retry_after_s=5
            ) from e
        answer = {k: v for k, v in upstream.headers.items() if k.lower() in FORWARD_RESPONSE}
        size = upstream.headers.get("content-length", "")
        if size.isdigit() and int(size) <= BUFFER_BYTES:
            try:
                content = await upstream.read()
            finally:
                upstream.release()
            return Response(content, status_code=upstream.status, headers=answer)
        return StreamingResponse(
            upstream.content.iter_chunked(CHUNK_BYTES),
            status_code=upstream.status,
            headers=answer,
            background=BackgroundTask(upstream.release),
        )

    def _client_session(self):
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.options.timeout_s),
                auto_decompress=False,  # bytes pass as Triton sent them
            )
        return self._session

    async def aclose(self) -> None:
        """Close the session (the app's shutdown)."""
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _stream(request: Request) -> AsyncIterator[bytes]:
    async for chunk in request.stream():
        if chunk:
            yield chunk
