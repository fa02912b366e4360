"""Label Studio's ML backend protocol as Starlette routes, mounted on the gateway.

Label Studio calls an ML backend at the URL set in a project's Settings -> Model, joining the
endpoint to it (``label_studio/ml/api_connector.py``): so with the backend mounted at
``/label-studio`` (beside SAM_service's own ``/health``) the URL to give is
``http://<gateway>/label-studio``. Endpoints:

- ``GET /health`` (and ``/``): ``{"status": "UP", ...}``; open, as health endpoints are;
- ``POST /setup``: ``{"project", "schema" (the labeling config), "hostname", "access_token",
  "extra_params"}``; the config is checked (:mod:`.config`), the answer is the model version.
  The access token in the body is not used nor kept: images are fetched with the key the
  operator configured;
- ``POST /predict``: ``{"tasks", "project", "label_config", "params": {"context"}}``; with an
  interactive context, one task, answered with one brush (or polygon) region; without one
  (Label Studio's "retrieve predictions"), one empty prediction per task with the model
  version: no mask is guessed without a prompt (``triton-sam label-studio precompute`` warms
  the server's cache instead);
- ``POST /webhook``: accepted and ignored (this backend does not train);
- ``GET /versions``: the one model version.

Every endpoint but health needs a token when tokens are configured (:mod:`.auth`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from triton_sam import errors
from triton_sam.gateway.errors import ERR_INVALID_INPUT, ERR_LIMIT, ERR_OVERLOADED, GatewayError
from triton_sam.label_studio import results
from triton_sam.label_studio.auth import TokenTenants, Unauthenticated
from triton_sam.label_studio.config import parse_labeling_config
from triton_sam.label_studio.fetch import Fetcher, FetchPolicy
from triton_sam.label_studio.prompts import parse_context
from triton_sam.label_studio.recent import RecentImages
from triton_sam.label_studio.segment import Overloaded, Segmenter, TritonOptions

logger = logging.getLogger(__name__)

PREFIX = "/label-studio"
# A /predict body: tasks as Label Studio serializes them (data, annotations, drafts) and the
# labeling config; a few MiB is far past one page of tasks.
MAX_BODY_BYTES = 8 * 2**20
MAX_TASKS = 1000


@dataclass(frozen=True)
class LabelStudioOptions:
    """The backend's settings.

    Attributes:
        fetch: where images may come from (Label Studio's URL, its API key, bounds).
        triton: where the models are.
        tokens: token -> tenant; empty = no authentication, the default tenant.
    """

    fetch: FetchPolicy
    triton: TritonOptions
    tokens: dict[str, str] | None = None

    @property
    def model_version(self) -> str:
        """What Label Studio shows and stores with predictions."""
        return f"triton-sam-{self.triton.model_type}"


def label_studio_routes(
    options: LabelStudioOptions,
) -> tuple[list[BaseRoute], Callable[[], Awaitable[None]]]:
    """The backend's routes (mounted at :data:`PREFIX`) and what closes them at shutdown."""
    backend = _Backend(options)

    async def close() -> None:
        backend.fetcher.close()
        await backend.segmenter.aclose()

    routes = [
        Route("/", backend.health, methods=["GET"]),
        Route("/health", backend.health, methods=["GET"]),
        Route("/setup", backend.setup, methods=["POST"]),
        Route("/predict", backend.predict, methods=["POST"]),
        Route("/webhook", backend.webhook, methods=["POST"]),
        Route("/versions", backend.versions, methods=["GET"]),
    ]
    return [Mount(PREFIX, routes=routes)], close


class _Backend:
    def __init__(self, options: LabelStudioOptions) -> None:
        self.options = options
        self.tenants = TokenTenants(options.tokens)
        self.fetcher = Fetcher(options.fetch)
        self.images = RecentImages(self.fetcher)
        self.segmenter = Segmenter(options.triton)

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "UP", "model_class": "triton-sam", **self._version()})

    async def setup(self, request: Request) -> Response:
        return await _answered(self._setup, request)

    async def predict(self, request: Request) -> Response:
        return await _answered(self._predict, request)

    async def webhook(self, request: Request) -> Response:
        return await _answered(self._webhook, request)

    async def versions(self, request: Request) -> Response:
        return await _answered(self._versions, request)

    async def _webhook(self, request: Request) -> Response:
        self._tenant(request)
        reason = "this backend does not train: annotations do not change the model"
        return JSONResponse({"status": "ignored", "reason": reason})

    async def _versions(self, request: Request) -> Response:
        self._tenant(request)
        return JSONResponse({"versions": [self.options.model_version], "message": ""})

    def _version(self) -> dict[str, str]:
        return {"model_version": self.options.model_version}

    def _tenant(self, request: Request) -> str:
        try:
            return self.tenants.tenant_of(request.headers.get("authorization"))
        except Unauthenticated as e:
            raise _Refused(401, "Unauthenticated", "authorization", str(e)) from None

    async def _setup(self, request: Request) -> Response:
        self._tenant(request)
        body = await _json_body(request)
        parse_labeling_config(body.get("schema"), field="schema")
        return JSONResponse(self._version())

    async def _predict(self, request: Request) -> Response:
        tenant = self._tenant(request)
        body = await _json_body(request)
        tasks = body.get("tasks")
        if not isinstance(tasks, list) or not tasks or len(tasks) > MAX_TASKS:
            raise errors.InputValidationError("tasks", f"expected 1 to {MAX_TASKS} tasks")
        params = body.get("params") or {}
        if not isinstance(params, dict):
            raise errors.InputValidationError("params", "expected an object")
        prompt = parse_context(params.get("context"))
        if prompt is None:  # a plain prediction: nothing to segment without a prompt
            empty = results.prediction([], 0.0, self.options.model_version)
            return JSONResponse({"results": [empty for _ in tasks]})
        if len(tasks) != 1:
            raise errors.InputValidationError(
                "tasks", f"{len(tasks)} tasks with an interactive context, expected 1"
            )
        config = parse_labeling_config(body.get("label_config"))
        data = tasks[0].get("data") if isinstance(tasks[0], dict) else None
        field = f"tasks[0].data.{config.image_key}"
        if not isinstance(data, dict) or config.image_key not in data:
            raise errors.InputValidationError(field, "missing: the task has no image URL there")
        with self.segmenter.admit():
            fetched = await asyncio.to_thread(
                self.images.fetch_image, data[config.image_key], field, tenant=tenant
            )
            image, size = fetched
            if size != prompt.size:
                raise errors.InputValidationError(
                    "params.context.result[0].original_width",
                    f"{prompt.size[0]}x{prompt.size[1]} but the task's image is "
                    f"{size[0]}x{size[1]} (width x height)",
                )
            mask, score = await self.segmenter.segment(image, prompt, tenant=tenant, field=field)
        regions = results.mask_regions(mask, score, config, prompt, field="params.context")
        answer = results.prediction(regions, score, self.options.model_version)
        return JSONResponse({"results": [answer]})


class _Refused(GatewayError):
    """A refusal answered as the gateway's typed JSON."""


async def _answered(
    handler: Callable[[Request], Awaitable[Response]], request: Request
) -> Response:
    """Run a handler; what it refuses becomes typed JSON naming the field (logged without
    the request's content: its URLs may hold presigned credentials)."""
    try:
        return await handler(request)
    except _Refused as e:
        response = e.response()
        if e.status == 401:
            response.headers["WWW-Authenticate"] = 'Basic realm="triton-sam"'
        return response
    except Overloaded:
        refusal = GatewayError(503, ERR_OVERLOADED, "triton", "busy; try again", retry_after_s=1)
        return refusal.response()
    except errors.ImageTooLargeError as e:
        return _logged(GatewayError(413, ERR_LIMIT, e.field, _message(e)))
    except errors.ImageUrlRefusedError as e:
        return _logged(GatewayError(400, ERR_INVALID_INPUT, e.field, _message(e)))
    except errors.ImageFetchError as e:
        return _logged(GatewayError(502, "Upstream", e.field, _message(e)))
    except errors.InputValidationError as e:
        return _logged(GatewayError(400, ERR_INVALID_INPUT, e.field, _message(e)))
    except errors.TritonSamError as e:
        from triton_sam.gateway.errors import from_client_error

        return _logged(from_client_error(e))


def _message(e: errors.InputValidationError) -> str:
    return str(e).removeprefix(f"{e.field}: ")


def _logged(refusal: GatewayError) -> Response:
    logger.warning("label-studio: refused (%s): %s", refusal.status, refusal)
    return refusal.response()


async def _json_body(request: Request) -> dict[str, Any]:
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise _Refused(413, ERR_LIMIT, "body", f"more than {MAX_BODY_BYTES} bytes")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_BODY_BYTES:
            raise _Refused(413, ERR_LIMIT, "body", f"more than {MAX_BODY_BYTES} bytes")
    try:
        body = json.loads(bytes(data))
    except ValueError:
        raise errors.InputValidationError("body", "expected JSON") from None
    if not isinstance(body, dict):
        raise errors.InputValidationError("body", "expected a JSON object")
    return body
