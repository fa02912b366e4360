"""``triton-sam bench large`` on the served SAM2.1-tiny, at small sizes: every row runs, and
what it says it embedded is what the server's encoder ran (the benchmark checks that itself
and raises otherwise; here the counts are pinned too)."""

from __future__ import annotations

import json

import pytest

from triton_sam.bench import large as bench

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(900)]


def test_bench_large_rows_and_the_servers_counts(sam2_tiny_repository, embedded_triton, tmp_path):
    data = bench.datasets(tmp_path / "data", (256, 1600))  # 1600: 3 x 3 tiles of 768
    assert sorted(p.name for p in data.iterdir()) == ["1600.zarr", "256.zarr"]
    server = embedded_triton(sam2_tiny_repository, data_roots={bench.ROOT: str(data)})
    settings = bench.LargeBenchSettings(small=256, large=1600, clicks=3, precompute_tiles=2)
    report = bench.run_large_benchmark(
        server.http_url, server.http_url, settings, server_pid=server.pid, model_type="sam2"
    )
    assert [row["encoder_runs"] for row in report.open_first] == [1, 1]  # one tile each
    # tiles 3 and 4 (the second row's first two); 4 holds the centre, clicked already
    assert report.precompute["tiles"] == 1
    assert report.clicks["large"]["p50"] > 0 and report.clicks["small"]["p50"] > 0
    memory = report.memory
    assert memory["server_peak_bytes"] > 0 and memory["client_peak_bytes"] > 0
    assert 0 <= memory["client_growth_bytes"] <= memory["client_peak_bytes"]
    paths = bench.write_report(report, tmp_path / "out")
    assert json.loads(paths["json"].read_text())["settings"]["large"] == 1600
    assert "tile held" in paths["md"].read_text()
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
