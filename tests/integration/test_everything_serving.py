"""Segment everything served (``sam2_everything``) against the official generator, live.

The shared SAM2.1-tiny server (tests/conftest.py: random-init weights from the official
config, written by ``build_repository`` as ``setup`` writes them) serves the everything model,
the session model it embeds through and the everything-decoder graph. Checked here:

- the instances equal ``sam2.automatic_mask_generator.SAM2AutomaticMaskGenerator`` (and, on
  the shared SAM1 ViT-B server, ``segment_anything.SamAutomaticMaskGenerator``) on the same
  weights and image, matched one to one (same prompt point, then best mask IoU): mask IoU >=
  ``MIN_IOU``, ``predicted_iou`` within ``SCORE_ATOL`` (the served decoder's outputs are within
  1e-4 of upstream's, tests/parity/test_sam2_parity.py), ``stability_score`` within
  ``STABILITY_ATOL``; with and without crops;
- refused parameters answer typed errors naming the field, and the server stays ready;
- a cancel reaches the server: fewer everything-decoder executions (Triton's own statistics)
  than the job has batches, from the sync client (progress raising) and the async one (task
  cancelled); a third job while two hold the slot and the waiting line is ``Overloaded``;
- another tenant cannot use an image id: a miss, as for any image it never embedded;
- a job's crops never evict the tenant's own images (a session model that keeps 2 images).

Random-init weights give noise masks, so the thresholds are off (0 keeps every mask, as
upstream's ``> 0`` checks) and ``box_nms_thresh`` is 1.0 (never suppresses): every one of the
3 masks per point is compared, not only the NMS survivors of near-identical noise.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from triton_sam.client import SAM2TritonClient, SpeculativeSAM2Client
from triton_sam.client import everything as everything_client
from triton_sam.client.transport import resolve_endpoint
from triton_sam.errors import (
    EmbeddingNotFoundError,
    InvalidRequestError,
    ServerOverloadedError,
)
from triton_sam.repository.config import config_to_text, parse_config
from triton_sam.serving import masks
from triton_sam.serving.protocol import embedding_cache as session
from triton_sam.serving.protocol.tenancy import TENANT_HEADER
from triton_sam.tools.sample import sample_image

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(900)]

IMAGE = sample_image(200, 150, seed=21)  # W x H, non-square
MODEL = "sam2_everything"
DECODER = "sam2_everything_decoder"
KEEP_ALL = {"pred_iou_thresh": 0.0, "stability_score_thresh": 0.0, "box_nms_thresh": 1.0}
CASES = {
    "whole_image": {"points_per_side": 4, **KEEP_ALL},
    "one_crop_layer": {
        "points_per_side": 2,
        "crop_n_layers": 1,
        "crop_nms_thresh": 1.0,
        **KEEP_ALL,
    },
}
MIN_IOU = 0.99
SCORE_ATOL = 1e-4
# Stability is a ratio of pixel counts at logit cuts +-1: a pixel whose logit lies within the
# decoder's 1e-4 of a cut may fall either side; 1e-3 allows 0.1% of the union doing so.
STABILITY_ATOL = 1e-3
# A long job for the cancel tests: 32 x 32 points in batches of 16 = 64 decoder runs.
LONG = {"points_per_side": 32, "points_per_batch": 16, **KEEP_ALL}
LONG_BATCHES = 64


@pytest.fixture(scope="module")
def official(sam2_tiny_spec, sam2_tiny_checkpoint):
    from sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator

    from triton_sam.export.sam2 import build_model

    model = build_model(sam2_tiny_spec, sam2_tiny_checkpoint)

    def generate(params: dict) -> list[dict]:
        # binary_mask: the coco_rle mode needs pycocotools, which is not installed; the
        # served RLE is decoded and compared with these masks instead.
        generator = SAM2AutomaticMaskGenerator(model, output_mode="binary_mask", **params)
        return generator.generate(IMAGE)

    return generate


@pytest.fixture(scope="module")
def client(sam2_tiny_server):
    with SAM2TritonClient(sam2_tiny_server.grpc_url, model_type="sam2", protocol="grpc") as c:
        yield c


def decoder_executions(server) -> int:
    http = httpclient.InferenceServerClient(server.http_address)
    try:
        stats = http.get_inference_statistics(DECODER)["model_stats"][0]
        return int(stats["execution_count"])
    finally:
        http.close()


def settled_executions(server, timeout_s: float = 10.0) -> int:
    """The decoder's execution count once it stopped moving (the batch in flight when a job
    was cancelled still finishes)."""
    last, deadline = decoder_executions(server), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = decoder_executions(server)
        if now == last:
            return now
        last = now
    return last


def assert_ready(server) -> None:
    http = httpclient.InferenceServerClient(server.http_address)
    try:
        assert http.is_server_ready() and http.is_model_ready(MODEL)
    finally:
        http.close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_served_instances_are_the_official_generators(client, official, case):
    params = CASES[case]
    steps: list[tuple[int, int]] = []
    served = client.generate_masks(IMAGE, progress=lambda d, t: steps.append((d, t)), **params)
    expected = official(params)
    assert served.image_size == IMAGE.shape[:2]
    assert steps[0][0] == 0 and steps[-1][0] == steps[-1][1] > 0  # told up front, then done
    assert_same_instances(served, expected)


def assert_same_instances(served, expected: list[dict]) -> None:
    """One to one: each official instance has a served one at the same point whose mask
    overlaps it with IoU >= MIN_IOU and whose scores are within the tolerances."""
    assert len(served.instances) == len(expected) > 0
    unmatched = list(served.instances)
    for want in expected:
        same_point = [r for r in unmatched if r["point_coords"] == want["point_coords"]]
        assert same_point, want["point_coords"]
        mask = want["segmentation"]
        ious = [iou(mask, decoded(r, served.image_size)) for r in same_point]
        got = same_point[int(np.argmax(ious))]
        unmatched.remove(got)
        assert max(ious) >= MIN_IOU
        assert got["crop_box"] == want["crop_box"]
        assert abs(got["predicted_iou"] - want["predicted_iou"]) <= SCORE_ATOL
        assert abs(got["stability_score"] - want["stability_score"]) <= STABILITY_ATOL
    assert not unmatched


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)


def decoded(record: dict, hw: tuple[int, int]) -> np.ndarray:
    return masks.decode_rle(record["segmentation"]["counts"], hw)


def test_the_set_image_is_reused_by_its_id(client):
    client.set_image(IMAGE)
    by_id = client.generate_masks(points_per_side=2, **KEEP_ALL)
    by_pixels = client.generate_masks(IMAGE, points_per_side=2, **KEEP_ALL)
    assert by_id.instances == by_pixels.instances


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ('{"points_per_side": 0}', "params.points_per_side"),
        ('{"points_per_side": 10000}', "params.points_per_side"),
        ('{"pred_iou_thresh": NaN}', r"params\.pred_iou_thresh: .*nan"),
        ('{"stability_score_thresh": NaN}', r"params\.stability_score_thresh: .*nan"),
        ('{"crop_n_layers": 9}', "params.crop_n_layers"),
        ('{"points_per_side": 4', "params"),  # not JSON
    ],
)
def test_bad_params_are_refused_naming_the_field(sam2_tiny_server, params, field):
    # Raw requests, past the client's own checks: the server is what refuses.
    inputs = everything_client.job_inputs(IMAGE, params_json=params)
    endpoint = resolve_endpoint(sam2_tiny_server.grpc_url, "grpc")
    with pytest.raises(InvalidRequestError, match=field):
        everything_client.generate(endpoint, MODEL, inputs, timeout_s=60)
    assert_ready(sam2_tiny_server)


def test_a_sync_cancel_reaches_the_server(client, sam2_tiny_server):
    before = settled_executions(sam2_tiny_server)
    seen: list[int] = []

    def progress(done: int, total: int) -> None:
        assert total == LONG_BATCHES
        seen.append(done)
        if done >= 2:
            raise KeyboardInterrupt  # what Ctrl-C in the CLI's progress bar does

    with pytest.raises(KeyboardInterrupt):
        client.generate_masks(IMAGE, progress=progress, **LONG)
    ran = settled_executions(sam2_tiny_server) - before
    # The server runs on while the progress answer travels, so a few more batches may finish;
    # a cancel that did not reach it would run all of them.
    assert 2 <= ran < LONG_BATCHES // 2
    assert_ready(sam2_tiny_server)


def test_an_async_cancel_reaches_the_server_and_a_third_job_is_overloaded(sam2_tiny_server):
    async def scenario() -> int:
        async with SpeculativeSAM2Client(sam2_tiny_server.grpc_url, model_type="sam2") as spec:
            started = asyncio.Event()

            def progress(done: int, total: int) -> None:
                if done >= 1:
                    started.set()

            running = asyncio.create_task(spec.generate_masks(IMAGE, progress=progress, **LONG))
            await asyncio.wait_for(started.wait(), 60)
            waiting = asyncio.create_task(spec.generate_masks(IMAGE, **LONG))
            await asyncio.sleep(0.5)  # admitted: the one waiting place
            with pytest.raises(ServerOverloadedError, match="maximum queue size"):
                await spec.generate_masks(IMAGE, **LONG)
            for task in (running, waiting):
                task.cancel()
            for task in (running, waiting):
                with pytest.raises(asyncio.CancelledError):
                    await task
            return 0

    before = settled_executions(sam2_tiny_server)
    asyncio.run(scenario())
    ran = settled_executions(sam2_tiny_server) - before
    # The running job stopped within a batch or two of the cancel; the waiting one never ran.
    assert 1 <= ran < LONG_BATCHES // 2
    assert_ready(sam2_tiny_server)


def test_another_tenant_cannot_use_an_image_id(sam2_tiny_server):
    image = sample_image(120, 90, seed=5)  # embedded by team-a only
    http = httpclient.InferenceServerClient(sam2_tiny_server.http_address)
    try:
        pixels = httpclient.InferInput(session.IMAGE_RGB, [1, *image.shape], "UINT8")
        pixels.set_data_from_numpy(image[None])
        answer = http.infer(
            "sam2_session",
            [pixels],
            outputs=[httpclient.InferRequestedOutput(session.IMAGE_ID)],
            headers={TENANT_HEADER: "team-a"},
        )
    finally:
        http.close()
    image_id = bytes(answer.as_numpy(session.IMAGE_ID).reshape(-1)[0]).decode()
    endpoint = resolve_endpoint(sam2_tiny_server.grpc_url, "grpc")
    inputs = everything_client.job_inputs(
        image_id=image_id, params_json=json.dumps({"points_per_side": 1})
    )
    with pytest.raises(EmbeddingNotFoundError, match="image_id"):
        everything_client.generate(endpoint, MODEL, inputs, headers={TENANT_HEADER: "team-b"})
    with pytest.raises(EmbeddingNotFoundError):  # nor the default tenant
        everything_client.generate(endpoint, MODEL, inputs)
    own = everything_client.generate(endpoint, MODEL, inputs, headers={TENANT_HEADER: "team-a"})
    assert own.image_size == image.shape[:2]


@pytest.fixture(scope="module")
def two_image_repository(sam2_tiny_repository, tmp_path_factory) -> Path:
    """The shared server's repository (files symlinked), its session model keeping 2 images."""
    repo = tmp_path_factory.mktemp("crop_area") / "model_repository"
    shutil.copytree(sam2_tiny_repository, repo, copy_function=os.symlink)
    path = repo / "sam2_session" / "config.pbtxt"
    config = parse_config(path.read_text())
    config.parameters[session.PARAM_MAX_IMAGES].string_value = "2"
    path.unlink()  # a link to the shared repository's file
    path.write_text(config_to_text(config))
    return repo


def session_raw(http, given: httpclient.InferInput, headers: dict) -> tuple[str, int]:
    """(image id, encoded) the session model answers ``given`` with."""
    names = (session.IMAGE_ID, session.ENCODED)
    wanted = [httpclient.InferRequestedOutput(n) for n in names]
    # a copy: tritonclient.http adds its own (int) headers to the dict it is given
    answer = http.infer("sam2_session", [given], outputs=wanted, headers=dict(headers))
    image_id, encoded = (answer.as_numpy(n).reshape(-1)[0] for n in names)
    return bytes(image_id).decode(), int(encoded)


def embed_raw(http, image: np.ndarray, headers: dict) -> tuple[str, int]:
    pixels = httpclient.InferInput(session.IMAGE_RGB, [1, *image.shape], "UINT8")
    pixels.set_data_from_numpy(image[None])
    return session_raw(http, pixels, headers)


def probe_raw(http, image_id: str, headers: dict) -> int:
    given = httpclient.InferInput(session.IMAGE_ID, [1, 1], "BYTES")
    given.set_data_from_numpy(np.array([[image_id.encode()]], dtype=np.object_))
    return session_raw(http, given, headers)[1]


def test_a_jobs_crops_never_evict_the_tenants_images(embedded_triton, two_image_repository):
    server = embedded_triton(two_image_repository)
    headers = {TENANT_HEADER: "team-c"}
    http = httpclient.InferenceServerClient(server.http_address)
    try:
        clicked, encoded = embed_raw(http, sample_image(96, 64, seed=31), headers)  # 1 of 2
        assert encoded == 1
        endpoint = resolve_endpoint(server.grpc_url, "grpc")
        params = {**CASES["one_crop_layer"], "points_per_side": 1}
        inputs = everything_client.job_inputs(IMAGE, params_json=json.dumps(params))
        job = everything_client.generate(endpoint, MODEL, inputs, headers=headers)
        assert job.image_size == IMAGE.shape[:2]  # the whole image (2 of 2) and 4 crops
        assert probe_raw(http, clicked, headers) == 0  # still cached: a hit, not a miss
        assert embed_raw(http, IMAGE, headers)[1] == 0  # the job's whole image too
    finally:
        http.close()


def test_the_served_bench_row(sam2_tiny_server):
    from triton_sam.bench.everything_served import served_rows

    (row,) = served_rows(
        sam2_tiny_server.grpc_url, IMAGE, [2], server_pid=sam2_tiny_server.pid, params=KEEP_ALL
    )
    assert row.points_per_side == 2 and row.batches == 1  # 4 points, one batch of 64
    assert row.instances == 12 and row.seconds > 0  # 3 masks per point, none suppressed
    assert row.server_peak_bytes is not None and row.server_peak_bytes > 0


# Last: the SAM1 server starts once the SAM2.1 one has stopped after its last test here.
def test_sam1_served_instances_are_the_official_generators(
    sam1_vit_b_server, sam1_vit_b_spec, sam1_vit_b_checkpoint
):
    from segment_anything import SamAutomaticMaskGenerator

    from triton_sam.export.sam1 import build_model

    params = {"points_per_side": 2, **KEEP_ALL}
    model = build_model(sam1_vit_b_spec, sam1_vit_b_checkpoint)
    generator = SamAutomaticMaskGenerator(model, output_mode="binary_mask", **params)
    expected = generator.generate(IMAGE)
    url = sam1_vit_b_server.grpc_url
    with SAM2TritonClient(url, model_type="sam1", protocol="grpc") as sam1:
        served = sam1.generate_masks(IMAGE, **params)
    assert_same_instances(served, expected)
