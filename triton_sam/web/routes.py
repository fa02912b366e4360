"""The page's routes on the gateway: its files, the models it can use, and Triton's API.

``GET /`` redirects to ``/web/``; ``/web/`` serves ``static/`` (``index.html`` and its ES
modules); ``GET /web/models`` lists what the page can offer, read from Triton's open
statistics and config endpoints (its repository index is an admin API): every loaded session
model (kind ``embedding_cache``) that takes prompts in original pixels, ready, and every
concept model, every concept video model (kind ``concept_video``), every segment-everything
model (kind ``everything``) and every large-image model (kind ``large``,
:mod:`triton_sam.web.tiles` serves its tiles). ``/v2/...`` is
:class:`~triton_sam.web.passthrough.PassThrough`; ``POST /web/everything/{model}`` is
:mod:`triton_sam.web.everything` and ``POST /web/concept-video/{model}`` is
:mod:`triton_sam.web.concept_video` (both given Triton's gRPC address).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from triton_sam.gateway.errors import GatewayError
from triton_sam.serving.protocol import (
    KIND_CONCEPT,
    KIND_CONCEPT_VIDEO,
    KIND_EMBEDDING_CACHE,
    KIND_EVERYTHING,
    KIND_LARGE_IMAGE,
    KIND_PARAM,
)
from triton_sam.serving.protocol import embedding_cache as session_protocol
from triton_sam.web.concept_video import concept_video_routes
from triton_sam.web.everything import everything_routes
from triton_sam.web.passthrough import PassThrough, PassThroughOptions
from triton_sam.web.tiles import tile_routes

STATIC_DIR = Path(__file__).resolve().parent / "static"
# What a family's session model is called on the page (the model's name prefix).
FAMILY_LABELS = {"sam1": "SAM1", "sam2": "SAM2.1", "sam3": "SAM3 tracker"}


def web_routes(
    options: PassThroughOptions, grpc_address: str | None = None
) -> tuple[list[BaseRoute], Callable[[], Awaitable[None]]]:
    """The page's routes, and what closes their connection to Triton at shutdown.

    Args:
        options: where Triton's HTTP endpoint is.
        grpc_address: Triton's gRPC ``host:port``; with it, ``POST /web/everything/{model}``
            and ``POST /web/concept-video/{model}`` (decoupled models stream over gRPC only).
    """
    passthrough = PassThrough(options)

    async def models(request: Request) -> Response:
        return JSONResponse({"models": await served_models(passthrough)})

    async def index(request: Request) -> Response:
        return RedirectResponse("/web/")

    routes: list[BaseRoute] = [
        Route("/", index, methods=["GET"]),
        Route("/web/models", models, methods=["GET"]),
        *(
            everything_routes(grpc_address, lambda: served_models(passthrough))
            if grpc_address
            else []
        ),
        *(
            concept_video_routes(grpc_address, lambda: served_models(passthrough))
            if grpc_address
            else []
        ),
        *tile_routes(lambda model: _config(passthrough, model)),
        Mount("/web", StaticFiles(directory=STATIC_DIR, html=True), name="web"),
        *passthrough.routes(),
    ]
    return routes, passthrough.aclose


async def served_models(passthrough: PassThrough) -> list[dict[str, Any]]:
    """The models the page can use, from Triton's statistics and configs (open endpoints).

    Raises:
        GatewayError: 503 when Triton cannot be reached.
    """
    stats = await _get_json(passthrough, "/v2/models/stats")
    names = sorted({m["name"] for m in stats.get("model_stats", [])})
    configs = await asyncio.gather(*(_config(passthrough, n) for n in names))
    offered = []
    for name, config in zip(names, configs, strict=True):
        kind = _parameter(config, KIND_PARAM)
        inputs = {i.get("name") for i in config.get("input", [])}
        if kind == KIND_EMBEDDING_CACHE and session_protocol.POINTS in inputs:
            family = name.removesuffix("_session")
            label = f"{FAMILY_LABELS.get(family, family)} ({name})"
            offered.append({"name": name, "kind": "session", "label": label})
        elif kind == KIND_CONCEPT:
            offered.append({"name": name, "kind": "concept", "label": f"SAM3 concepts ({name})"})
        elif kind == KIND_CONCEPT_VIDEO:
            label = f"SAM3 video concepts ({name})"
            offered.append({"name": name, "kind": "concept_video", "label": label})
        elif kind == KIND_EVERYTHING:
            family = name.removesuffix("_everything")
            label = f"{FAMILY_LABELS.get(family, family)} everything ({name})"
            offered.append({"name": name, "kind": "everything", "label": label})
        elif kind == KIND_LARGE_IMAGE:
            family = name.removesuffix("_large")
            label = f"{FAMILY_LABELS.get(family, family)} large images ({name})"
            offered.append({"name": name, "kind": "large", "label": label})
    ready = await asyncio.gather(*(_ready(passthrough, m["name"]) for m in offered))
    return [m for m, ok in zip(offered, ready, strict=True) if ok]


async def _config(passthrough: PassThrough, name: str) -> dict[str, Any]:
    try:
        return await _get_json(passthrough, f"/v2/models/{name}/config")
    except GatewayError:
        return {}  # unloaded meanwhile: not offered


async def _ready(passthrough: PassThrough, name: str) -> bool:
    session = passthrough._client_session()
    try:
        async with session.get(f"{passthrough.options.base}/v2/models/{name}/ready") as r:
            return r.status == 200
    except Exception:
        return False


async def _get_json(passthrough: PassThrough, path: str) -> dict[str, Any]:
    import aiohttp

    session = passthrough._client_session()
    try:
        async with session.get(passthrough.options.base + path) as r:
            if r.status != 200:
                raise GatewayError(502, "Upstream", "triton", f"{path}: HTTP {r.status}")
            return await r.json(content_type=None)
    except (aiohttp.ClientError, OSError) as e:
        raise GatewayError(
            503, "Unavailable", "triton", f"cannot reach Triton: {e}", retry_after_s=5
        ) from e


def _parameter(config: dict[str, Any], key: str) -> str | None:
    return config.get("parameters", {}).get(key, {}).get("string_value")
