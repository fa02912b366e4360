"""No admin surface without the key, and no model from a request, on every path we ship.

The attack: ``POST /v2/repository/models/<new>/load`` with a python-backend ``config`` and a
base64 ``file:1/model.py`` whose ``initialize`` writes a marker file. On an explicit-mode
server with open control APIs it ran (HTTP 200, marker written). Here it is sent with raw
requests (urllib, tritonclient), without the key and with it, to

- ``triton-sam serve`` itself (the CLI as a user runs it: poll mode, key from its file);
- the tritonserver arguments of both compose files and of the Kubernetes Deployment, run on
  the embedded server with the paths substituted.

Every time: refused, the marker never written, the server ready afterwards. The
model-repository, shared-memory, trace and logging APIs answer 403 (HTTP) / UNAVAILABLE
(gRPC) without the key and work with it.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from deploy_args import compose_command, kubernetes_args
from tritonclient.utils import InferenceServerException

from triton_sam.server import EmbeddedTriton
from triton_sam.server.admin_key import GRPC_HEADER, HTTP_HEADER, restriction_args

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(600)]

# HTTP endpoints of the four restricted APIs (method, path)
RESTRICTED_HTTP = [
    ("POST", "/v2/repository/index"),
    ("GET", "/v2/systemsharedmemory/status"),
    ("GET", "/v2/trace/setting"),
    ("GET", "/v2/logging"),
]
RESTRICTED_GRPC = [
    "get_model_repository_index",
    "get_system_shared_memory_status",
    "get_trace_settings",
    "get_log_settings",
]
SERVE_MODELS = {
    "sam2_encoder",
    "sam2_encoder_background",
    "sam2_decoder",
    "sam2_decoder_unbatched",
    "sam2_session",
    "sam2_large",  # images larger than SAM's input, over sam2_session
    "sam2",  # the Lambda seed's JSON contract, over sam2_session
    "sam2_everything",  # segment everything, over sam2_session
    "sam2_everything_decoder",
}


def evil_model(marker: Path) -> tuple[str, bytes]:
    """(config JSON, model.py) of a python-backend model whose load writes ``marker``."""
    config = {
        "name": "evil",
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "x", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "y", "data_type": "TYPE_INT32", "dims": [1]}],
    }
    source = (
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        f"        open({str(marker)!r}, 'w').write('ran')\n"
        "    def execute(self, requests):\n"
        "        return []\n"
    )
    return json.dumps(config), source.encode()


def http(url: str, method: str, path: str, body: object = None, headers=None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(
        url + path, data=data if method == "POST" else None, method=method, headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def attack(http_url: str, grpc_address: str, marker: Path, key: str) -> list[str]:
    """Send the upload-and-load attack over HTTP and gRPC, without and with ``key``;
    returns what each attempt answered (all must be refusals)."""
    config, source = evil_model(marker)
    body = {
        "parameters": {
            "config": config,
            "file:1/model.py": base64.b64encode(source).decode(),
        }
    }
    answers = []
    for headers in ({}, {HTTP_HEADER: key}):
        status, text = http(http_url, "POST", "/v2/repository/models/evil/load", body, headers)
        assert status != 200, f"HTTP load accepted ({headers and 'with' or 'without'} key)"
        answers.append(f"HTTP {status} {text}")
    client = grpcclient.InferenceServerClient(grpc_address)
    try:
        for headers in ({}, {GRPC_HEADER: key}):
            with pytest.raises(InferenceServerException) as refused:
                client.load_model(
                    "evil", headers=headers, config=config, files={"file:1/model.py": source}
                )
            answers.append(f"gRPC {refused.value}")
    finally:
        client.close()
    time.sleep(1.0)
    assert not marker.exists(), "the uploaded model.py ran"
    return answers


def assert_restricted(http_url: str, grpc_address: str, key: str) -> None:
    for method, path in RESTRICTED_HTTP:
        status, text = http(http_url, method, path)
        assert status == 403 and HTTP_HEADER in text, (path, status, text)
        status, text = http(http_url, method, path, headers={HTTP_HEADER: key})
        assert status == 200, (path, status, text)
        status, _ = http(http_url, method, path, headers={HTTP_HEADER: key[:-1] + "x"})
        assert status == 403, path
    client = grpcclient.InferenceServerClient(grpc_address)
    try:
        for call in RESTRICTED_GRPC:
            with pytest.raises(InferenceServerException, match="restricted"):
                getattr(client, call)()
            getattr(client, call)(headers={GRPC_HEADER: key})
        assert client.is_server_ready()  # health and metadata stay open
        assert client.get_inference_statistics() is not None  # statistics too
    finally:
        client.close()


def assert_ready(http_url: str) -> None:
    assert http(http_url, "GET", "/v2/health/ready")[0] == 200


# -- `triton-sam serve` ---------------------------------------------------------------------
class Served:
    def __init__(self, proc: subprocess.Popen, lines: list[str], config_home: Path) -> None:
        self.proc, self.lines = proc, lines
        self.http_url = next(x.split()[1] for x in lines if x.startswith("HTTP"))
        self.grpc_address = next(x.split()[1] for x in lines if x.startswith("gRPC"))
        self.grpc_address = self.grpc_address.removeprefix("grpc://")
        self.log = Path(next(x.split()[1] for x in lines if x.startswith("log")))
        self.key_file = config_home / "triton-sam" / "admin-key"
        self.key = self.key_file.read_text().strip()


@pytest.fixture(scope="module")
def served(sam2_tiny_export, tmp_path_factory) -> Iterator[Served]:
    """``triton-sam serve`` as a user runs it (no key anywhere yet: it makes one)."""
    config_home = tmp_path_factory.mktemp("config")
    exe = shutil.which("triton-sam") or str(Path(sys.executable).with_name("triton-sam"))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_ADMIN_KEY"}
    env["XDG_CONFIG_HOME"] = str(config_home)
    ports = ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
    proc = subprocess.Popen(
        [exe, "serve", "-r", str(sam2_tiny_export), *ports],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        lines = []
        for line in proc.stdout:  # the command prints its endpoints, then "ready"
            lines.append(line)
            if line.startswith("ready"):
                break
        assert lines and lines[-1].startswith("ready"), lines
        yield Served(proc, lines, config_home)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


def test_serve_keeps_the_key_in_an_owner_only_file_and_never_prints_it(served):
    assert stat.S_IMODE(served.key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(served.key_file.parent.stat().st_mode) == 0o700
    assert len(served.key) >= 43  # 256 random bits
    assert any(str(served.key_file) in x for x in served.lines), served.lines
    assert not any(served.key in x for x in served.lines)


def test_serve_refuses_a_model_sent_in_the_request(served, tmp_path):
    answers = attack(served.http_url, served.grpc_address, tmp_path / "marker", served.key)
    # without the key: restricted; with it: poll mode refuses every load
    assert "restricted" in answers[0] and "polling is enabled" in answers[1], answers
    assert "polling is enabled" in answers[3], answers
    assert_ready(served.http_url)


def test_serve_restricts_the_control_apis_to_the_key(served):
    assert_restricted(served.http_url, served.grpc_address, served.key)
    assert_ready(served.http_url)


def test_serve_in_poll_mode_loads_each_model_once(served):
    """Poll mode reloads a model whose files change: nothing changes by itself (the stub's
    ``__pycache__`` is written before start), so each model is loaded exactly once."""
    time.sleep(4.0)  # several scans of the repository (every 1 s)
    loaded = re.findall(r"successfully loaded '([^']+)'", served.log.read_text())
    assert sorted(loaded) == sorted(SERVE_MODELS), loaded


# -- the deployments' own tritonserver arguments ----------------------------------------------
DEPLOYMENTS = ["docker-compose.yml", "deploy/compose/docker-compose.yml", "kubernetes"]
KEY = "k" * 20 + "-deployment-test-key"


def deployment_args(which: str, repository: Path) -> list[str]:
    if which == "kubernetes":
        args = [a.replace("$(TRITON_ADMIN_KEY)", KEY) for a in kubernetes_args()]
    else:
        args = compose_command(which, {"TRITON_ADMIN_KEY": KEY})
    assert args[0] == "tritonserver"
    return [a.replace("=/models", f"={repository}") for a in args[1:]]


@pytest.mark.parametrize("which", DEPLOYMENTS)
def test_deployment_arguments_refuse_a_model_sent_in_the_request(
    which, embedded_triton, tiny_repository, tmp_path
):
    args = deployment_args(which, tiny_repository)
    # The restriction flags are exactly the package's for that key, so EmbeddedTriton (which
    # sets them from admin_key) runs the deployment's command as written.
    restricting = [a for a in args if a.startswith(("--http-restricted", "--grpc-restricted"))]
    assert restricting == restriction_args(KEY)
    rest = [a for a in args if a not in restricting and not a.startswith("--model-repository")]
    assert f"--model-repository={tiny_repository}" in args
    server = embedded_triton(tiny_repository, admin_key=KEY, extra_args=rest, strict_config=False)
    answers = attack(server.http_url, server.grpc_address, tmp_path / "marker", KEY)
    assert "restricted" in answers[0], answers
    assert_restricted(server.http_url, server.grpc_address, KEY)
    assert_ready(server.http_url)


def test_every_embedded_server_is_restricted_by_a_fresh_key(embedded_triton, tiny_repository):
    """No server we start is unrestricted: without a key, EmbeddedTriton makes one."""
    a = embedded_triton(tiny_repository)
    b = EmbeddedTriton(tiny_repository)
    assert len(a.admin_key) >= 43 and a.admin_key != b.admin_key
    assert a.admin_key not in repr(a)
    assert_restricted(a.http_url, a.grpc_address, a.admin_key)
