"""Triton's KServe v2 HTTP API on the gateway's origin: what the browser page calls.

Only the inference API passes, by an allow-list of paths and methods: server and model
health, metadata, config and statistics (``GET``) and ``POST .../infer``. Triton's
model-repository, shared-memory, trace and logging APIs are not routed at all (404), so the
admin key never has a reason to travel through here, and no client header but the few the
protocol needs is passed on (no cookies, no ``Authorization``, no admin key).

Bodies up to :data:`BUFFER_BYTES` (a click, its masks) pass in one piece; larger ones (an
image file) stream both ways, the gateway holding one chunk at a time, after their JSON
header (``Inference-Header-Content-Length``: the binary-data extension) was read and
checked; a larger all-JSON body is refused (413). The request body is bounded by the
gateway's ``BodyLimit`` (``max_upload_bytes``), which aborts a chunked upload as soon as it
passes the bound.

Tenants: the tenant header (:data:`~triton_sam.serving.protocol.tenancy.TENANT_HEADER`) is
passed on as the gateway's own routes read it (:func:`triton_sam.gateway.sam_service.
tenant_of`): once, at most 64 characters, else 400. Behind the shipped proxy with tokens on,
that value is the proxy's (it replaces whatever the browser sent); a tenant among the request
body's parameters is refused here (:func:`check_inference_header`). Without a proxy,
whoever reaches the gateway can name a tenant by the header, exactly as whoever reaches
Triton can: keep the gateway's port as private as Triton's (docs/security.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from triton_sam.gateway.errors import ERR_LIMIT, GatewayError, invalid
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
        body = await _checked_body(request) if request.method == "POST" else None
        url = self.options.base + path + (f"?{request.url.query}" if request.url.query else "")
        session = self._client_session()
        data = body.chunks() if isinstance(body, _Upload) else body
        try:
            upstream = await session.request(request.method, url, headers=headers, data=data)
        except (aiohttp.ClientError, OSError) as e:
            if isinstance(body, _Upload) and body.error is not None:
                raise body.error from e  # the upload was refused (too large) while it streamed
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


async def _checked_body(request: Request) -> bytes | _Upload:
    """The request body, its inference header checked (:func:`check_inference_header`):
    in one piece up to :data:`BUFFER_BYTES`, else streamed after its header was read.

    Raises:
        GatewayError: 400 naming the field, or 413 for a JSON body too large to check.
    """
    length = request.headers.get("content-length", "")
    declared = request.headers.get("inference-header-content-length")
    if declared is not None and not (declared.isdigit() and int(declared) <= BUFFER_BYTES):
        raise invalid(
            "inference-header-content-length", f"got {declared!r}, expected 0..{BUFFER_BYTES}"
        )
    header_bytes = int(declared) if declared is not None else None
    if length.isdigit() and int(length) <= BUFFER_BYTES:
        body = await request.body()
        check_inference_header(body[:header_bytes] if header_bytes is not None else body)
        return body
    if header_bytes is None:
        raise GatewayError(
            413,
            ERR_LIMIT,
            "body",
            f"a JSON request of more than {BUFFER_BYTES} bytes; send large tensors with the "
            "binary-data extension (Inference-Header-Content-Length)",
        )
    stream = request.stream()
    head = b""
    async for chunk in stream:
        head += chunk
        if len(head) >= header_bytes:
            break
    check_inference_header(head[:header_bytes])
    return _Upload(head, stream)


def check_inference_header(header: bytes) -> None:
    """Refuse an inference request whose JSON names a tenant among its request parameters.

    The tenant travels as the header the proxy sets; Triton would hand a body parameter of
    the same name to the models as well (which refuse two values, but take one). Every
    top-level ``parameters`` object is looked at (JSON with a repeated key is read by
    different parsers differently).

    Raises:
        GatewayError: 400 naming ``triton-sam-tenant``, or the body when it is not JSON.
    """
    try:
        pairs = json.loads(header, object_pairs_hook=lambda p: p)
    except (ValueError, UnicodeDecodeError) as e:
        raise invalid("body", f"the inference request is not JSON ({e})") from e
    if not isinstance(pairs, list):
        raise invalid("body", "the inference request is not a JSON object")
    for key, value in pairs:
        if key != "parameters" or not isinstance(value, list):
            continue
        if any(isinstance(k, str) and k.lower() == TENANT_HEADER for k, _ in value):
            raise invalid(
                TENANT_HEADER,
                "a request parameter; the tenant is set by the proxy from the bearer token, "
                "a request must not carry it",
            )


class _Upload:
    """A body streamed on after its first bytes were read; keeps the refusal (the gateway's
    body bound) that stopped it, which aiohttp would otherwise report as its own error."""

    def __init__(self, head: bytes, rest: AsyncIterator[bytes]) -> None:
        self.head, self.rest = head, rest
        self.error: GatewayError | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        if self.head:
            yield self.head
        try:
            async for chunk in self.rest:
                if chunk:
                    yield chunk
        except GatewayError as e:
            self.error = e
            raise
