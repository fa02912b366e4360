"""The concept benchmark runs both paths in one run and reports every figure (no timing asserts),
exemplar queries included, with the server's own count of exemplar graph runs."""

from __future__ import annotations

import pytest

from triton_sam.bench.concepts import run_concept_bench

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(900)]


def test_bench_reports_images_phrases_instances_and_bytes(concept_server, concept_checkpoint):
    report = run_concept_bench(
        checkpoint=concept_checkpoint,
        urls={"grpc": concept_server.grpc_url},
        phrases=("cat", "red car"),
        images=2,
        repeats=2,
        stats_url=concept_server.http_url,
    )
    print("\n" + report.markdown())
    stages = {(r["path"], r["stage"]) for r in report.rows}
    for path in ("triton-grpc", "transformers"):
        for stage in (
            "set_image",
            "predict 1 phrase",
            "predict 2 phrases",
            "instances (2 phrases)",
            "exemplars: phrase + 2 boxes",
        ):
            assert (path, stage) in stages
    served = {r["stage"]: r for r in report.rows if r["path"] == "triton-grpc"}
    # an image is sent once as uint8 pixels (640x480x3 plus framing); a predict sends the id
    assert 640 * 480 * 3 <= served["set_image"]["sent_bytes"] < 640 * 480 * 3 + 1024
    assert 0 < served["predict 2 phrases"]["sent_bytes"] < 1024
    assert all(r["per_s"] > 0 for r in report.rows if r["stage"] != "instances (2 phrases)")
    # what the server says it ran: the exemplar graph once per query that drew boxes, never
    # for an id applied to a new image (only the id travels, a few bytes)
    assert served["exemplars: phrase + 2 boxes"]["server_exemplar_runs"] == 2
    assert served["exemplar id on a new image"]["server_exemplar_runs"] == 0
    assert served["exemplar id on a new image"]["calls"] == 2
    assert 0 < served["exemplar id on a new image"]["sent_bytes"] < 1024
