"""``POST /web/everything/{model}`` driven as ASGI, with a stand-in for the gRPC job.

The stand-in replaces :func:`triton_sam.client.everything.agenerate` (what the route calls),
so the test sees what the route checks, which tenant header it passes on, the NDJSON it
streams, and that a browser going away cancels the job. The real model's answers are the
integration tests' (tests/integration/test_everything_serving.py).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgi_support import asgi_post
from starlette.applications import Starlette

from triton_sam.client.everything import EverythingResult
from triton_sam.errors import EmbeddingNotFoundError
from triton_sam.serving.protocol import everything as protocol
from triton_sam.serving.protocol.tenancy import TENANT_HEADER
from triton_sam.web import everything as route

LISTED = [{"name": "sam2_everything", "kind": "everything"}, {"name": "sam2_session"}]
INSTANCE = {"segmentation": {"size": [4, 6], "counts": "abc"}, "bbox": [0, 0, 1, 1]}


async def _listed() -> list[dict[str, Any]]:
    return LISTED


def _app() -> Starlette:
    return Starlette(routes=route.everything_routes("triton:8001", _listed))


async def _call(
    path: str, body: bytes, headers: dict[str, str] | None = None, disconnect_after: int = 0
) -> tuple[int, bytes]:
    return await asgi_post(_app(), path, body, headers, disconnect_after)


def _post(body: Any, **kw: Any) -> tuple[int, bytes]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return asyncio.run(_call("/web/everything/sam2_everything", raw, **kw))


def test_streams_progress_then_instances_with_the_tenant(monkeypatch) -> None:
    seen: dict[str, Any] = {}

    async def fake(endpoint, model, inputs, *, progress=None, headers=None, **_):
        seen.update(address=endpoint.address, model=model, inputs=inputs, headers=headers)
        for done in (1, 2):
            progress(done, 2)
            await asyncio.sleep(0)
        return EverythingResult((4, 6), [INSTANCE])

    monkeypatch.setattr(route.job, "agenerate", fake)
    status, body = _post(
        {"image_id": "img-1", "params": {"points_per_side": 2}}, headers={TENANT_HEADER: "lab-a"}
    )
    assert status == 200
    lines = [json.loads(line) for line in body.decode().splitlines()]
    assert lines == [
        {"progress": [1, 2]},
        {"progress": [2, 2]},
        {"image_size": [4, 6], "instances": [INSTANCE]},
    ]
    assert seen["address"] == "triton:8001" and seen["model"] == "sam2_everything"
    assert seen["headers"] == {TENANT_HEADER: "lab-a"}
    assert seen["inputs"][protocol.IMAGE_ID][0] == b"img-1"
    assert json.loads(seen["inputs"][protocol.PARAMS][0]) == {"points_per_side": 2}


def test_a_refused_job_is_an_error_line(monkeypatch) -> None:
    async def fake(*_, **__):
        raise EmbeddingNotFoundError("segment everything: image_id: not held")

    monkeypatch.setattr(route.job, "agenerate", fake)
    status, body = _post({"image_id": "gone"})
    assert status == 200
    (line,) = [json.loads(x) for x in body.decode().splitlines()]
    assert line["error"]["type"] == "EmbeddingNotFoundError"
    assert "image_id" in line["error"]["message"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", "body"),
        ([1], "body"),
        ({"image_id": "", "params": {}}, "image_id"),
        ({"image_id": "x" * 200}, "image_id"),
        ({"image_id": "a", "params": []}, "params"),
        ({"image_id": "a", "tenant": "b"}, "tenant"),
        ({"image_id": "a", "params": {"points_per_side": "many"}}, "params.points_per_side"),
        ({"image_id": "a", "params": {"no_such": 1}}, "params.no_such"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(body: Any, field: str) -> None:
    status, raw = _post(body)
    assert status == 400, raw
    assert json.loads(raw)["field"] == field, raw


def test_bounds_the_body_and_the_model() -> None:
    status, _ = _post(b" " * (route.MAX_BODY_BYTES + 1))
    assert status == 413
    for model in ("sam1_everything", "sam2_session", "x"):  # not listed, not an everything model
        status, _ = asyncio.run(_call(f"/web/everything/{model}", b'{"image_id":"a"}'))
        assert status == 404


def test_the_browser_going_away_cancels_the_job(monkeypatch) -> None:
    cancelled = asyncio.Event()

    async def fake(endpoint, model, inputs, *, progress=None, **_):
        progress(1, 100)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def run() -> bool:
        await _call("/web/everything/sam2_everything", b'{"image_id":"a"}', disconnect_after=1)
        await asyncio.sleep(0.1)
        return cancelled.is_set()

    monkeypatch.setattr(route.job, "agenerate", fake)
    assert asyncio.run(run())
