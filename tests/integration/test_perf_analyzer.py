"""Triton's perf_analyzer (installed by `make perf-analyzer`) runs against the served SAM2 pair."""

from __future__ import annotations

import pytest

from triton_sam.bench.perf_analyzer import parse_report, perf_analyzer_args, run_perf_analyzer
from triton_sam.errors import InputValidationError
from triton_sam.models import get_family

pytestmark = [pytest.mark.timeout(600)]

CSV = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
    "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
    "p50 latency,p90 latency,p95 latency,p99 latency\n"
    "2,3.91009,6930,107594,105694,4899,229671,4993,5,447224,524978,524978,813200\n"
)


def test_arguments_take_variable_shapes_from_the_spec():
    args = perf_analyzer_args(get_family("sam2"), "decoder", "h:8001", concurrency=4, num_points=5)
    assert args[:6] == ["-m", "sam2_decoder", "-u", "h:8001", "-i", "grpc"]
    assert "point_coords:5,2" in args and "point_labels:5" in args
    assert args[args.index("--concurrency-range") + 1] == "4:4"
    encoder = perf_analyzer_args(get_family("sam2"), "encoder", "h:8001")
    assert "--shape" not in encoder and "sam2_encoder" in encoder
    with pytest.raises(InputValidationError, match="graph"):
        perf_analyzer_args(get_family("sam2"), "both", "h:8001")


def test_report_rows_are_parsed_in_milliseconds():
    (row,) = parse_report(CSV)
    assert row["concurrency"] == 2 and row["throughput"] == pytest.approx(3.91009)
    assert row["p50"] == pytest.approx(447.224) and row["p99"] == pytest.approx(813.2)
    assert row["server_compute"] == pytest.approx(229.671)


@pytest.mark.slow
@pytest.mark.triton
def test_perf_analyzer_loads_the_served_decoder(sam2_tiny_server):
    server = sam2_tiny_server
    rows, commands = run_perf_analyzer(
        get_family("sam2"),
        "decoder",
        server.grpc_address,
        protocol="grpc",
        concurrency=(1, 2),
        requests_per_level=3,
    )
    assert [r["concurrency"] for r in rows] == [1, 2]
    assert all(r["throughput"] > 0 and r["p95"] >= r["p50"] > 0 for r in rows)
    assert "--shape point_coords:3,2" in commands[0]
