"""bench.soak_report without a server: percentiles, memory growth and the files written."""

from __future__ import annotations

import json

import pytest

from triton_sam.bench.soak import MIB, MemorySample, SoakReport, SoakSettings, write_report


def test_summary_and_files_of_a_soak(tmp_path):
    report = SoakReport("sam2", "grpc", SoakSettings(sessions=2, duration_s=1.0))
    report.requests, report.prompts_s = 5, 2.0
    report.decode_ms, report.encode_ms = [10.0, 20.0, 30.0, 40.0], [500.0]
    report.server, report.counted = {"executed": 4}, ["sam2_decoder"]
    # server memory: 100 MiB in the first third, 130 MiB in the last
    report.memory = [
        MemorySample(float(t), 50 * MIB, m * MIB)
        for t, m in enumerate([100, 100, 120, 130, 130, 130])
    ]
    summary = report.summary()
    assert summary["decode_per_s"] == 2.0 and summary["executed_server"] == 4
    assert summary["decode_ms"]["p50"] == 25.0 and summary["decode_ms"]["max"] == 40.0
    assert summary["server_rss"]["growth_mib"] == pytest.approx(30.0)
    assert summary["client_rss"]["growth_mib"] == 0.0
    paths = write_report(report, tmp_path)
    payload = json.loads(paths["json"].read_text())
    assert payload["summary"]["requests"] == 5 and len(payload["memory"]) == 6
    assert "| 5 | 0 | 4 |" in paths["md"].read_text()
