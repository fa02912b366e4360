"""The latency benchmarks run against the served SAM2.1-tiny and write their reports: the
per-path benchmark and the onnxruntime-backend-vs-runner comparison."""

from __future__ import annotations

import json

import pytest

from triton_sam.bench.latency import run_latency_benchmark, write_report
from triton_sam.tools.sample import sample_image

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(600)]


def test_benchmark_reports_every_path_and_level_against_the_ort_baseline(
    sam2_tiny_spec, sam2_tiny_repository, sam2_tiny_server, tmp_path
):
    server = sam2_tiny_server
    report = run_latency_benchmark(
        sam2_tiny_repository,
        {"http": server.http_url, "grpc": server.grpc_url},
        sam2_tiny_spec.family,
        sample_image(160, 120),
        concurrency=(1, 2),
        n_encode=1,
        n_decode=4,
    )
    paths = ("onnxruntime", "http", "grpc")
    expected = {(g, p, c) for g in ("encoder", "decoder") for p in paths for c in (1, 2)}
    assert {(s.graph, s.path, s.concurrency) for s in report.series} == expected
    for s in report.series:
        # at least one request per caller, and the requested count otherwise
        assert len(s.samples_ms) == max(1 if s.graph == "encoder" else 4, s.concurrency)
        assert all(ms > 0 for ms in s.samples_ms) and s.summary()["throughput"] > 0
    # the decoder request carries the embeddings: ~16 MiB for SAM2 in this stateless layout
    assert report.get("decoder", "grpc", 1).request_bytes > 16 * 2**20

    out = write_report(report, tmp_path)
    rows = json.loads(out["json"].read_text())["rows"]
    assert len(rows) == len(expected)
    assert all(r["x_ort_p50"] > 0 for r in rows)
    baseline = [r for r in rows if r["path"] == "onnxruntime"]
    assert all(r["x_ort_p50"] == pytest.approx(1.0) for r in baseline)
    assert "| decoder | grpc | 2 |" in out["md"].read_text()
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_backend_comparison_times_both_serving_paths_of_one_repository(
    sam2_tiny_spec, sam2_tiny_export, sam2_tiny_server, embedded_triton, tmp_path
):
    """`triton-sam bench backends`: the onnxruntime backend (the session server) against the
    python-runner twins of the same export, requests alternating; every number is the
    server's answer time, so the runner path must have really served (its configs say so)."""
    from triton_sam.bench import backends
    from triton_sam.repository.config import parse_config
    from triton_sam.repository.writer import embedded_repository

    runner_repo = embedded_repository(sam2_tiny_export, tmp_path / "runner", target="python")
    assert parse_config(runner_repo / "sam2_decoder" / "config.pbtxt").backend == "python"
    runner = embedded_triton(runner_repo)
    report = backends.compare_backends(
        {"onnxruntime": sam2_tiny_server.grpc_url, "python": runner.grpc_url},
        sam2_tiny_spec.family,
        sample_image(160, 120),
        n_encode=1,
        n_click=3,
        warmup=1,
    )
    runner.stop()
    rows = {r["request"]: r for r in report.table()}
    assert set(rows) == {"encode", "click"}
    for request, n in (("encode", 1), ("click", 3)):
        for path in backends.BACKENDS:
            assert len(report.samples_ms[request][path]) == n
            assert all(ms > 0 for ms in report.samples_ms[request][path])
        row = rows[request]
        assert row["ratio_p50"] == pytest.approx(row["python_p50"] / row["onnxruntime_p50"])
    text = backends.write_report(report, tmp_path / "out")["md"].read_text()
    assert "| click |" in text and "| encode |" in text
