"""The stress run's pure parts: server counters, drag paths, settings, reports (no server)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tomllib

from triton_sam.bench import counters
from triton_sam.bench.counters import ServerCounters, parse_metrics, wait_until_quiet
from triton_sam.bench.stress import (
    DragSettings,
    ModeResult,
    StressReport,
    counter_urls,
    drag_path,
    write_report,
)
from triton_sam.errors import InputValidationError
from triton_sam.repository import writer

METRICS = """\
# HELP nv_inference_request_failure Number of failed inference requests
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="sam2_decoder",reason="CANCELED",version="1"} 4
nv_inference_request_failure{model="sam2_decoder",reason="BACKEND",version="1"} 1
nv_inference_request_failure{model="sam2_encoder",reason="CANCELED",version="1"} 9
nv_inference_count{model="sam2_decoder",version="1"} 28
nv_inference_pending_request_count{model="sam2_decoder",version="1"} 2
triton_sam_cancelled_requests_skipped{instance="d_0_0",model="sam2_decoder",version="1"} 3
triton_sam_cancelled_requests_skipped{instance="d_0_1",model="sam2_decoder",version="1"} 2
"""


def test_metrics_are_summed_per_model_with_reasons_apart():
    m = parse_metrics(METRICS, "sam2_decoder")
    assert m["nv_inference_request_failure{reason=CANCELED}"] == 4
    assert m["nv_inference_request_failure{reason=BACKEND}"] == 1
    assert m["nv_inference_count"] == 28
    assert m["triton_sam_cancelled_requests_skipped"] == 5  # both instances
    assert parse_metrics(METRICS, "sam2_encoder") == {
        "nv_inference_request_failure{reason=CANCELED}": 9
    }


def test_read_counters_combines_statistics_and_metrics(monkeypatch):
    stats = {
        "model_stats": [
            {
                "inference_count": 30,
                "execution_count": 12,
                "inference_stats": {"success": {"count": 30}, "fail": {"count": 1}},
            }
        ]
    }
    pages = {
        "http://h:8000/v2/models/sam2_decoder/stats": json.dumps(stats),
        "http://h:8002/metrics": METRICS,
    }
    monkeypatch.setattr(counters, "_get_text", pages.__getitem__)
    c = counters.read_counters("http://h:8000", "http://h:8002", "sam2_decoder")
    assert (c.inference_count, c.execution_count, c.success, c.fail) == (30, 12, 30, 1)
    assert (c.canceled, c.skipped, c.pending) == (4, 5, 2)
    assert c.executed == 25 and c.cancelled == 9  # skipped ones are counted as inferences


SESSION_METRICS = """\
nv_inference_count{model="sam2_decoder_unbatched",version="1"} 7
nv_inference_request_failure{model="sam2_session",reason="CANCELED",version="1"} 2
nv_inference_pending_request_count{model="sam2_session",version="1"} 1
triton_sam_session_cancelled_clicks{model="sam2_session",version="1"} 11
triton_sam_session_hits{model="sam2_session",version="1"} 40
"""


def _stats(inferences: int, executions: int) -> str:
    return json.dumps(
        {"model_stats": [{"inference_count": inferences, "execution_count": executions}]}
    )


def _config(**parameters: str) -> str:
    return json.dumps({"parameters": {k: {"string_value": v} for k, v in parameters.items()}})


def test_click_counters_follow_the_decoder_the_session_model_names(monkeypatch):
    # The CPU twin: the session model's clicks run on an unbatched copy of the decoder the
    # client names; both are counted (a stateless click would run on the latter), and the
    # session model's own cancellations join the decoders' (its inferences do not: each
    # click it ran is counted at the decoder).
    pages = {
        "http://h:8000/v2/models/sam2_session/config": _config(
            decoder_model="sam2_decoder_unbatched"
        ),
        "http://h:8000/v2/models/sam2_decoder/stats": _stats(3, 2),
        "http://h:8000/v2/models/sam2_decoder_unbatched/stats": _stats(7, 7),
        "http://h:8000/v2/models/sam2_session/stats": _stats(60, 60),
        "http://h:8002/metrics": METRICS + SESSION_METRICS,
    }
    monkeypatch.setattr(counters, "_get_text", pages.__getitem__)
    read = counters.ClickCounters.of(
        "http://h:8000", "http://h:8002", "sam2_decoder", "sam2_session"
    )
    assert read.decoders == ("sam2_decoder", "sam2_decoder_unbatched")
    c = read()
    assert (c.inference_count, c.execution_count) == (10, 9)
    assert (c.canceled, c.skipped, c.session_cancelled, c.pending) == (4 + 2, 5, 11, 2 + 1)
    assert c.executed == 10 - 5 and c.cancelled == 6 + 5 + 11


def test_click_counters_count_one_decoder_where_the_session_model_calls_the_clients(
    monkeypatch,
):
    pages = {
        "http://h:8000/v2/models/sam2_session/config": _config(decoder_model="sam2_decoder"),
        "http://h:8000/v2/models/sam2_decoder/stats": _stats(3, 2),
        "http://h:8000/v2/models/sam2_session/stats": _stats(60, 60),
    }
    monkeypatch.setattr(counters, "_get_text", pages.__getitem__)
    read = counters.ClickCounters.of("http://h:8000", None, "sam2_decoder", "sam2_session")
    assert read.decoders == ("sam2_decoder",)
    assert read() == ServerCounters(inference_count=3, execution_count=2)
    # a config without the parameter: the session model calls the family's decoder
    pages["http://h:8000/v2/models/sam2_session/config"] = _config(kind="embedding_cache")
    assert counters.session_decoder("http://h:8000", "sam2_session") is None
    read = counters.ClickCounters.of("http://h:8000", None, "sam2_decoder", "sam2_session")
    assert read.decoders == ("sam2_decoder",)
    # stateless: no session model, no config read
    read = counters.ClickCounters.of("http://h:8000", None, "sam2_decoder")
    assert (read.decoders, read.session_model) == (("sam2_decoder",), None)


def test_every_decoder_sums_the_models_named_decoder(monkeypatch):
    stats = [
        {"name": "sam2_decoder", "inference_count": 3, "execution_count": 2},
        {"name": "sam2_decoder_unbatched", "inference_count": 7, "execution_count": 7},
        {"name": "sam2_session", "inference_count": 60, "execution_count": 60},
        {"name": "sam2_encoder", "inference_count": 1, "execution_count": 1},
    ]
    pages = {"http://h:8000/v2/models/stats": json.dumps({"model_stats": stats})}
    monkeypatch.setattr(counters, "_get_text", pages.__getitem__)
    assert counters.every_decoder("http://h:8000") == (10, 9)


def test_the_session_model_counts_the_metric_the_reader_reads():
    from types import SimpleNamespace

    from triton_sam.serving.embedding_cache import answers, metrics
    from triton_sam.serving.embedding_cache.predictor import CancelledWhileWaiting
    from triton_sam.serving.protocol import embedding_cache

    name = counters.SESSION_CANCELLED_METRIC.removeprefix(embedding_cache.METRIC_PREFIX)
    assert (name, "COUNTER") in {(n, kind) for n, kind, _ in metrics.SPECS}
    counted = []
    pb_utils = SimpleNamespace(TritonError=lambda *a: a, InferenceResponse=lambda **k: k)
    model_metrics = SimpleNamespace(count=counted.append)
    answers.error_answer(pb_utils, CancelledWhileWaiting(), model_metrics, embed=False)
    assert counted == [name]


def test_counter_deltas_keep_the_pending_gauge():
    before = ServerCounters(inference_count=10, skipped=1, canceled=2, pending=5)
    after = ServerCounters(inference_count=18, skipped=4, canceled=2, pending=0)
    delta = after - before
    assert delta.as_dict()["executed"] == 5 and delta.cancelled == 3 and delta.pending == 0


def test_wait_until_quiet_waits_for_pending_work_to_settle():
    readings = iter(
        [ServerCounters(pending=2), ServerCounters(inference_count=1, pending=1)]
        + [ServerCounters(inference_count=3)] * 100
    )
    final = wait_until_quiet(lambda: next(readings), quiet_s=0.05, timeout_s=5)
    assert final == ServerCounters(inference_count=3)


def test_the_runner_writes_the_metric_the_reader_reads():
    # one definition (protocol/runner.py): the runner counts under it, the reader reads it
    from triton_sam.serving.protocol import runner as runner_protocol

    assert "protocol.SKIPPED_METRIC" in writer.RUNNER_SOURCE.read_text()
    assert counters.SKIPPED_METRIC == runner_protocol.SKIPPED_METRIC


def test_drag_paths_stay_inside_the_image_and_differ_between_sessions():
    hw = (427, 640)
    paths = [drag_path(50, hw, index=i) for i in range(4)]
    for path in paths:
        assert path.shape == (50, 2)
        assert (path[:, 0] > 0.1 * hw[1]).all() and (path[:, 0] < 0.9 * hw[1]).all()
        assert (path[:, 1] > 0.1 * hw[0]).all() and (path[:, 1] < 0.9 * hw[0]).all()
        assert np.abs(np.diff(path, axis=0)).max() < 0.2 * hw[1]  # a drag, not jumps
    assert all(not np.allclose(paths[0], p) for p in paths[1:])


@pytest.mark.parametrize(
    "kwargs, field",
    [({"events": 0}, "events"), ({"rate_hz": 0}, "rate_hz"), ({"sessions": 1.5}, "sessions")],
)
def test_drag_settings_are_validated(kwargs, field):
    with pytest.raises(InputValidationError) as info:
        DragSettings(**kwargs)
    assert info.value.field == field


def test_drag_duration_and_execution_bound():
    report = StressReport("sam2", "grpc", DragSettings(events=50, rate_hz=100))
    report.decoder_ms = [150.0, 140.0, 160.0]
    assert report.settings.duration_s == pytest.approx(0.49)
    assert report.execution_bound() == math.ceil(0.49 / 0.15) + 2


@pytest.mark.parametrize(
    "url, expected",
    [
        ("grpc://127.0.0.1:8001", ("http://127.0.0.1:8000", "http://127.0.0.1:8002")),
        ("localhost:9001", ("http://localhost:8000", "http://localhost:8002")),
        ("grpcs://host", ("https://host:8000", "https://host:8002")),
        ("[::1]:8001", ("http://[::1]:8000", "http://[::1]:8002")),
    ],
)
def test_counter_urls_default_to_triton_ports(url, expected):
    assert counter_urls(url) == expected
    assert counter_urls(url, "http://a:1", "http://b:2") == ("http://a:1", "http://b:2")


def test_report_files(tmp_path: Path):
    report = StressReport("sam2.1_hiera_tiny", "grpc", DragSettings(sessions=2))
    report.decoder_ms = [100.0]
    report.modes["reference"] = ModeResult(
        "reference",
        events=100,
        requests_sent=100,
        cancelled_client=90,
        server={"executed": 100, "cancelled": 0, "canceled": 0, "skipped": 0},
        last_event_to_mask_ms=[3000.0, 3100.0],
    )
    report.modes["latest"] = ModeResult(
        "latest",
        events=100,
        requests_sent=10,
        superseded=90,
        server={"executed": 10, "cancelled": 0, "execution_count": 8},
        last_event_to_mask_ms=[150.0, 190.0],
    )
    paths = write_report(report, tmp_path)
    data = json.loads(paths["json"].read_text())
    rows = {r["mode"]: r for r in data["rows"]}
    assert rows["latest"]["executed_per_drag"] == 5.0
    assert rows["latest"]["p95_over_D"] == pytest.approx(1.88)
    assert data["decoder_ms"]["p50"] == 100.0 and data["execution_bound_per_drag"] == 7
    md = paths["md"].read_text()
    assert "| latest | 100 | 10 | 90 |" in md and "| reference |" in md


def test_stress_command_and_its_pixi_task():
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from triton_sam.cli import main; main()",
            "bench",
            "stress",
            "--help",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
    )
    assert out.returncode == 0 and "--sessions" in out.stdout and "--modes" in out.stdout
    tasks = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pixi"]["tasks"]
    assert tasks["test-speculative"] == "triton-sam bench stress"  # the reference's task name


def test_unknown_modes_fail_fast_with_one_line():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from triton_sam.cli import main; main()",
            "bench",
            "stress",
            "--modes",
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1 and "modes:" in out.stderr and "Traceback" not in out.stderr


def test_a_reference_drag_counts_refused_requests_and_keeps_going():
    """The reference behaviour sends every event; requests beyond the server's click queue
    are refused at once as overloaded, which the run counts instead of crashing on."""
    import asyncio

    from triton_sam.bench.stress import ModeResult, _drag
    from triton_sam.errors import ServerOverloadedError

    class Client:
        sent = 0

        async def predict_async(self, points, labels, *, session_id):
            Client.sent += 1
            refused = Client.sent in (2, 3)

            async def answer():
                await asyncio.sleep(0)
                if refused:
                    raise ServerOverloadedError("exceeds maximum queue size")
                return "mask"

            return f"r{Client.sent}", asyncio.ensure_future(answer())

    result = ModeResult("reference")
    path = np.array([[1.0, 1.0]] * 4)
    asyncio.run(_drag(Client(), "reference", "s", path, 1000.0, result))
    assert result.refused == 2 and result.events == 4
    assert len(result.last_event_to_mask_ms) == 1  # the last request was answered
