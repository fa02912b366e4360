"""`triton-sam bench click`: where a session click's time goes (tiny n, no timing thresholds).

Checked on the SAM2.1-tiny session-scoped server (onnxruntime backend, features copied into
the stub's memory: ``cpu_features=process``, the default) and on a second server of the same
export whose session model keeps them in shared memory (``cpu_features=shared_memory``):

- every click moves the session model's stage counters by exactly one per stage it went
  through, and the stages add up to the model's total (they are consecutive intervals);
- the breakdown holds a sample per click of every client stage, every Triton statistic of
  the session model and the decoder, every in-model stage and the onnxruntime baseline;
- the masks are bit-identical whichever store holds the features (the same bytes reach the
  same decoder graph).
"""

from __future__ import annotations

import pytest

from triton_sam.bench import breakdown
from triton_sam.bench.paths import ort_sessions
from triton_sam.client import SAM2TritonClient
from triton_sam.serving.protocol import embedding_cache
from triton_sam.tools.sample import sample_image

pytestmark = [
    pytest.mark.slow,
    pytest.mark.triton,
    pytest.mark.timeout(600),
    pytest.mark.uses_servers("sam2_tiny_server"),
]

IMAGE = sample_image(160, 120)
CLICK_STAGES = {"schedule", "intake", "feeds", "bls", "outputs", "respond", "total"}


def urls_of(server) -> dict[str, str]:
    return {"grpc": server.grpc_url, "http": server.http_url,
            "stats": server.http_url, "metrics": server.metrics_url}  # fmt: skip


def test_a_click_moves_each_stage_counter_once(sam2_tiny_spec, sam2_tiny_server):
    family = sam2_tiny_spec.family
    reader = breakdown._Server(sam2_tiny_server.http_url, sam2_tiny_server.metrics_url)
    with SAM2TritonClient(sam2_tiny_server.grpc_url, model_type="sam2", protocol="grpc") as c:
        c.set_image(IMAGE)
        before = reader.stages(family.session_model)
        c.predict([[40.0, 60.0]], [1])
        after = reader.stages_after(family.session_model, before)
        c.set_image(sample_image(96, 64))  # an embed runs no decoder: no click stages
        embedded = reader.stages(family.session_model)
    assert set(after) == set(embedding_cache.STAGES)  # every counter exists from the start
    moved = {s for s in after if after[s][0] > before.get(s, (0.0, 0.0))[0]}
    assert moved == CLICK_STAGES  # tensor prompts: no server-side mask finishing
    for stage in moved:
        assert after[stage][0] - before[stage][0] == 1
        assert after[stage][1] > before[stage][1]
    spent = {s: after[s][1] - before[s][1] for s in moved}
    parts = sum(us for s, us in spent.items() if s != "total")
    assert parts == pytest.approx(spent["total"], rel=1e-6, abs=1.0)
    assert embedded == after


def test_breakdown_has_every_stage_of_every_click(
    sam2_tiny_spec, sam2_tiny_repository, sam2_tiny_server
):
    family = sam2_tiny_spec.family
    sessions = ort_sessions(sam2_tiny_repository, family)
    report = breakdown.run_breakdown(
        family, urls_of(sam2_tiny_server), sessions, IMAGE, n=2, warmup=1
    )
    expected = {"click", "ort.decode", "ort.postprocess", "ort.click"}
    expected |= {f"client.{s}" for s in breakdown.CLIENT_STAGES}
    expected |= {f"{m}.{s}" for m in ("session", "decoder") for s in breakdown.STAT_STAGES}
    expected |= {f"model.{s}" for s in CLICK_STAGES}
    expected |= {"derived.wire+front_end", "derived.bls_overhead"}
    assert set(report.stages) == expected
    assert all(len(v) == 2 for v in report.stages.values())
    assert report.p50("decoder.compute_infer") > 0 and report.p50("click") > 0
    rows = {r["stage"]: r for r in report.table()}
    assert rows["click"]["share"] == 1.0
    text = breakdown.markdown(report)
    assert "| model.bls |" in text and "in-process ORT" in text


def test_both_feature_stores_give_the_same_masks(
    sam2_tiny_spec, sam2_tiny_repository, sam2_tiny_server, embedded_triton, tmp_path
):
    family = sam2_tiny_spec.family
    repo = breakdown.variant_repository(
        sam2_tiny_repository, tmp_path / "shm", family, cpu_features="shared_memory"
    )
    sharing = embedded_triton(repo)
    results = []
    for server in (sam2_tiny_server, sharing):
        with SAM2TritonClient(server.grpc_url, model_type="sam2", protocol="grpc") as c:
            c.set_image(IMAGE)
            first = c.predict_full([[40.0, 60.0]], [1])
            refined = c.predict_full([[40.0, 60.0]], [1], mask_input=first.low_res_logits[0, 0])
            results.append((first, refined))
    sharing.stop()
    for ours, ref in zip(results[0], results[1], strict=True):
        assert (ours.low_res_logits == ref.low_res_logits).all()
        assert (ours.iou_predictions == ref.iou_predictions).all()
        assert (ours.masks == ref.masks).all()
