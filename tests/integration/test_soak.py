"""The short soak of CI: 16 concurrent sessions for 10 + 10 s on the embedded server; zero failed
requests, latency percentiles reported, client and server memory sampled and bounded.

The full run is `triton-sam bench soak --duration 60` (pixi task `soak`).
"""

from __future__ import annotations

import math

import pytest

from triton_sam.bench.counters import every_decoder
from triton_sam.bench.harness import Served
from triton_sam.bench.soak import MIB, SoakSettings, run_soak_on_server, write_report

pytestmark = [pytest.mark.triton, pytest.mark.slow]

SESSIONS = 16
DURATION_S = 10.0
WARMUP_S = 10.0  # memory growth is measured after it
# Bounds on memory growth after the warm-up (medians of the first and last thirds of the
# samples). During the warm-up the server's python-backend shared-memory pools and
# onnxruntime arenas grow to hold batches of up to 16 requests of ~16 MiB of embeddings
# each (+0.6 to 1 GiB in the first 10 s); a leak of one embedding set per request would
# add ~1 GiB per 10 s here.
CLIENT_GROWTH_MIB = 300
SERVER_GROWTH_MIB = 500


@pytest.fixture(scope="module", params=["server_embeddings", "stateless"])
def soak(request, sam2_tiny_server):
    """Both paths: the clients' default (features kept by ``sam2_session``) and the
    stateless one (every click carries ~16 MiB of features). Returns the report and what
    every decoder of the server executed meanwhile (inferences, executions)."""
    settings = SoakSettings(
        sessions=SESSIONS,
        duration_s=DURATION_S,
        warmup_s=WARMUP_S,
        images=2,
        timeout_s=120,
        server_embeddings=request.param == "server_embeddings",
    )
    before = every_decoder(sam2_tiny_server.http_url)
    server = Served(
        sam2_tiny_server.grpc_url,
        sam2_tiny_server.http_url,
        sam2_tiny_server.metrics_url,
        sam2_tiny_server.pid,
    )
    report = run_soak_on_server(server, settings=settings)
    after = every_decoder(sam2_tiny_server.http_url)
    return report, (after[0] - before[0], after[1] - before[1])


@pytest.fixture(scope="module")
def report(soak):
    return soak[0]


def test_no_request_fails(report):
    assert report.failures == 0, report.errors
    assert len(report.decode_ms) >= SESSIONS  # every session got answers
    assert report.requests == len(report.decode_ms) + len(report.encode_ms)


def test_every_answered_click_ran_once_by_the_servers_counts(soak):
    report, (inferences, _) = soak
    # encodes run no decoder: every inference of every decoder is a click of the soak
    assert report.server["executed"] == inferences == len(report.decode_ms), report.server
    assert report.server["cancelled"] == 0
    assert "sam2_decoder" in report.counted  # what a stateless click calls
    assert ("sam2_session" in report.counted) == report.settings.server_embeddings


def test_latency_percentiles_are_reported(report, tmp_path):
    decode = report.summary()["decode_ms"]
    assert all(math.isfinite(decode[k]) for k in ("p50", "p95", "p99", "max"))
    assert decode["p50"] <= decode["p95"] <= decode["p99"] <= decode["max"]
    paths = write_report(report, tmp_path)
    text = paths["md"].read_text()
    assert "p50 / p95 / p99" in text and f"| {report.requests} | 0 |" in text


def test_client_and_server_memory_are_sampled_and_bounded(report):
    assert len(report.memory) >= 5
    assert all(s.server for s in report.memory), "the server's RSS must be visible"
    client, server = report.memory_summary("client"), report.memory_summary("server")
    assert client["growth_mib"] < CLIENT_GROWTH_MIB, client
    assert server["growth_mib"] < SERVER_GROWTH_MIB, server
    assert server["max_mib"] * MIB > 0
