"""The latency benchmark runs against the served SAM2.1-tiny and writes its three reports."""

from __future__ import annotations

import json

import pytest

from triton_sam.bench.latency import run_latency_benchmark, write_report
from triton_sam.sample import sample_image

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(600)]


def test_benchmark_reports_every_path_against_the_ort_baseline(
    sam2_tiny_spec, sam2_tiny_repository, sam2_tiny_server, tmp_path
):
    server = sam2_tiny_server
    report = run_latency_benchmark(
        sam2_tiny_repository,
        {"http": server.http_url, "grpc": server.grpc_url},
        sam2_tiny_spec.family,
        sample_image(160, 120),
        n_encode=1,
        n_decode=3,
    )
    expected = {f"{g}/{p}" for g in ("encoder", "decoder") for p in ("onnxruntime", "http", "grpc")}
    assert set(report.series) == expected
    for key, series in report.series.items():
        assert len(series.samples_ms) == (1 if key.startswith("encoder") else 3)
        assert all(ms > 0 for ms in series.samples_ms)
    # the decoder request carries the embeddings: ~16 MiB for SAM2 in this stateless layout
    assert report.series["decoder/grpc"].request_bytes > 16 * 2**20

    paths = write_report(report, tmp_path)
    rows = json.loads(paths["json"].read_text())["rows"]
    assert {r["series"] for r in rows} == expected
    assert all(r["x_ort_p50"] > 0 for r in rows)
    assert "| decoder/grpc |" in paths["md"].read_text()
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
