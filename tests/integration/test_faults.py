"""Faults: a server killed mid-request, restarted between calls, a model unloaded, a slow
server, and overload. Each test starts its own tritonserver (some are killed).

A "slow" python-backend model sleeps before answering, so timing is under the test's
control; its config is rendered by the same code as SAM's (``build_config``), with a tiny
queue, so the queue policy is exercised end to end on the real server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from triton_sam.client import SAM2TritonClient, SpeculativeSAM2Client
from triton_sam.client.async_transport import AsyncTransport
from triton_sam.client.retry import NO_RETRY
from triton_sam.client.transport import Transport, resolve_endpoint
from triton_sam.errors import (
    InferenceTimeoutError,
    ModelNotReadyError,
    ServerError,
    ServerOverloadedError,
    ServerUnavailableError,
)
from triton_sam.models.spec import FamilySpec, Preprocessing, TensorSpec
from triton_sam.repository.config import RepositoryOptions, build_config, config_to_text
from triton_sam.server import EmbeddedTriton

pytestmark = [pytest.mark.triton, pytest.mark.slow]

SLOW_S = 1.5
QUEUE_SIZE = 2
SLOW_MODEL = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.sleep_s = float(params["sleep_s"]["string_value"])

    def execute(self, requests):
        time.sleep(self.sleep_s)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            t = x.sum(axis=1, keepdims=True).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("t", t)]))
        return responses
"""
# Tensor contract of the slow model (only the config is rendered from it).
SLOW_FAMILY = FamilySpec(
    family="slow",
    preprocessing=Preprocessing(
        image_size=4,
        resize="square",
        pixel_mean=(0.0, 0.0, 0.0),
        pixel_std=(1.0, 1.0, 1.0),
        pixel_scale=1.0,
        mask_size=1,
    ),
    encoder_inputs=(TensorSpec("x", "float32", (4,)),),
    encoder_outputs=(TensorSpec("t", "float32", (1,)),),
    decoder_inputs=(TensorSpec("x", "float32", (4,)), TensorSpec("p", "float32", (-1, 2))),
    decoder_outputs=(TensorSpec("t", "float32", (1,)),),
    exporter="none",
    encoder_model="slow_encoder",
    decoder_model="slow",
)
X = {"x": np.ones((1, 4), np.float32), "p": np.zeros((1, 1, 2), np.float32)}


def _slow_repository(root: Path, sleep_s: float) -> Path:
    """``slow``: one instance, batch 1, a queue of QUEUE_SIZE, REJECT beyond it."""
    options = RepositoryOptions(
        target="python",
        decoder_max_batch_size=1,
        max_queue_delay_us=0,
        decoder_max_queue_size=QUEUE_SIZE,
        decoder_queue_timeout_us=0,
    )
    config = build_config(SLOW_FAMILY, "decoder", options, name="slow")
    config.parameters["sleep_s"].string_value = str(sleep_s)
    model = root / "slow"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(config_to_text(config))
    (model / "1" / "model.py").write_text(SLOW_MODEL)
    return root


@pytest.fixture(scope="module")
def slow_repository(tmp_path_factory) -> Path:
    return _slow_repository(tmp_path_factory.mktemp("slow") / "repo", SLOW_S)


@pytest.fixture(scope="module")
def slow_server(embedded_triton, slow_repository) -> Any:
    server = embedded_triton(slow_repository)
    yield server
    server.stop()


def _ready(server: EmbeddedTriton) -> bool:
    try:
        with urllib.request.urlopen(f"{server.http_url}/v2/health/ready", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def _transport(server: EmbeddedTriton, protocol: str, **kwargs: Any) -> Transport:
    url = server.http_url if protocol == "http" else server.grpc_url
    return Transport(resolve_endpoint(url, protocol), **kwargs)


def _timed(fn: Any) -> tuple[float, Any, BaseException | None]:
    t0 = time.monotonic()
    try:
        return time.monotonic() - t0, fn(), None
    except Exception as e:
        return time.monotonic() - t0, None, e


def _wait_idle(server: EmbeddedTriton, timeout_s: float = 30.0) -> None:
    """Until one request goes through unrejected: nothing left in the queue."""
    transport = _transport(server, "grpc", timeout_s=timeout_s, retry=NO_RETRY)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                transport.infer("slow", X, ["t"])
                return
            except ServerOverloadedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(SLOW_S / 2)
    finally:
        transport.close()


# -- slow server and overload ---------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_per_request_timeout_is_honoured(slow_server, protocol):
    transport = _transport(slow_server, protocol, timeout_s=0.4, retry=NO_RETRY)
    elapsed, _, error = _timed(lambda: transport.infer("slow", X, ["t"]))
    transport.close()
    assert isinstance(error, InferenceTimeoutError), repr(error)
    assert elapsed < 0.4 + 1.0, f"gave up after {elapsed:.2f} s"
    assert _ready(slow_server)


def test_async_timeout_is_honoured(slow_server):
    async def main() -> tuple[float, Any, BaseException | None]:
        endpoint = resolve_endpoint(slow_server.grpc_url, "grpc")
        transport = AsyncTransport(endpoint, timeout_s=0.4, retry=NO_RETRY)
        t0 = time.monotonic()
        try:
            await transport.infer("slow", X, ["t"], idempotent=True)
            return time.monotonic() - t0, None, None
        except Exception as e:
            return time.monotonic() - t0, None, e
        finally:
            await transport.close()

    elapsed, _, error = asyncio.run(main())
    assert isinstance(error, InferenceTimeoutError), repr(error)
    assert elapsed < 1.4


def test_overload_is_rejected_quickly_with_a_typed_error(slow_server):
    """A burst of 8 at a model that runs one request per SLOW_S with a queue of 2: one runs,
    two wait, the rest are refused at once instead of piling up."""
    _wait_idle(slow_server)  # requests the timeout tests gave up on may still be queued
    burst = 8
    start = threading.Barrier(burst)

    def one(_: int) -> tuple[float, Any, BaseException | None]:
        transport = _transport(slow_server, "grpc", timeout_s=30, retry=NO_RETRY)
        try:
            start.wait()
            return _timed(lambda: transport.infer("slow", X, ["t"], idempotent=True))
        finally:
            transport.close()

    with concurrent.futures.ThreadPoolExecutor(burst) as pool:
        results = list(pool.map(one, range(burst)))
    rejected = [(t, e) for t, _, e in results if e is not None]
    served = [t for t, _, e in results if e is None]
    assert all(isinstance(e, ServerOverloadedError) for _, e in rejected), rejected
    assert len(rejected) >= burst - 1 - QUEUE_SIZE - 1  # allow one to slip into a slot
    assert len(served) >= 1
    assert max(t for t, _ in rejected) < SLOW_S, "rejections must not wait for the model"
    assert "max_queue_size" in str(rejected[0][1])
    assert _ready(slow_server)


# -- killed mid-request -------------------------------------------------------------------------
def test_server_killed_mid_request_gives_a_clear_error_without_hanging(
    embedded_triton, tmp_path_factory
):
    repo = _slow_repository(tmp_path_factory.mktemp("slow_kill") / "repo", sleep_s=30)
    server = embedded_triton(repo)
    timeout_s = 20.0
    clients = {p: _transport(server, p, timeout_s=timeout_s) for p in ("http", "grpc")}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {
            p: pool.submit(_timed, lambda t=t: t.infer("slow", X, ["t"], idempotent=True))
            for p, t in clients.items()
        }
        time.sleep(1.0)  # both requests are now executing or queued
        os.kill(server.pid, signal.SIGKILL)
        outcomes = {p: f.result(timeout=timeout_s + 10) for p, f in futures.items()}
    server.stop()
    for protocol, (elapsed, result, error) in outcomes.items():
        assert result is None
        # retried (idempotent) against a dead server, then given up: unavailable, in time
        assert isinstance(error, ServerError), f"{protocol}: {error!r}"
        assert isinstance(error, ServerUnavailableError), f"{protocol}: {error!r}"
        assert elapsed < timeout_s, f"{protocol}: {elapsed:.1f} s"
    for t in clients.values():
        t.close()


# -- restart and unload, with the SAM clients ------------------------------------------------
def _stateless(cls: type) -> dict[str, Any]:
    """Keep the embeddings client-side (the stateless path) where the client offers both."""
    params = inspect.signature(cls.__init__).parameters
    return {"use_server_embeddings": False} if "use_server_embeddings" in params else {}


IMAGE = np.random.default_rng(3).integers(0, 255, (40, 56, 3), dtype=np.uint8)
CLICK = {"point_coords": [[20, 20]], "point_labels": [1]}


def test_clients_reconnect_after_a_restart_on_the_same_ports(embedded_triton, sam2_tiny_repository):
    first = embedded_triton(sam2_tiny_repository)
    ports = {"http_port": int(first.http_address.rsplit(":", 1)[1])}
    ports["grpc_port"] = int(first.grpc_address.rsplit(":", 1)[1])
    kwargs = {"timeout_s": 30.0}
    http = SAM2TritonClient(first.http_url, **kwargs, **_stateless(SAM2TritonClient))
    grpc = SAM2TritonClient(
        first.grpc_url, protocol="grpc", **kwargs, **_stateless(SAM2TritonClient)
    )
    spec = SpeculativeSAM2Client(first.grpc_url, **kwargs, **_stateless(SpeculativeSAM2Client))
    second: list[EmbeddedTriton] = []

    def crash_and_restart() -> None:
        os.kill(first.pid, signal.SIGKILL)
        first.stop()
        # while it is down: a clear error, quickly (a few backoff retries, no hang)
        elapsed, _, error = _timed(lambda: http.predict(**CLICK))
        assert isinstance(error, ServerUnavailableError) and elapsed < 10, (elapsed, error)
        server = EmbeddedTriton(sam2_tiny_repository, metrics_port=0, **ports)
        second.append(server)
        server.start()

    async def main() -> None:
        for client in (http, grpc):
            client.set_image(IMAGE)
        await spec.set_image_async(IMAGE)
        before = (await (await spec.predict_async(**CLICK, session_id="s"))[1])[0]
        await asyncio.to_thread(crash_and_restart)
        for client in (http, grpc):  # embeddings kept client-side: only decoding again
            masks, _ = client.predict(**CLICK)
            assert masks.shape == (1, 1, 40, 56)
            client.set_image(IMAGE)  # and the encoder is reachable again
        after = (await (await spec.predict_async(**CLICK, session_id="s"))[1])[0]
        np.testing.assert_allclose(after, before, atol=1e-4)
        await spec.aclose()

    try:
        asyncio.run(main())
    finally:
        for client in (http, grpc):
            client.close()
        for server in second:
            server.stop()


def test_an_unloaded_model_is_a_typed_error_naming_it(embedded_triton, sam2_tiny_repository):
    server = embedded_triton(sam2_tiny_repository, model_control="explicit")
    client = SAM2TritonClient(server.http_url, timeout_s=30.0, **_stateless(SAM2TritonClient))
    client.set_image(IMAGE)
    client.predict(**CLICK)
    control = f"{server.http_url}/v2/repository/models/sam2_decoder"
    admin = server.admin_headers  # the repository API is restricted to the admin key
    unload = urllib.request.Request(f"{control}/unload", method="POST", headers=admin)
    urllib.request.urlopen(unload, timeout=30)
    elapsed, _, error = _timed(lambda: client.predict(**CLICK))
    assert isinstance(error, ModelNotReadyError), repr(error)
    assert error.model == "sam2_decoder" and "'sam2_decoder'" in str(error)
    assert elapsed < 5, "an unloaded model is not retried"
    # (explicit mode: /v2/health/ready is false while a model is unloaded; the rest serves)
    with urllib.request.urlopen(f"{server.http_url}/v2/health/live", timeout=5) as r:
        assert r.status == 200
    with urllib.request.urlopen(f"{server.http_url}/v2/models/sam2_encoder/ready") as r:
        assert r.status == 200
    load = urllib.request.Request(f"{control}/load", method="POST", headers=admin)
    urllib.request.urlopen(load, timeout=60)
    masks, _ = client.predict(**CLICK)
    assert masks.shape == (1, 1, 40, 56)
    client.close()
    server.stop()


# -- the parent dies ------------------------------------------------------------------------
PARENT = """
import sys, time
from triton_sam.server import EmbeddedTriton

server = EmbeddedTriton(sys.argv[1], http_port=0, grpc_port=0, metrics_port=0).start()
print(server.pid, flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited orphan waits for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/usr/bin/setpriv").exists(), reason="needs util-linux setpriv")
def test_a_killed_parent_takes_its_server_with_it(slow_repository, tmp_path):
    """A SIGKILLed test run or notebook kernel must not leave a tritonserver behind."""
    import subprocess
    import sys

    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(slow_repository)], stdout=subprocess.PIPE, text=True
    )
    try:
        server_pid = int(parent.stdout.readline())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 30
        while _running(server_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(server_pid), "tritonserver outlived its parent"
    finally:
        parent.kill()
