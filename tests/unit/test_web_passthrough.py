"""The annotator's routes on the gateway over real HTTP (uvicorn), with a stand-in for Triton.

The stand-in (an aiohttp server) records what reaches it, so the test sees what the gateway
passes on: only the inference API, only the protocol's headers and the tenant as the gateway
reads it, bodies intact both ways (a small one in one piece, a large one streamed). What the
real Triton answers the page is tests/integration/test_web_page.py's.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading

import pytest
import requests
from gateway_support import running_gateway

from triton_sam.gateway import GatewayOptions, create_app
from triton_sam.serving.protocol import KIND_CONCEPT, KIND_EMBEDDING_CACHE, KIND_PARAM
from triton_sam.serving.protocol.tenancy import TENANT_HEADER
from triton_sam.web import PassThroughOptions, web_routes
from triton_sam.web.passthrough import BUFFER_BYTES, allowed
from triton_sam.web.serve import WebServer, served_family

pytest.importorskip("uvicorn")
web = pytest.importorskip("aiohttp.web")


def rendered_session(family: str, name: str) -> dict:
    """A family's session model config as Triton's config endpoint answers it (JSON)."""
    from google.protobuf.json_format import MessageToDict

    from triton_sam.models.registry import get_family
    from triton_sam.repository.config import RepositoryOptions
    from triton_sam.repository.session_config import build_session_config

    config = build_session_config(get_family(family), RepositoryOptions(), name=name)
    return MessageToDict(config, preserving_proto_field_name=True)


CONFIGS = {
    "sam2_session": {
        "parameters": {KIND_PARAM: {"string_value": KIND_EMBEDDING_CACHE}},
        "input": [{"name": "image_id"}, {"name": "points"}, {"name": "labels"}],
    },
    # The SAM3 tracker's session model as the repository writes it (pixel prompts: offered),
    # and one over a decoder in the onnx-community layout (prompts in the model's frame only:
    # the page cannot use it).
    "sam3_session": rendered_session("sam3", "sam3_session"),
    "sam3c_session": rendered_session("sam3_onnx_community", "sam3c_session"),
    "sam3_concept": {"parameters": {KIND_PARAM: {"string_value": KIND_CONCEPT}}, "input": []},
    "sam2_decoder": {"parameters": {}, "input": [{"name": "point_coords"}]},
    "sam1_session": {  # loaded, not ready
        "parameters": {KIND_PARAM: {"string_value": KIND_EMBEDDING_CACHE}},
        "input": [{"name": "points"}],
    },
}


class FakeTriton:
    """An aiohttp server on a free port in its own thread; ``seen`` holds each request's
    (method, path, headers, body)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def handle(self, request):
        body = await request.read()
        self.seen.append((request.method, request.path, dict(request.headers), body))
        path = request.path
        if path == "/v2/models/stats":
            return web.json_response({"model_stats": [{"name": n} for n in CONFIGS]})
        if path.endswith("/config"):
            return web.json_response(CONFIGS[path.split("/")[3]])
        if path.endswith("/ready"):
            return web.Response(status=400 if "sam1" in path else 200)
        if path.endswith("/infer"):
            answer = body[::-1]  # the body reversed: both directions checked byte for byte
            return web.Response(
                body=answer,
                content_type="application/octet-stream",
                headers={"Inference-Header-Content-Length": "7", "Set-Cookie": "x=1"},
            )
        return web.Response(status=404)

    def __enter__(self) -> str:
        self.thread.start()
        app = web.Application(client_max_size=2**26)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        asyncio.run_coroutine_threadsafe(self.runner.setup(), self.loop).result(10)
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        asyncio.run_coroutine_threadsafe(site.start(), self.loop).result(10)
        port = site._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture()
def site():
    triton = FakeTriton()
    with triton as triton_url:
        routes, close = web_routes(PassThroughOptions(triton_url))
        app = create_app(
            GatewayOptions(max_upload_bytes=4 * 2**20), extra_routes=routes, on_close=[close]
        )
        with running_gateway(app) as base:
            yield base, triton


def test_the_allow_list_is_the_inference_api():
    assert allowed("POST", "/v2/models/sam2_session/infer")
    assert allowed("POST", "/v2/models/sam2_session/versions/1/infer")
    assert allowed("GET", "/v2/models/sam2_session/ready")
    assert allowed("GET", "/v2/models/stats") and allowed("GET", "/v2/health/ready")
    for method, path in [
        ("POST", "/v2/repository/index"),
        ("POST", "/v2/repository/models/sam2_session/load"),
        ("POST", "/v2/systemsharedmemory/region/x/register"),
        ("GET", "/v2/trace/setting"),
        ("POST", "/v2/logging"),
        ("GET", "/v2/models/sam2_session/infer"),
        ("POST", "/v2/models/../repository/index/infer"),
    ]:
        assert not allowed(method, path), path


def test_infer_passes_bodies_intact_and_only_the_protocols_headers(site):
    base, triton = site
    header = json.dumps({"inputs": [{"name": "image_bytes", "shape": [1, 1]}]}).encode()
    for size in (1000, BUFFER_BYTES + 12345):  # one piece, and streamed
        body = header + bytes(range(256)) * (size // 256)
        answer = requests.post(
            f"{base}/v2/models/sam2_session/infer",
            data=body,
            headers={
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(len(header)),
                "Cookie": "session=secret",
                "Authorization": "Bearer abc",
                "triton-admin-key": "k",
            },
            timeout=30,
        )
        assert answer.status_code == 200
        assert answer.content == body[::-1]
        assert answer.headers["inference-header-content-length"] == "7"
        assert "set-cookie" not in answer.headers
        method, path, headers, seen = triton.seen[-1]
        assert (method, path, seen) == ("POST", "/v2/models/sam2_session/infer", body)
        lower = {k.lower(): v for k, v in headers.items()}
        assert {"cookie", "authorization", "triton-admin-key", TENANT_HEADER}.isdisjoint(lower)
        assert lower["inference-header-content-length"] == str(len(header))


def test_the_tenant_is_passed_on_once_as_the_gateway_reads_it(site):
    base, triton = site
    url = f"{base}/v2/models/sam2_session/infer"
    assert requests.post(url, data=b"{}", headers={TENANT_HEADER: "team-a"}).status_code == 200
    assert {k.lower(): v for k, v in triton.seen[-1][2].items()}[TENANT_HEADER] == "team-a"
    count = len(triton.seen)
    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=10)
    connection.putrequest("POST", "/v2/models/sam2_session/infer")
    for tenant in ("a", "b"):
        connection.putheader(TENANT_HEADER, tenant)
    connection.putheader("Content-Length", "2")
    connection.endheaders(b"{}")
    twice = connection.getresponse()
    assert twice.status == 400 and json.loads(twice.read())["field"] == TENANT_HEADER
    connection.close()
    too_long = requests.post(url, data=b"{}", headers={TENANT_HEADER: "t" * 65})
    assert too_long.status_code == 400
    # nor a tenant among the request's parameters, whatever its case or repetition
    for body in (
        {"parameters": {"Triton-Sam-Tenant": "b"}, "inputs": []},
        '{"parameters": {"triton-sam-tenant": "b"}, "parameters": {}}',
    ):
        data = body if isinstance(body, str) else json.dumps(body)
        refused = requests.post(url, data=data, headers={TENANT_HEADER: "team-a"})
        assert refused.status_code == 400 and refused.json()["field"] == TENANT_HEADER
    header = json.dumps({"parameters": {"triton-sam-tenant": "b"}}).encode()
    streamed = requests.post(
        url,
        data=header + b"\0" * (BUFFER_BYTES + 1),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert streamed.status_code == 400 and streamed.json()["field"] == TENANT_HEADER
    not_json = requests.post(url, data=b"\x00\x01")
    assert not_json.status_code == 400 and not_json.json()["field"] == "body"
    assert len(triton.seen) == count  # none of these reached Triton


def test_admin_apis_and_oversized_bodies_never_reach_triton(site):
    base, triton = site
    refused = requests.post(f"{base}/v2/repository/index", headers={"triton-admin-key": "k"})
    assert refused.status_code == 404 and refused.json()["field"] == "path"
    url = f"{base}/v2/models/sam2_session/infer"
    big = requests.post(url, data=b"x" * (4 * 2**20 + 1))
    assert big.status_code == 413 and big.json()["field"] == "body"
    header = b'{"inputs": []}'

    def chunks():  # no Content-Length: the bound is found while the upload streams
        yield header
        for _ in range(5):
            yield b"\0" * 2**20

    chunked = requests.post(
        url, data=chunks(), headers={"Inference-Header-Content-Length": str(len(header))}
    )
    assert chunked.status_code == 413 and chunked.json()["field"] == "body"
    all_json = requests.post(url, data=chunks())  # no header length: too large to check
    assert all_json.status_code == 413
    assert not [s for s in triton.seen if s[0] == "POST"]


def test_the_page_and_the_models_it_can_use(site):
    base, _ = site
    page = requests.get(f"{base}/", timeout=10)
    assert page.status_code == 200 and page.url.endswith("/web/")
    assert '<script type="module" src="app.js">' in page.text
    for name in (
        "app.js",
        "kserve.js",
        "exemplars.js",
        "lane.js",
        "rle.js",
        "export.js",
        "style.css",
    ):
        assert requests.get(f"{base}/web/{name}", timeout=10).status_code == 200, name
    models = requests.get(f"{base}/web/models", timeout=10).json()["models"]
    # pixel-prompt session models that are ready, and concept models; nothing else
    assert [(m["name"], m["kind"]) for m in models] == [
        ("sam2_session", "session"),
        ("sam3_concept", "concept"),
        ("sam3_session", "session"),
    ]
    assert json.dumps(models).count("SAM2.1") == 1
    assert models[-1]["label"] == "SAM3 tracker (sam3_session)"


def test_models_answer_503_when_triton_is_unreachable():
    routes, close = web_routes(PassThroughOptions("http://127.0.0.1:9"))
    with running_gateway(create_app(extra_routes=routes, on_close=[close])) as base:
        answer = requests.get(f"{base}/web/models", timeout=10)
        assert answer.status_code == 503 and answer.json()["field"] == "triton"
        infer = requests.post(f"{base}/v2/models/sam2_session/infer", data=b"{}", timeout=10)
        assert infer.status_code == 503


def test_web_server_serves_the_page_beside_a_running_triton(tmp_path):
    for name in ("sam2_decoder", "sam2_session", "sam2_encoder"):
        (tmp_path / name).mkdir()
    assert served_family(tmp_path) == "sam2"
    assert served_family(tmp_path / "sam2_decoder", default="sam1") == "sam1"  # no session
    with FakeTriton() as triton_url:
        with WebServer(triton_url, "127.0.0.1:1", port=0) as server:
            assert server.port != 0 and server.url.endswith("/web/")
            assert "triton-sam annotator" in requests.get(server.url, timeout=10).text
            models = requests.get(server.url + "models", timeout=10).json()["models"]
            assert models[0]["name"] == "sam2_session"
        with pytest.raises(requests.ConnectionError):
            requests.get(server.url, timeout=2)  # stopped
