"""`triton-sam bench`: every path a user can take, timed in one run (tiny n; no timing
thresholds: the numbers only have to exist, the structure and the bytes on the wire must be
right).

SAM2.1-tiny is timed through all paths against the session-scoped server (onnxruntime
backend) and a python-runner twin of the same export. The official-predictor adapters of
SAM1 ViT-B and the small SAM3 tracker config (no server needed) answer every operation with
masks of the image's size.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from triton_sam.bench import paths, users
from triton_sam.sample import sample_image

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
    assert {(s.graph, s.path, s.concurrency) for s in series} == expected
    for s in series:
        assert len(s.samples_ms) == max(1 if s.graph == "encode" else 2, s.concurrency), s.key
        assert all(ms > 0 for ms in s.samples_ms) and s.wall_s > 0

    sent = {(s.graph, s.path, s.concurrency): s.request_bytes for s in series}
    for c in (1, 2):
        for op in ("click", "box", "refine"):
            # The session path sends prompts and an image id; a refinement names the kept
            # logits instead of sending 256 KiB of mask. The stateless path sends the features.
            assert 0 < sent[(op, "session-grpc", c)] < 1024, (op, c)
            assert 0 < sent[(op, "session-grpc-runner", c)] < 1024, (op, c)
            assert sent[(op, "stateless-grpc", c)] > 16 * 2**20, (op, c)
    # The session path's embed sends the image's uint8 pixels (the server preprocesses them,
    # issue 12), not the 12 MiB float32 encoder input; the stateless path sends that tensor.
    assert IMAGE.nbytes <= sent[("encode", "session-grpc", 1)] < IMAGE.nbytes + 1024
    assert sent[("encode", "stateless-grpc", 1)] >= 3 * 1024 * 1024 * 4
    assert sent[("click", "onnxruntime", 1)] == sent[("click", "official", 1)] == 0

    report = users.UserReport(series={sam2_tiny_spec.name: series}, settings={"n_decode": 2})
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
