"""`triton-sam bench users`: every path a user can take, timed in one run (tiny n; no timing
thresholds: the numbers only have to exist, the structure and the bytes on the wire must be
right).

SAM2.1-tiny is timed through all paths against the session-scoped server (onnxruntime
backend) and a python-runner twin of the same export, with a click sent during another
image's encode. :func:`users.run_user_benchmark` runs in a child process with the fused-
attention encoder variant (its own server, its agreement with fp32) and reports peak memory.
The official-predictor adapters of SAM1 ViT-B and the small SAM3 tracker config (no server
needed) answer every operation with masks of the image's size.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from triton_sam.bench import paths, users
from triton_sam.export import onnx_utils
from triton_sam.tools.sample import sample_image

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(900)]

IMAGE = sample_image(160, 120)


def test_bench_times_every_path_and_operation_of_one_run(
    sam2_tiny_spec,
    sam2_tiny_checkpoint,
    sam2_tiny_export,
    sam2_tiny_repository,
    sam2_tiny_server,
    embedded_triton,
    tmp_path,
):
    from triton_sam.repository.config import parse_config
    from triton_sam.repository.writer import embedded_repository

    runner_repo = embedded_repository(sam2_tiny_export, tmp_path / "runner", target="python")
    assert parse_config(runner_repo / "sam2_session" / "config.pbtxt").backend == "python"
    assert parse_config(runner_repo / "sam2_decoder" / "config.pbtxt").backend == "python"
    runner = embedded_triton(runner_repo)
    model = users.ServedModel(
        sam2_tiny_spec, sam2_tiny_checkpoint, sam2_tiny_repository, runner_repo
    )
    urls = {
        "onnxruntime": {"grpc": sam2_tiny_server.grpc_url, "http": sam2_tiny_server.http_url},
        "python": {"grpc": runner.grpc_url},
    }
    series = users.bench_model(model, urls, IMAGE, concurrency=(1, 2), n_encode=1, n_decode=2)
    runner.stop()

    served = ["session-grpc", "stateless-grpc", "session-http", "stateless-http"]
    every = ["onnxruntime", *served, "session-grpc-runner"]
    expected = {(op, p, 1) for op in paths.OPERATIONS for p in ["official", *every]}
    expected |= {(op, p, 2) for op in paths.OPERATIONS[1:] for p in every}
    expected |= {(users.DURING_ENCODE, p, 1) for p in ("session-grpc", "session-http")}
    assert {(s.graph, s.path, s.concurrency) for s in series} == expected
    for s in series:
        if s.graph in (users.DURING_ENCODE, "encode"):  # at least one per caller
            n = max(3 if s.graph == users.DURING_ENCODE else 1, s.concurrency)
        else:  # n_decode prompt calls per caller
            n = 2 * s.concurrency
        assert len(s.samples_ms) == n, s.key
        assert all(ms > 0 for ms in s.samples_ms) and s.wall_s > 0

    sent = {(s.graph, s.path, s.concurrency): s.request_bytes for s in series}
    for c in (1, 2):
        for op in ("click", "box", "refine"):
            # The session path sends prompts and an image id; a refinement names the kept
            # logits instead of sending 256 KiB of mask. The stateless path sends the features.
            assert 0 < sent[(op, "session-grpc", c)] < 1024, (op, c)
            assert 0 < sent[(op, "session-grpc-runner", c)] < 1024, (op, c)
            assert sent[(op, "stateless-grpc", c)] > 16 * 2**20, (op, c)
    # The session path's embed sends the image's uint8 pixels (the server preprocesses
    # them), not the 12 MiB float32 encoder input; the stateless path sends that tensor.
    assert IMAGE.nbytes <= sent[("encode", "session-grpc", 1)] < IMAGE.nbytes + 1024
    assert sent[("encode", "stateless-grpc", 1)] >= 3 * 1024 * 1024 * 4
    assert sent[("click", "onnxruntime", 1)] == sent[("click", "official", 1)] == 0

    # A click during an encode is a session click: prompts and an image id on the wire.
    assert 0 < sent[(users.DURING_ENCODE, "session-grpc", 1)] < 1024

    settings = {"n_decode": 2, "concurrency": [1, 2]}
    report = users.UserReport(series={sam2_tiny_spec.name: series}, settings=settings)
    rows = report.table()
    assert len(rows) == len(expected)
    for r in rows:
        assert r["x_ort"] > 0 and r["x_official"] > 0
        if r["path"] == "onnxruntime":
            assert r["x_ort"] == pytest.approx(1.0)
        if r["path"] == "official":
            assert r["x_official"] == pytest.approx(1.0)
    out = users.write_report(report, tmp_path / "out")
    text = out["md"].read_text()
    assert "| sam2.1_hiera_tiny | refine | session-grpc-runner | 2 |" in text
    assert "| sam2.1_hiera_tiny | encode | official | 1 |" in text
    assert "| sam2.1_hiera_tiny | click-during-encode | session-http | 1 |" in text
    # The goal ratios: one row per session path (runner included), each goal present where
    # its cells were measured (no click during encode on the runner: not timed there).
    goals = {g["path"]: g for g in report.goals()}
    assert set(goals) == {"session-grpc", "session-http", "session-grpc-runner"}
    keys = {"click_x_ort", "clicks_per_s_x_ort", "encode_x_official", "during_encode_x_encode"}
    for path, goal in goals.items():
        want = keys - ({"during_encode_x_encode"} if path.endswith("runner") else set())
        assert set(goal) - {"model", "path"} == want, path
        assert set(goal["encode_x_official"]) == {"fp32"}
        for key in want:
            value = goal[key]["fp32"] if key == "encode_x_official" else goal[key]
            assert 0 < value < 1000, (path, key, value)
    assert "session click p50 / ORT click, c=1 (goal <= 1.3)" in text
    assert "click during another encode / encode (goal < 0.5)" in text
    assert "| sam2.1_hiera_tiny | session-http | " in text.split("## ")[0]
    assert len(json.loads(out["json"].read_text())["rows"]) == len(expected)
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("family", ["sam1", "sam3"])
def test_official_paths_answer_every_operation(family, request, sam1_vit_b_spec, sam3_spec):
    """The SAM1 and SAM3 official adapters (SAM2's runs above): masks at the image size for
    every operation; a refinement passes the previous low-res mask in the predictor's own
    ``mask_input`` layout (the predictor would refuse another)."""
    spec = sam1_vit_b_spec if family == "sam1" else sam3_spec
    fixture = "sam1_vit_b_checkpoint" if family == "sam1" else "sam3_small_checkpoint"
    path = paths.OfficialPath(spec, request.getfixturevalue(fixture))
    path.encode(IMAGE)
    shapes = {op: np.asarray(getattr(path, op)()).shape[-2:] for op in paths.OPERATIONS[1:]}
    assert shapes == {op: IMAGE.shape[:2] for op in paths.OPERATIONS[1:]}
    first = np.asarray(path.click(), dtype=np.float32)
    refined = np.asarray(path.refine(), dtype=np.float32)
    assert refined.shape == first.shape
    assert path._mask is not None and np.isfinite(path._mask).all()
    assert path.request_bytes() == 0


def test_run_user_benchmark_isolates_the_model_and_times_the_fused_encoder(
    sam2_tiny_spec, sam2_tiny_checkpoint, sam2_tiny_export, sam2_tiny_repository, tmp_path
):
    """The run as `triton-sam bench users` makes it: the model measured in a spawned child (one
    server at a time), the fused-attention encoder as a variant with its own served rows and
    its measured agreement with fp32 within the export check's fp32 tolerance, peak memory
    in the settings, and the goal ratios including the variant's encode.

    One caller and no click during an encode: the settings reach the child all the same
    (their absence is asserted), and the series they would add are timed by
    test_bench_times_every_path_and_operation_of_one_run, through the same ``bench_model``
    (here they were the same paths timed a second time, ~20 s of CI)."""
    fused = users.prepare_encoder_variant(
        sam2_tiny_spec, sam2_tiny_export, tmp_path / "fused", "fused"
    )
    model = users.ServedModel(
        sam2_tiny_spec,
        sam2_tiny_checkpoint,
        sam2_tiny_repository,
        encoder_variants={"fused": fused},
    )
    settings = users.BenchSettings(
        protocols=("grpc",), concurrency=(1,), n_encode=1, n_decode=2, during_encode=False
    )
    report = users.run_user_benchmark([model], IMAGE, settings, encoder_variants=("fp32", "fused"))
    name = sam2_tiny_spec.name
    assert "failed" not in report.settings
    cells = {(s.graph, s.path, s.concurrency) for s in report.series[name]}
    for path in ("onnxruntime-fused", "session-grpc-fused"):
        assert ("encode", path, 1) in cells
        assert ("click", path, 1) not in cells  # the decoder is the same graph
    assert ("click", "session-grpc", 1) in cells and ("encode", "official", 1) in cells
    assert {c for _, _, c in cells} == {1}  # the settings reached the child
    assert not {g for g, _, _ in cells} & {users.DURING_ENCODE}

    agreement = report.agreement[name]["fused"]
    assert agreement["within"] is True
    assert agreement["tolerance"] == onnx_utils.FP32_TOLERANCE.describe()
    assert set(agreement["max_abs"]) == set(sam2_tiny_spec.family.embedding_names)
    assert all(0 <= v < 1e-4 for v in agreement["max_abs"].values())

    memory = report.settings["peak_rss_mib"]
    child = memory[name]
    # The child held torch, the official predictor and ORT sessions: hundreds of MiB; its
    # servers (tritonserver and a stub, the encoder loaded) at least tens of MiB.
    assert 100 < child["bench_process"] < 16 * 1024
    assert 10 < child["servers_peak"] < child["tree_peak"] < 32 * 1024
    assert memory["run"]["tree_peak"] == child["tree_peak"]
    assert memory["run"]["parent_process"] > 0

    (goal,) = [g for g in report.goals() if g["path"] == "session-grpc"]
    assert set(goal["encode_x_official"]) == {"fp32", "fused"}
    assert all(0 < v < 1000 for v in goal["encode_x_official"].values())
    out = users.write_report(report, tmp_path / "out")
    text = out["md"].read_text()
    assert f"{name} encoder `fused` vs fp32" in text and "within the export check" in text
    assert "| sam2.1_hiera_tiny | encode | session-grpc-fused | 1 |" in text
    payload = json.loads(out["json"].read_text())
    assert payload["agreement"][name]["fused"]["within"] is True
    assert payload["settings"]["peak_rss_mib"][name]["bench_process"] > 0
