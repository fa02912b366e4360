"""bench.storm without a server: answers classified, the memory bound's formula."""

from __future__ import annotations

import time

import pytest

from triton_sam.bench import storm
from triton_sam.errors import (
    InputValidationError,
    InvalidRequestError,
    ServerOverloadedError,
    ServerUnavailableError,
)


def test_only_the_typed_overload_counts_as_a_refusal() -> None:
    tally = storm.Tally()
    t0 = time.perf_counter()
    tally.record(t0, None)
    tally.record(t0, ServerOverloadedError("exceeds maximum queue size"))
    tally.record(t0, ServerUnavailableError("connection reset"))  # a transport error
    tally.record(t0, InvalidRequestError("untyped 400"))
    assert (tally.ok, tally.refused, tally.errors) == (1, 1, 2)
    assert len(tally.latency_ms) == 1 and len(tally.error_samples) == 2


def test_the_memory_bound_is_the_documented_formula() -> None:
    mib = storm.MIB
    bound = storm.memory_bound(
        base_bytes=600 * mib,
        encoder_bytes=1024 * mib,
        max_concurrent_embeds=1,
        max_waiting_embeds=16,
        request_bytes=64 * mib,
        embed_bytes=48 * mib,
        cache_bytes=256 * mib,
    )
    assert bound == (600 + 1024 + 17 * 64 + 48 + 256) * mib
    assert storm.sam2_cpu_bound(600 * mib) == bound  # the CPU twin's defaults


def test_storm_settings_are_checked() -> None:
    with pytest.raises(InputValidationError, match="embeds"):
        storm.StormSettings(embeds=())
    with pytest.raises(InputValidationError, match="clickers"):
        storm.StormSettings(clickers=0)


def test_storm_images_are_distinct_pngs() -> None:
    files = storm.storm_images(3, (24, 32), seed=0)
    assert len(set(files)) == 3 and all(f.startswith(b"\x89PNG") for f in files)


def test_a_storm_report_compares_clicks_with_the_idle_ones_of_the_same_run(tmp_path) -> None:
    report = storm.StormReport("sam2_session", storm.StormSettings(embeds=(4,)))
    report.idle.latency_ms = [10.0, 20.0]
    run = storm.StormRun(4, 1, peak_mib=900.0)
    run.clicks.latency_ms = [20.0, 40.0]
    report.runs.append(run)
    summary = report.summary()
    assert summary["idle_clicks"]["p99"] == 19.9
    assert summary["runs"][0]["click_p95_over_idle_p95"] == 2.0
    assert summary["transport_errors"] == 0
    paths = storm.write_report(report, tmp_path)
    assert "| 4 | 1 | 0 | 0 | 0 |" in paths["md"].read_text()
