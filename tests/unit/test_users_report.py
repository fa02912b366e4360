"""bench.users_report without a server: same-run ratios, goals and the files written."""

from __future__ import annotations

import json

import pytest

from triton_sam.bench import users
from triton_sam.bench.latency import Series


def _series(op: str, path: str, c: int, ms: float, n: int = 4) -> Series:
    # n samples of ms each over n * ms / c: throughput c / ms per ms
    return Series(op, path, c, [ms] * n, n * ms / 1e3 / c, request_bytes=100)


@pytest.fixture
def report() -> users.UserReport:
    series = [
        _series("encode", users.OFFICIAL, 1, 400.0),
        _series("encode", users.ORT, 1, 300.0),
        _series("encode", "session-grpc", 1, 320.0),
        _series("encode", "session-grpc-fused", 1, 200.0),
        _series("click", users.ORT, 1, 10.0),
        _series("click", users.ORT, 4, 20.0),
        _series("click", "session-grpc", 1, 12.0),
        _series("click", "session-grpc", 4, 25.0),
        _series(users.DURING_ENCODE, "session-grpc", 1, 16.0),
    ]
    settings = {"concurrency": [1, 4], "encoder_variants": ["fp32", "fused"]}
    return users.UserReport(series={"m": series}, settings=settings)


def test_rows_carry_same_run_ratios(report):
    rows = {(r["op"], r["path"], r["concurrency"]): r for r in report.table()}
    assert rows[("click", "session-grpc", 1)]["x_ort"] == pytest.approx(1.2)
    assert rows[("encode", "session-grpc", 1)]["x_official"] == pytest.approx(0.8)
    # a click during an encode is compared with the plain click's baseline
    assert rows[(users.DURING_ENCODE, "session-grpc", 1)]["x_ort"] == pytest.approx(1.6)
    assert {"p50", "p95", "p99", "throughput"} <= set(rows[("click", users.ORT, 4)])


def test_goals_are_ratios_of_one_session_path(report):
    (goal,) = report.goals()  # the fused variant's path is folded into its base path
    assert goal["path"] == "session-grpc"
    assert goal["click_x_ort"] == pytest.approx(1.2)
    assert goal["clicks_per_s_x_ort"] == pytest.approx(20.0 / 25.0)
    assert goal["encode_x_official"] == pytest.approx({"fp32": 0.8, "fused": 0.5})
    assert goal["during_encode_x_encode"] == pytest.approx(16.0 / 320.0)


def test_write_report_writes_json_markdown_and_plot(report, tmp_path):
    files = users.write_report(report, tmp_path)
    assert set(files) == {"json", "md", "png"} and files["png"].stat().st_size > 0
    payload = json.loads(files["json"].read_text())
    assert payload["goals"][0]["click_x_ort"] == pytest.approx(1.2)
    assert len(payload["rows"]) == len(payload["series"]["m"]) == 9
    text = files["md"].read_text()
    assert "session click p50 / ORT click, c=1 (goal <= 1.3)" in text and "1.20x met" in text
