"""Bearer-token tenancy at the shipped proxy: a real nginx (the rendered configuration) in
front of the embedded Triton, over HTTP and gRPC, with raw requests.

An echo model (python backend) answers each request's parameters as Triton hands them to
the models, so the tests see exactly what a server-side model sees: the tenant the proxy set
from the token, never one the client chose. Triton runs with the header-forward patterns of
``serving.protocol.tenancy``.

- no token, a malformed or an unknown token: HTTP 401 / gRPC UNAUTHENTICATED, from nginx;
- a valid token: the request reaches Triton with ``triton-sam-tenant: <tenant>``; a header of
  that name sent by the client (any case) is replaced; a body parameter of that name arrives
  next to the proxy's header, and ``tenancy.tenant_from_parameters`` refuses the request;
- health stays open; the admin APIs are not served through the proxy, with or without a
  token;
- tokens off: a client-sent ``triton-sam-tenant`` header is dropped (the default tenant).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from triton_sam.scaleout.nginx import new_token
from triton_sam.scaleout.proxy import NginxProxy, find_nginx
from triton_sam.server import EmbeddedTriton
from triton_sam.serving.protocol import ProtocolError
from triton_sam.serving.protocol.tenancy import (
    FORWARD_PATTERN,
    TENANT_HEADER,
    tenant_from_parameters,
)

pytestmark = [pytest.mark.triton, pytest.mark.timeout(300)]

TOKEN_A, TOKEN_B = new_token(), new_token()
TOKENS = {TOKEN_A: "team-a", TOKEN_B: "team-b"}

ECHO_CONFIG = """name: "echo"
backend: "python"
max_batch_size: 0
input [{ name: "x", data_type: TYPE_INT32, dims: [1] }]
output [{ name: "y", data_type: TYPE_STRING, dims: [1] }]
instance_group [{ kind: KIND_CPU, count: 1 }]
"""
ECHO_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("y", np.array([r.parameters().encode()], dtype=np.object_))]
            )
            for r in requests
        ]
"""


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    find_nginx()  # `make proxy-tools` installs it
    repo = tmp_path_factory.mktemp("echo_repository")
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "config.pbtxt").write_text(ECHO_CONFIG)
    (repo / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    forward = [
        f"--http-header-forward-pattern={FORWARD_PATTERN}",
        f"--grpc-header-forward-pattern={FORWARD_PATTERN}",
    ]
    with EmbeddedTriton(
        repo, http_port=0, grpc_port=0, metrics_port=0, extra_args=forward
    ) as server:
        yield server


@pytest.fixture(scope="module")
def proxy(triton):
    with NginxProxy([triton.http_address], [triton.grpc_address], tokens=TOKENS) as p:
        yield p


@pytest.fixture(scope="module")
def open_proxy(triton):
    with NginxProxy([triton.http_address], [triton.grpc_address]) as p:
        yield p


def http(address: str, path: str, *, headers=None, body=None) -> tuple[int, str]:
    """One raw HTTP request: (status, body)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{address}{path}", data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def echo_http(address: str, headers=None, parameters=None) -> tuple[int, str]:
    """The echo model's answer over HTTP: (status, the request's parameters as it saw them)."""
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [1]}]}
    if parameters:
        body["parameters"] = parameters
    status, text = http(address, "/v2/models/echo/infer", headers=headers, body=body)
    if status != 200:
        return status, text
    return status, json.loads(text)["outputs"][0]["data"][0]


def echo_grpc(address: str, headers=None, parameters=None) -> str:
    """The echo model's answer over gRPC: the request's parameters as it saw them."""
    with grpcclient.InferenceServerClient(address) as client:
        x = grpcclient.InferInput("x", [1], "INT32")
        x.set_data_from_numpy(np.array([1], np.int32))
        result = client.infer("echo", [x], headers=headers, parameters=parameters)
        return result.as_numpy("y")[0].decode()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def tenant_keys(parameters_json: str) -> list[tuple[str, object]]:
    pairs = json.loads(parameters_json, object_pairs_hook=list)
    return [(k, v) for k, v in pairs if k.lower() == TENANT_HEADER]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        bearer(new_token()),  # well-formed, unknown
        bearer("not-hex-at-all"),
        {"Authorization": TOKEN_A},  # no scheme
        {"Authorization": f"Basic {TOKEN_A}"},
        bearer(TOKEN_A[:-1]),  # a prefix of a valid one
        {TENANT_HEADER: "team-a"},  # naming a tenant is no credential
    ],
    ids=["none", "unknown", "malformed", "no_scheme", "basic", "prefix", "tenant_header"],
)
def test_http_without_a_valid_token_is_401_from_the_proxy(proxy, headers):
    status, text = echo_http(proxy.http_address, headers=headers)
    assert status == 401, text
    assert json.loads(text)["error"] == "a valid bearer token is required"


def test_http_with_a_token_reaches_triton_as_its_tenant_and_a_forged_one_is_replaced(proxy):
    status, seen = echo_http(proxy.http_address, headers=bearer(TOKEN_A))
    assert status == 200 and tenant_from_parameters(seen) == "team-a"
    assert tenant_keys(seen) == [(TENANT_HEADER, "team-a")]
    # the scheme in any case; another token is another tenant
    status, seen = echo_http(proxy.http_address, headers={"Authorization": f"bearer {TOKEN_B}"})
    assert status == 200 and tenant_from_parameters(seen) == "team-b"
    for name in (TENANT_HEADER, "Triton-Sam-Tenant", "TRITON-SAM-TENANT"):
        status, seen = echo_http(proxy.http_address, headers={**bearer(TOKEN_A), name: "team-b"})
        assert status == 200 and tenant_keys(seen) == [(TENANT_HEADER, "team-a")], name


def test_http_a_tenant_in_the_body_arrives_next_to_the_proxys_and_is_refused(proxy):
    status, seen = echo_http(
        proxy.http_address, headers=bearer(TOKEN_A), parameters={TENANT_HEADER: "team-b"}
    )
    assert status == 200
    assert sorted(v for _, v in tenant_keys(seen)) == ["team-a", "team-b"]
    with pytest.raises(ProtocolError, match=f"^{TENANT_HEADER}: given 2 times"):
        tenant_from_parameters(seen)


def test_http_health_is_open_and_the_admin_apis_are_not_served(proxy):
    for path in ("/v2/health/ready", "/v2/health/live"):
        assert http(proxy.http_address, path)[0] == 200
    admin = [
        ("/v2/repository/index", {}),
        ("/v2/repository/models/echo/unload", {}),
        ("/v2/systemsharedmemory/status", None),
        ("/v2/cudasharedmemory/status", None),
        ("/v2/trace/setting", None),
        ("/v2/models/echo/trace/setting", None),
        ("/v2/logging", None),
        ("/v2/REPOSITORY/index", {}),  # Triton's routes are case-sensitive, the proxy is not
        ("/v2//repository/index", {}),  # nginx merges the slashes before matching
        ("/v2/%72epository/index", {}),  # and decodes the escapes
    ]
    for path, body in admin:
        status, text = http(proxy.http_address, path, headers=bearer(TOKEN_A), body=body)
        assert status == 403, (path, status, text)
    assert http(proxy.http_address, "/v2/models/echo/ready", headers=bearer(TOKEN_A))[0] == 200


@pytest.mark.parametrize(
    "headers",
    [None, {"authorization": f"Bearer {new_token()}"}, {TENANT_HEADER: "team-a"}],
    ids=["none", "unknown", "tenant_header"],
)
def test_grpc_without_a_valid_token_is_unauthenticated(proxy, headers):
    with pytest.raises(InferenceServerException) as info:
        echo_grpc(proxy.grpc_address, headers=headers)
    assert info.value.status() == str(grpc.StatusCode.UNAUTHENTICATED)


def test_grpc_with_a_token_reaches_triton_as_its_tenant_and_a_forged_one_is_replaced(proxy):
    seen = echo_grpc(proxy.grpc_address, headers={"authorization": f"Bearer {TOKEN_B}"})
    assert tenant_from_parameters(seen) == "team-b"
    assert tenant_keys(seen) == [(TENANT_HEADER, "team-b")]
    forged = {"authorization": f"Bearer {TOKEN_A}", TENANT_HEADER: "team-b"}
    assert tenant_keys(echo_grpc(proxy.grpc_address, headers=forged)) == [(TENANT_HEADER, "team-a")]
    # a tenant in the request's parameters arrives next to the proxy's, and is refused
    seen = echo_grpc(
        proxy.grpc_address,
        headers={"authorization": f"Bearer {TOKEN_A}"},
        parameters={TENANT_HEADER: "team-b"},
    )
    assert sorted(v for _, v in tenant_keys(seen)) == ["team-a", "team-b"]
    with pytest.raises(ProtocolError, match=f"^{TENANT_HEADER}: given 2 times"):
        tenant_from_parameters(seen)


def test_grpc_health_is_open_and_the_admin_methods_are_not_served(proxy):
    with grpcclient.InferenceServerClient(proxy.grpc_address) as client:
        assert client.is_server_ready() and client.is_server_live()
    token = {"authorization": f"Bearer {TOKEN_A}"}
    with grpcclient.InferenceServerClient(proxy.grpc_address) as client:
        calls = [
            lambda: client.get_model_repository_index(headers=token),
            lambda: client.unload_model("echo", headers=token),
            lambda: client.get_system_shared_memory_status(headers=token),
            lambda: client.get_cuda_shared_memory_status(headers=token),
            lambda: client.get_trace_settings(headers=token),
            lambda: client.get_log_settings(headers=token),
        ]
        for call in calls:
            with pytest.raises(InferenceServerException) as info:
                call()
            assert info.value.status() == str(grpc.StatusCode.PERMISSION_DENIED)
        assert client.is_model_ready("echo", headers=token)


def test_tokens_off_a_client_cannot_name_a_tenant_through_the_proxy(open_proxy):
    status, seen = echo_http(open_proxy.http_address, headers={"Triton-Sam-Tenant": "team-b"})
    assert status == 200 and tenant_keys(seen) == []
    seen = echo_grpc(open_proxy.grpc_address, headers={TENANT_HEADER: "team-b"})
    assert tenant_keys(seen) == [] and tenant_from_parameters(seen) == ""


@pytest.fixture(scope="module")
def auth_check(tmp_path_factory):
    """The Kubernetes overlay's token check (``render_auth_conf``) in a real nginx."""
    import socket
    import subprocess
    import time

    from triton_sam.scaleout.nginx import render_auth_conf, write_tokens_file

    prefix = tmp_path_factory.mktemp("auth_check")
    prefix.chmod(0o755)
    for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (prefix / sub).mkdir(mode=0o777)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tokens = write_tokens_file(prefix / "tokens.map", TOKENS)
    conf = prefix / "nginx.conf"
    conf.write_text(render_auth_conf(str(tokens), listen=f"127.0.0.1:{port}", prefix=str(prefix)))
    process = subprocess.Popen(
        [str(find_nginx()), "-p", str(prefix), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and process.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def check(address: str, url: str, headers=None) -> tuple[int, str]:
    """What the token check answers ingress-nginx about a request for ``url``."""
    request = urllib.request.Request(
        f"http://{address}/auth", headers={"X-Original-URL": url, **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get(TENANT_HEADER, "")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get(TENANT_HEADER, "")


def test_the_ingress_token_check_answers_the_tenant_of_a_valid_token_only(auth_check):
    infer = "https://sam.example.com/v2/models/sam2_session/infer"
    assert check(auth_check, infer) == (401, "")
    assert check(auth_check, infer, bearer(new_token())) == (401, "")
    assert check(auth_check, infer, {TENANT_HEADER: "team-a"}) == (401, "")
    assert check(auth_check, infer, bearer(TOKEN_A)) == (204, "team-a")
    grpc_infer = "https://grpc.sam.example.com/inference.GRPCInferenceService/ModelInfer"
    assert check(auth_check, grpc_infer, {"authorization": f"bearer {TOKEN_B}"}) == (
        204,
        "team-b",
    )


@pytest.mark.parametrize(
    "path",
    [
        "/v2/repository/index",
        "/v2/repository/models/x/load",
        "//v2//repository/index",
        "/V2/Repository/index",
        "/v2/%72epository/index",
        "/v2/models/../repository/index",
        "/v2/systemsharedmemory/status",
        "/v2/cudasharedmemory/status",
        "/v2/logging?x=1",
        "/v2/trace/setting",
        "/v2/models/m/versions/1/trace/setting",
        "/inference.GRPCInferenceService/RepositoryModelLoad",
        "/inference.GRPCInferenceService/LogSettings",
    ],
)
def test_the_ingress_token_check_refuses_the_admin_apis_with_any_token(auth_check, path):
    assert check(auth_check, "https://sam.example.com" + path, bearer(TOKEN_A))[0] == 403
