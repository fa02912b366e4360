"""The embedded tritonserver serving python-target models through runner_model.py.

One server for the module; the lifecycle tests start their own. Values are exact float32
arithmetic on small integers-ish data, compared at 1e-5.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from triton_sam.errors import ServerStartError
from triton_sam.server import EmbeddedTriton

tritonclient_http = pytest.importorskip("tritonclient.http")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = [pytest.mark.triton, pytest.mark.timeout(120)]

X = np.arange(8, dtype=np.float32).reshape(2, 4)
FIXED_DECODER = "tiny_decoder_fixed3"  # built by conftest.tiny_repository


@pytest.fixture(scope="module")
def server(embedded_triton, tiny_repository: Path) -> EmbeddedTriton:
    return embedded_triton(tiny_repository)


@pytest.fixture
def http(server: EmbeddedTriton):
    client = tritonclient_http.InferenceServerClient(server.http_address, concurrency=8)
    yield client
    client.close()  # an open keep-alive connection would hold the server's shutdown


@pytest.fixture
def grpc(server: EmbeddedTriton):
    client = tritonclient_grpc.InferenceServerClient(server.grpc_address)
    yield client
    client.close()


def _inputs(module, **arrays: np.ndarray) -> list:
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _outputs(module, *names: str) -> list:
    return [module.InferRequestedOutput(n) for n in names]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_infer_values_and_output_subsetting(protocol: str, request: pytest.FixtureRequest):
    client = request.getfixturevalue(protocol)
    module = tritonclient_http if protocol == "http" else tritonclient_grpc
    both = client.infer("tiny_encoder", _inputs(module, x=X))
    np.testing.assert_allclose(both.as_numpy("y"), 2 * X + 1, atol=1e-5)
    np.testing.assert_allclose(both.as_numpy("s"), X.sum(1, keepdims=True), atol=1e-5)
    only_s = client.infer("tiny_encoder", _inputs(module, x=X), outputs=_outputs(module, "s"))
    assert only_s.as_numpy("y") is None
    np.testing.assert_allclose(only_s.as_numpy("s"), X.sum(1, keepdims=True), atol=1e-5)


def test_variable_point_counts(http):
    for n in (1, 3, 7):
        p = np.ones((2, n, 2), dtype=np.float32)
        result = http.infer("tiny_decoder", _inputs(tritonclient_http, x=X, p=p))
        expected = X.sum(1, keepdims=True) + 2 * n
        np.testing.assert_allclose(result.as_numpy("t"), expected, atol=1e-5)


def test_concurrent_requests_are_batched(http):
    before = _settled_stats(http, "tiny_encoder")
    xs = [np.full((1, 4), i, dtype=np.float32) for i in range(8)]
    pending = [http.async_infer("tiny_encoder", _inputs(tritonclient_http, x=x)) for x in xs]
    for x, result in zip(xs, (p.get_result() for p in pending), strict=True):
        np.testing.assert_allclose(result.as_numpy("y"), 2 * x + 1, atol=1e-5)
    # Triton updates its statistics just after releasing the responses: wait for them.
    after = _stats_when(
        http, "tiny_encoder", lambda st: st["inference_count"] >= before["inference_count"] + 8
    )
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 8
    assert executions < inferences, "the dynamic batcher never merged requests"


def test_bad_shape_is_rejected_and_the_server_stays_ready(http, grpc):
    with pytest.raises(InferenceServerException, match="x"):
        http.infer("tiny_encoder", _inputs(tritonclient_http, x=np.zeros((1, 5), np.float32)))
    with pytest.raises(InferenceServerException):
        grpc.infer("tiny_encoder", _inputs(tritonclient_grpc, x=np.zeros((1, 5), np.float32)))
    assert http.is_server_ready() and http.is_model_ready("tiny_encoder")
    result = http.infer("tiny_encoder", _inputs(tritonclient_http, x=X))
    np.testing.assert_allclose(result.as_numpy("y"), 2 * X + 1, atol=1e-5)


def test_onnxruntime_failure_is_an_error_response(http):
    # Triton lets 5 points through (config dim -1); the graph takes exactly 3.
    bad = _inputs(tritonclient_http, x=X, p=np.zeros((2, 5, 2), np.float32))
    with pytest.raises(InferenceServerException, match="onnxruntime failed"):
        http.infer(FIXED_DECODER, bad)
    assert http.is_model_ready(FIXED_DECODER)
    good = http.infer(FIXED_DECODER, _inputs(tritonclient_http, x=X, p=np.ones((2, 3, 2), "f4")))
    np.testing.assert_allclose(good.as_numpy("t"), X.sum(1, keepdims=True) + 6, atol=1e-5)


def test_urls_and_metrics(server: EmbeddedTriton):
    import urllib.request

    assert server.http_url == f"http://{server.http_address}"
    assert server.grpc_url == f"grpc://{server.grpc_address}"
    with urllib.request.urlopen(f"{server.metrics_url}/metrics", timeout=5) as r:
        assert b"nv_inference_request_success" in r.read()
    assert server.log_path is not None and server.log_path.is_file()


def test_explicit_model_control_then_stop_leaves_no_process(embedded_triton, tiny_repository: Path):
    server = embedded_triton(
        tiny_repository, model_control="explicit", load_models=["tiny_encoder"]
    )
    client = tritonclient_http.InferenceServerClient(server.http_address)
    try:
        assert client.is_model_ready("tiny_encoder")
        assert not client.is_model_ready("tiny_decoder")
    finally:
        client.close()
    group = _process_group(server.pid)
    assert len(group) >= 2, "expected the server and its python-backend stub"
    server.stop()
    assert not server.is_running() and server.pid is None
    # Gone from /proc: neither running nor a zombie waiting to be reaped.
    assert [p for p in group if Path(f"/proc/{p}").exists()] == []
    server.stop()  # idempotent


def test_start_failure_raises_with_the_log_and_cleans_up(tmp_path: Path, tiny_repository: Path):
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(tiny_repository / "tiny_encoder", repo / "tiny_encoder", symlinks=True)
    (repo / "tiny_encoder" / "1" / "model.onnx").write_bytes(b"not an onnx graph")
    server = EmbeddedTriton(repo, http_port=0, grpc_port=0, metrics_port=0, startup_timeout_s=60)
    with pytest.raises(ServerStartError) as info, server:
        pass
    message = str(info.value)
    assert "exited" in message and "model failed to load" in message and "tiny_encoder" in message
    assert not server.is_running()
    # A failed start keeps its (default, temporary) log: the message points at it.
    assert server.log_path is not None and str(server.log_path) in message
    server.log_path.unlink()


def _stats(client, model: str) -> dict[str, int]:
    stats = client.get_inference_statistics(model)["model_stats"][0]
    return {k: int(stats[k]) for k in ("inference_count", "execution_count")}


def _stats_when(client, model: str, done, timeout_s: float = 10.0) -> dict[str, int]:
    """Statistics once ``done(stats)`` holds (or the last reading after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    stats = _stats(client, model)
    while not done(stats) and time.monotonic() < deadline:
        time.sleep(0.05)
        stats = _stats(client, model)
    return stats


def _settled_stats(client, model: str) -> dict[str, int]:
    """Statistics once earlier tests' late updates have landed (two equal readings)."""
    previous, current = None, _stats(client, model)
    for _ in range(40):
        if current == previous:
            break
        time.sleep(0.05)
        previous, current = current, _stats(client, model)
    return current


def _process_group(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            # Fields after the ")" that closes the command name: state ppid pgrp ...
            if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
                members.append(int(entry))
    return members
