"""Janelia SAM_service's endpoints on top of Triton.

The contract is SAM_service's code (JaneliaSciComp/SAM_service: ``sam_service/sam_queue.py``
for ``/new_session_id``, ``/embedded_model``, ``/cancel_pending``; ``sam_service/
sam_fast_api.py`` for ``/from_model`` and ``/prediction``):

- ``GET /new_session_id``: a uuid4 as plain text.
- ``POST /embedded_model`` (multipart ``image`` file, optional ``session_id`` and
  ``cancel_pending`` fields; query ``encoding=compress``): base64 of the raw float32
  (little-endian) [1, 256, 64, 64] image embedding as plain text; with ``encoding=compress``
  the base64 text gzipped (``Content-Type: application/gzip``, ``Content-Encoding: gzip``,
  whatever the client's ``Accept-Encoding``). ``cancel_pending=true`` first cancels every
  unanswered request of the session, which answers 499 with ``Cancelled-By-Client: 1``.
- ``POST /cancel_pending`` (form ``session_id``): the same cancellation; 200, empty body.
- ``POST /from_model`` (multipart ``model``: the base64 embedding as ``/embedded_model``
  answers it; ``x``, ``y``: the click; ``img_x``, ``img_y``: the image's width and height):
  the mask as a PNG (8-bit grayscale, 255 = mask).
- ``POST /prediction`` (multipart ``image``, ``x``, ``y``): the mask of one click on an image,
  as a PNG; the image is kept by the session model, so the same image again costs no encode.

``GET /models`` and ``GET /health`` are not in SAM_service's code (the reference README this
project re-creates lists them): here they answer JSON, ``/health`` 503 while Triton is not
ready.

What differs, on purpose: session ids must be ones this gateway issued (to the same tenant),
queues are bounded, and bad input gets a typed JSON error naming the field instead of a 500.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import io
import itertools
from typing import Any

import numpy as np
from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from triton_sam import errors
from triton_sam.gateway.errors import (
    ERR_LIMIT,
    ERR_OVERLOADED,
    ERR_SESSION_NOT_FOUND,
    GatewayError,
    from_client_error,
    invalid,
)
from triton_sam.gateway.work_queue import (
    CancelledByClientError,
    QueueFullError,
    UnknownSessionError,
)
from triton_sam.serving import bounds, intake
from triton_sam.serving.protocol.tenancy import DEFAULT_TENANT, MAX_TENANT_CHARS, TENANT_HEADER

#: SAM_service's embedding: SAM1's [1, 256, 64, 64] float32.
EMBEDDING_SHAPE = (1, 256, 64, 64)
EMBEDDING_BYTES = 4 * int(np.prod(EMBEDDING_SHAPE))
CANCELLED_STATUS = 499  # nginx's "client closed request", as SAM_service answers
CANCELLED_HEADER = "Cancelled-By-Client"
# FastAPI's (pydantic's) spellings of a form bool, which SAM_service's clients may send.
_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off"}
# Largest non-file form field (the base64 embedding of /from_model is ~5.6 MB).
MAX_FIELD_BYTES = 8 * 2**20

_request_ids = itertools.count()


def routes() -> list[Route]:
    """SAM_service's routes, to mount at the gateway's root."""
    return [
        Route("/new_session_id", new_session_id, methods=["GET"]),
        Route("/embedded_model", embedded_model, methods=["POST"]),
        Route("/cancel_pending", cancel_pending, methods=["POST"]),
        Route("/from_model", from_model, methods=["POST"]),
        Route("/prediction", prediction, methods=["POST"]),
        Route("/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]


# -- request parts ---------------------------------------------------------------------------
def tenant_of(request: Request) -> str:
    """The tenant the proxy vouched for (:data:`TENANT_HEADER`), or the default one.

    Raises:
        GatewayError: 400 naming the header when it is given twice or is too long.
    """
    values = request.headers.getlist(TENANT_HEADER)
    if not values:
        return DEFAULT_TENANT
    if len(values) > 1 or len(values[0]) > MAX_TENANT_CHARS:
        raise invalid(TENANT_HEADER, f"expected one value of at most {MAX_TENANT_CHARS} chars")
    return values[0]


async def read_form(request: Request) -> FormData:
    """The multipart (or urlencoded) form, or a typed 400."""
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise invalid("content-type", f"got {content_type!r}, expected multipart/form-data")
    try:
        return await request.form(max_files=4, max_fields=16, max_part_size=MAX_FIELD_BYTES)
    except GatewayError:
        raise
    except Exception as e:  # starlette's MultiPartException / HTTPException for a bad form
        raise invalid("form", f"cannot parse the form ({getattr(e, 'detail', e)})") from None


async def field_bytes(form: FormData, name: str) -> bytes:
    """A required field's bytes (a file part or a text field)."""
    value = form.get(name)
    if value is None:
        raise invalid(name, "missing; expected a multipart field")
    if isinstance(value, UploadFile):
        return await value.read()
    return value.encode("utf-8")


def text_field(form: FormData, name: str) -> str | None:
    value = form.get(name)
    if isinstance(value, UploadFile):
        raise invalid(name, "got a file, expected a text field")
    return value


def bool_field(form: FormData, name: str) -> bool:
    value = text_field(form, name)
    if value is None:
        return False
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise invalid(name, f"got {value[:20]!r}, expected true or false")


def int_field(form: FormData, name: str, *, low: int, high: int) -> int:
    value = text_field(form, name)
    if value is None:
        raise invalid(name, "missing; expected an integer")
    try:
        number = int(value.strip())
    except ValueError:
        raise invalid(name, f"got {value[:20]!r}, expected an integer") from None
    if not low <= number <= high:
        raise invalid(name, f"got {number}, expected {low}..{high}")
    return number


def session_of(request: Request, form: FormData, *, required: bool) -> str | None:
    """The form's ``session_id``, checked against the ids issued to this tenant."""
    session = text_field(form, "session_id")
    if not session:
        if required:
            raise invalid("session_id", "missing; get one from GET /new_session_id")
        return None
    try:
        return gateway(request).sessions.check(session, tenant_of(request))
    except UnknownSessionError:
        raise GatewayError(
            400,
            ERR_SESSION_NOT_FOUND,
            "session_id",
            "not issued by this gateway to this tenant (or forgotten after a restart); "
            "get a new one from GET /new_session_id",
        ) from None


async def decode_image(request: Request, data: bytes) -> np.ndarray:
    """The uploaded image as HxWx3 uint8 RGB (EXIF orientation applied), decoded off the
    event loop, the pixel bound checked from the header before any pixel is decoded."""
    limit = gateway(request).options.max_image_pixels
    try:
        return await asyncio.to_thread(intake.decode_image, data, max_pixels=limit, field="image")
    except bounds.RequestError as e:
        message = str(e).removeprefix("image: ")
        # too many pixels (bounds.check_image_size) or PIL's bomb guard: too large, not bad
        if "pixels, expected at most" in message or "decompression-bomb" in message:
            raise GatewayError(413, ERR_LIMIT, "image", message) from None
        raise invalid("image", message) from None


def gateway(request: Request) -> Any:
    """The :class:`~triton_sam.gateway.app.GatewayState` of the app."""
    return request.app.state.gateway


def _request_id() -> str:
    # Never the session id: ids are capabilities, kept out of Triton's logs and traces.
    return f"gateway-{next(_request_ids)}"


async def _queued(queue: Any, work: Any, session: str | None) -> Any:
    try:
        return await queue.submit(work, session)
    except QueueFullError as e:
        field = "session_id" if e.scope == "session" else "gateway"
        raise GatewayError(
            429,
            ERR_OVERLOADED,
            field,
            f"{e.limit} requests already wait; retry later or cancel_pending",
            retry_after_s=1,
        ) from None
    except errors.TritonSamError as e:
        raise from_client_error(e) from e


def _cancelled() -> Response:
    return Response(status_code=CANCELLED_STATUS, headers={CANCELLED_HEADER: "1"})


def _png(mask: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.where(mask, 255, 0).astype(np.uint8), mode="L").save(buffer, "PNG")
    return buffer.getvalue()


# -- endpoints -------------------------------------------------------------------------------
async def new_session_id(request: Request) -> Response:
    """A new session id for this tenant (uuid4 text)."""
    state = gateway(request)
    session = state.sessions.issue(tenant_of(request), busy=state.embeds.has_work)
    return PlainTextResponse(session)


async def embedded_model(request: Request) -> Response:
    """The image's embedding, base64 of float32 [1, 256, 64, 64] (gzipped when asked)."""
    state = gateway(request)
    form = await read_form(request)
    session = session_of(request, form, required=False)
    if session is not None and bool_field(form, "cancel_pending"):
        state.embeds.cancel_session(session)  # before this request joins the session
    data = await field_bytes(form, "image")
    rgb = await decode_image(request, data)
    tenant = tenant_of(request)

    async def work() -> np.ndarray:
        return await state.backend.embed(rgb, tenant=tenant, request_id=_request_id())

    try:
        embedding = await _queued(state.embeds, work, session)
    except CancelledByClientError:
        return _cancelled()
    if embedding.shape != EMBEDDING_SHAPE:
        raise GatewayError(
            502, "Upstream", "triton", f"encoder answered {embedding.shape}, not SAM1's"
        )
    # SAM_service: base64.b64encode(array.tobytes()) of the float32 array (native order:
    # little-endian on every host it runs on), then gzip of the base64 text when asked.
    b64 = base64.b64encode(np.ascontiguousarray(embedding, dtype="<f4").tobytes())
    if request.query_params.get("encoding", "none") != "compress":
        return PlainTextResponse(b64)
    # Level 1, not gzip.compress's 9 (SAM_service's): base64 of floats shrinks ~25% at
    # any level; measured on this project's CPU machine 174 ms vs 363 ms for 5.6 MB, and
    # 2% more bytes. Any level decodes the same.
    body = await asyncio.to_thread(gzip.compress, b64, 1)
    headers = {"Content-Type": "application/gzip", "Content-Encoding": "gzip"}
    return Response(body, headers=headers)


async def cancel_pending(request: Request) -> Response:
    """Cancel every unanswered ``/embedded_model`` request of the session."""
    form = await read_form(request)
    session = session_of(request, form, required=True)
    gateway(request).embeds.cancel_session(session)
    return PlainTextResponse("")


async def from_model(request: Request) -> Response:
    """The mask of one click on an embedding sent back (``/embedded_model``'s answer)."""
    state = gateway(request)
    form = await read_form(request)
    text = await field_bytes(form, "model")
    embedding = _embedding_of(text)
    side = bounds.MAX_IMAGE_PIXELS
    width = int_field(form, "img_x", low=1, high=side)
    height = int_field(form, "img_y", low=1, high=side)
    if width * height > state.options.max_image_pixels:
        raise GatewayError(
            413, ERR_LIMIT, "img_x", f"{width}x{height} is more than the pixel limit"
        )
    x = int_field(form, "x", low=0, high=width - 1)
    y = int_field(form, "y", low=0, high=height - 1)
    tenant = tenant_of(request)

    async def work() -> np.ndarray:
        return await state.backend.mask_from_embedding(
            embedding, (x, y), (height, width), tenant=tenant, request_id=_request_id()
        )

    mask = await _queued(state.decodes, work, None)
    return Response(await asyncio.to_thread(_png, mask), media_type="image/png")


def _embedding_of(text: bytes) -> np.ndarray:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except ValueError:
        raise invalid("model", "not base64 text (expected /embedded_model's answer)") from None
    if len(raw) != EMBEDDING_BYTES:
        raise invalid(
            "model", f"{len(raw)} bytes decoded, expected {EMBEDDING_BYTES} (float32 [1,256,64,64])"
        )
    embedding = np.frombuffer(raw, dtype="<f4").reshape(EMBEDDING_SHAPE)
    if not np.isfinite(embedding).all():
        raise invalid("model", "holds NaN or infinity")
    return embedding.astype(np.float32)


async def prediction(request: Request) -> Response:
    """The mask of one click on an uploaded image (kept by the session model)."""
    state = gateway(request)
    form = await read_form(request)
    data = await field_bytes(form, "image")
    rgb = await decode_image(request, data)
    height, width = rgb.shape[:2]
    x = int_field(form, "x", low=0, high=width - 1)
    y = int_field(form, "y", low=0, high=height - 1)
    tenant = tenant_of(request)

    async def work() -> np.ndarray:
        return await state.backend.mask_from_image(
            rgb, data, (x, y), tenant=tenant, request_id=_request_id()
        )

    # On the embeds' queue: it may encode (the decodes' queue is for clicks on embeddings,
    # which must not wait behind encodes).
    mask = await _queued(state.embeds, work, None)
    return Response(await asyncio.to_thread(_png, mask), media_type="image/png")


async def models(request: Request) -> Response:
    """The family the gateway serves and its Triton models."""
    state = gateway(request)
    options = state.backend.options
    return JSONResponse(
        {
            "models": [
                {
                    "name": options.model_type,
                    "embedding_shape": list(EMBEDDING_SHAPE),
                    "embedding_dtype": "float32",
                    "triton_models": state.backend.model_names(),
                }
            ],
            "default": options.model_type,
        }
    )


async def health(request: Request) -> Response:
    """200 when Triton and the gateway's models are ready, else 503 (same body)."""
    state = gateway(request)
    ready = await state.backend.ready()
    ok = all(ready.values())
    body = {
        "status": "ok" if ok else "unavailable",
        "triton": ready,
        "queued": state.embeds.queued(),
        "running": state.embeds.running(),
    }
    return JSONResponse(body, status_code=200 if ok else 503)
