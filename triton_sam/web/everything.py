"""Segment everything for the page: ``POST /web/everything/{model}`` on the gateway's origin.

The ``<family>_everything`` model is decoupled and gRPC-only (Triton's HTTP endpoint refuses
decoupled models), so the browser cannot reach it through the ``/v2`` pass-through. This route
takes JSON ``{"image_id": "...", "params": {...}}`` (the id the session model answered for the
page's image), checks it as the server would, runs the job over gRPC
(:func:`triton_sam.client.everything.agenerate`) with the tenant the pass-through passes, and
streams NDJSON: ``{"progress": [done, total]}`` per decoder batch, then
``{"image_size": [H, W], "instances": [...]}`` or ``{"error": {...}}``. When the browser goes
away, Starlette cancels the response's generator, which cancels the job's task: its stream is
closed and Triton cancels the request.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from triton_sam import errors
from triton_sam.client import everything as job
from triton_sam.client.transport import Endpoint
from triton_sam.gateway.errors import GatewayError, from_client_error, invalid
from triton_sam.gateway.sam_service import tenant_of
from triton_sam.serving.protocol.tenancy import DEFAULT_TENANT, TENANT_HEADER
from triton_sam.web.bodies import json_object

# A job's JSON body: an id and a few parameters; anything larger is not a job.
MAX_BODY_BYTES = 16 * 1024
MAX_IMAGE_ID = 128
_MODEL = re.compile(r"^(sam1|sam2)_everything$")

Listed = Callable[[], Awaitable[list[dict[str, Any]]]]


def everything_routes(grpc_address: str, listed: Listed) -> list[Route]:
    """The route, running jobs on Triton's gRPC endpoint ``grpc_address`` (``host:port``);
    ``listed()`` gives the models the page may use (``/web/models``)."""
    endpoint = Endpoint(grpc_address, "grpc", False)

    async def handle(request: Request) -> Response:
        try:
            model = request.path_params["model"]
            family = _check_model(model, await listed())
            image_id, params_json = await _check_body(request, family)
        except GatewayError as e:
            return e.response()
        tenant = tenant_of(request)
        headers = {TENANT_HEADER: tenant} if tenant != DEFAULT_TENANT else None
        inputs = job.job_inputs(image_id=image_id, params_json=params_json)
        lines = _run(endpoint, model, inputs, headers)
        return StreamingResponse(lines, media_type="application/x-ndjson")

    return [Route("/web/everything/{model}", handle, methods=["POST"])]


def _check_model(model: str, offered: list[dict[str, Any]]) -> str:
    match = _MODEL.match(model)
    if match is None or not any(m.get("name") == model for m in offered):
        raise GatewayError(404, "NotFound", "model", f"{model!r} is not a served everything model")
    return match.group(1)


async def _check_body(request: Request, family: str) -> tuple[str, str]:
    data = await json_object(request, MAX_BODY_BYTES, "{image_id, params}")
    unknown = sorted(set(data) - {"image_id", "params"})
    if unknown:
        raise invalid(unknown[0], "unknown field (image_id and params are)")
    image_id = data.get("image_id")
    if not isinstance(image_id, str) or not 0 < len(image_id) <= MAX_IMAGE_ID:
        raise invalid("image_id", f"a string of 1..{MAX_IMAGE_ID} characters expected")
    params = data.get("params", {})
    if not isinstance(params, dict):
        raise invalid("params", "a JSON object expected")
    try:
        return image_id, job.check_params(family, params)
    except errors.TritonSamError as e:
        raise from_client_error(e, "params") from e


async def _run(
    endpoint: Endpoint, model: str, inputs: dict[str, Any], headers: dict[str, str] | None
) -> AsyncIterator[bytes]:
    lines: asyncio.Queue[bytes] = asyncio.Queue()

    def progress(done: int, total: int) -> None:
        lines.put_nowait(_line({"progress": [done, total]}))

    task = asyncio.ensure_future(
        job.agenerate(endpoint, model, inputs, progress=progress, headers=headers)
    )
    try:
        while not task.done() or not lines.empty():
            getter = asyncio.ensure_future(lines.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
            else:
                getter.cancel()
        try:
            result = task.result()
        except errors.TritonSamError as e:
            yield _line({"error": {"type": type(e).__name__, "message": str(e)}})
            return
        yield _line({"image_size": list(result.image_size), "instances": result.instances})
    finally:
        task.cancel()  # the browser went away: the stream closes, Triton cancels the job


def _line(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"
