"""The page's tile pyramid route (:mod:`triton_sam.web.tiles`) on the gateway, driven as ASGI
with a stand-in for the ``<family>_large`` model behind the gateway's backend connection.

The stand-in answers ``status`` and ``read`` as the contract says (the read's pixels being a
known image, so every tile can be computed here independently), records each call's tenant
and request, and answers a handle another tenant opened with the model's ``HandleNotFound``
error text, as Triton carries it. The real model is the integration tests'.
"""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import numpy as np
import pytest
from PIL import Image

from triton_sam.errors import InvalidRequestError, ServerError
from triton_sam.gateway import create_app
from triton_sam.serving.protocol import error_message
from triton_sam.serving.protocol import large as contract
from triton_sam.serving.protocol.tenancy import DEFAULT_TENANT, TENANT_HEADER
from triton_sam.web import tiles

HANDLE = "0123456789abcdef0123456789abcdef"
MODEL = "sam1_large"
RNG = np.random.default_rng(0)


class StandIn:
    """The large model's answers, per tenant (the backend's ``connection(tenant)``)."""

    def __init__(
        self, image: np.ndarray, owner: str = DEFAULT_TENANT, pyramid: bool = False
    ) -> None:
        self.image, self.owner, self.pyramid = image, owner, pyramid
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.complete = True

    def connection(self, tenant: str) -> Any:
        stand_in = self

        class Transport:
            async def infer(self, model, inputs, outputs, idempotent=False):
                request = json.loads(inputs[contract.REQUEST][0])
                stand_in.calls.append((tenant, request))
                return stand_in.answer(tenant, request)

        class Connection:
            def transport(self):
                return Transport()

        return Connection()

    def answer(self, tenant: str, request: dict[str, Any]) -> dict[str, np.ndarray]:
        if tenant != self.owner or request["handle"] != HANDLE:
            text = error_message(contract.ERR_HANDLE_NOT_FOUND, "request.handle: not found")
            raise ServerError(f"infer on {MODEL}: server error: [StatusCode.NOT_FOUND] {text}")
        rows, cols = self.image.shape[:2]
        if request["op"] == "status":
            body = {
                "handle": HANDLE,
                "shape": [rows, cols, 3],
                "axes": "yxc",
                "complete": self.complete,
            }
            return {contract.ANSWER: np.array([json.dumps(body).encode()], dtype=np.object_)}
        r0, c0, r1, c1 = request["block"]
        level = request.get("level", 0)
        assert max(r1 - r0, c1 - c0) <= contract.DEFAULT_MAX_BLOCK or level > 0
        if level and not self.pyramid:
            text = error_message("InvalidInput", "request.level: an upload has one level (0)")
            raise InvalidRequestError(f"infer on {MODEL}: the server rejected the request: {text}")
        f = 2**level  # a pyramid of exact halvings: the source's level is the plain stride
        rgb = self.image[r0:r1:f, c0:c1:f]
        answer = json.dumps({"size": list(rgb.shape[:2])}).encode()
        return {contract.ANSWER: np.array([answer], dtype=np.object_), contract.RGB: rgb}


async def _config(model: str) -> dict[str, Any]:
    return {"parameters": {"max_block": {"string_value": str(contract.DEFAULT_MAX_BLOCK)}}}


def _get(app: Any, path: str, query: str, headers: dict[str, str] | None = None):
    """(status, headers, body) of one GET."""
    messages: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    scope = {
        "type": "http", "method": "GET", "path": path, "raw_path": path.encode(),
        "query_string": query.encode(), "root_path": "", "scheme": "http",
        "server": ("test", 80), "client": ("test", 1), "http_version": "1.1",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
    }  # fmt: skip
    asyncio.run(app(scope, receive, send))
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


def _app(stand_in: StandIn) -> Any:
    return create_app(backend=stand_in, extra_routes=tiles.tile_routes(_config))


def _tile(app, level, row, col, handle=HANDLE, headers=None):
    return _get(
        app, f"/web/large/{MODEL}/{handle}/tile", f"level={level}&row={row}&col={col}", headers
    )


def _expected(image: np.ndarray, level: int, row: int, col: int) -> np.ndarray:
    """The tile computed here: the mean of each 2**L cell (cut at the image's edge), rounded
    half up as Pillow's reduce rounds."""
    f, span = 2**level, tiles.TILE_PX * 2**level
    block = image[row * span : (row + 1) * span, col * span : (col + 1) * span].astype(np.float64)
    rows, cols = -(-block.shape[0] // f), -(-block.shape[1] // f)
    out = np.zeros((rows, cols, 3))
    for r in range(rows):
        for c in range(cols):
            out[r, c] = block[r * f : (r + 1) * f, c * f : (c + 1) * f].mean(axis=(0, 1))
    return np.floor(out + 0.5).astype(np.uint8)


def _png(body: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(body)).convert("RGB"))


def test_level_maths():
    assert tiles.levels((512, 512)) == 1
    assert tiles.levels((20000, 20000)) == 7  # 20000 / 2**6 = 313 px: one tile
    p = tiles.plan((20000, 1000), 0, 39, 1, 2048)
    assert p.block == (19968, 512, 20000, 1000) and p.size == (32, 488) and len(p.reads) == 1
    p = tiles.plan((20000, 20000), 4, 1, 0, 2048)  # 8192 px a side: 4 x 4 reads of 2048
    assert p.block == (8192, 0, 16384, 8192) and p.size == (512, 512) and len(p.reads) == 16
    assert max(max(b[2] - b[0], b[3] - b[1]) for b in p.reads) == 2048
    assert tiles.plan((20000, 20000), 5, 0, 0, 2048).reads == ()  # 64 reads: the source's level
    for level, row, col, field in ((7, 0, 0, "level"), (0, 40, 0, "row"), (6, 0, 1, "col")):
        with pytest.raises(tiles.GatewayError) as refused:
            tiles.plan((20000, 20000), level, row, col, 2048)
        assert (refused.value.status, refused.value.field) == (404, field)


@pytest.mark.parametrize(("level", "row", "col"), [(0, 1, 2), (1, 0, 1), (2, 0, 0)])
def test_tiles_are_the_area_mean_of_what_the_model_reads(level, row, col):
    image = RNG.integers(0, 256, (1100, 1700, 3), dtype=np.uint8)
    stand_in = StandIn(image)
    status, headers, body = _tile(_app(stand_in), level, row, col)
    assert status == 200 and headers["content-type"] == "image/png"
    assert headers["cache-control"] == tiles.CACHE_CONTROL and headers["vary"] == TENANT_HEADER
    np.testing.assert_array_equal(_png(body), _expected(image, level, row, col))


def test_a_large_level_reads_at_most_max_block_and_the_shape_is_asked_once():
    image = np.zeros((4200, 2100, 3), np.uint8)
    image[:, 1000:] = 200  # a step: its tile pixels straddle it
    stand_in = StandIn(image)
    app = _app(stand_in)
    for row in (0, 1):
        status, _, body = _tile(app, 3, row, 0)  # 4096 px a side per tile: 2 x 2 reads
        assert status == 200
        np.testing.assert_array_equal(_png(body), _expected(image, 3, row, 0))
    ops = [request["op"] for _, request in stand_in.calls]
    assert ops.count("status") == 1 and ops.count("read") == 4 + 2  # the second row: 1 x 2


def test_coarse_levels_come_from_the_source_pyramid_or_are_refused_without_one():
    image = RNG.integers(0, 256, (40000, 600, 3), dtype=np.uint8)[:, :, :]
    stand_in = StandIn(image, pyramid=True)
    status, _, body = _tile(_app(stand_in), 6, 0, 0)  # 32768 px a side: 16 x 1 = 16 reads
    assert status == 200 and stand_in.calls[-1][1].get("level") is None
    status, _, body = _tile(_app(stand_in), 7, 0, 0)  # 65536 px a side: 32 reads
    assert status == 200 and stand_in.calls[-1][1]["level"] == 7
    np.testing.assert_array_equal(_png(body), image[::128, ::128])
    status, headers, body = _tile(_app(StandIn(image)), 7, 0, 0)
    answer = json.loads(body)
    assert (status, answer["code"], answer["field"]) == (413, "LimitExceeded", "level")
    assert headers["cache-control"] == "no-store"


def test_the_tenant_header_travels_and_another_tenants_handle_is_a_miss():
    image = np.full((300, 300, 3), 7, np.uint8)
    stand_in = StandIn(image, owner="lab-a")
    app = _app(stand_in)
    status, _, _ = _tile(app, 0, 0, 0, headers={TENANT_HEADER: "lab-a"})
    assert status == 200 and {t for t, _ in stand_in.calls} == {"lab-a"}
    for headers in ({TENANT_HEADER: "lab-b"}, None):
        status, answer_headers, body = _tile(app, 0, 0, 0, headers=headers)
        answer = json.loads(body)
        assert (status, answer["code"], answer["field"]) == (
            404,
            contract.ERR_HANDLE_NOT_FOUND,
            "handle",
        )
        assert answer_headers["cache-control"] == "no-store"
    assert [t for t, _ in stand_in.calls][-2:] == ["lab-b", DEFAULT_TENANT]


@pytest.mark.parametrize(
    ("handle", "query", "status", "field"),
    [
        ("f" * 32, "level=0&row=0&col=0", 404, "handle"),  # well formed, never issued
        ("../../etc", "level=0&row=0&col=0", 404, None),  # not even a route
        ("F" * 32, "level=0&row=0&col=0", 404, "handle"),  # handles are lower-case hex
        (HANDLE, "level=0&row=-1&col=0", 400, "row"),
        (HANDLE, "level=x&row=0&col=0", 400, "level"),
        (HANDLE, "level=0&row=0&col=1", 404, "col"),
        (HANDLE, "level=0&row=0&col=0&z=0", 400, "z"),  # not a volume
    ],
)
def test_refusals_name_the_field(handle, query, status, field):
    app = _app(StandIn(np.zeros((300, 300, 3), np.uint8)))
    got, _, body = _get(app, f"/web/large/{MODEL}/{handle}/tile", query)
    assert got == status
    if field is not None:
        assert json.loads(body)["field"] == field


def test_an_incomplete_image_is_not_served_or_remembered():
    stand_in = StandIn(np.zeros((300, 300, 3), np.uint8))
    stand_in.complete = False
    app = _app(stand_in)
    status, headers, _ = _tile(app, 0, 0, 0)
    assert status == 409 and headers["cache-control"] == "no-store"
    stand_in.complete = True
    assert _tile(app, 0, 0, 0)[0] == 200
    status, _, body = _get(
        app, "/web/large/sam1_session/" + HANDLE + "/tile", "level=0&row=0&col=0"
    )
    assert status == 404 and json.loads(body)["field"] == "model"
