"""SAM2.1 end to end vs the official SAM2ImagePredictor on the same weights, image and prompts.

Random-init SAM2.1-tiny saved as an official checkpoint -> triton-sam export -> repository
(python target) -> embedded tritonserver -> SAM2TritonClient over HTTP and gRPC.

Tolerances (stated, tight):
- scores: |ours - upstream| <= 1e-4 (the issue asks for 1e-3; measured <= 3e-8)
- logits at the original resolution and low-res logits: |ours - upstream| <= 1e-4
  (measured <= 5e-7 on logits up to 0.34 in magnitude: ORT-vs-torch reassociation plus the
  numpy resize/interpolation)
- binary masks (logits > 0): IoU >= 0.99
"""

from __future__ import annotations

import numpy as np
import pytest

from triton_sam.client import SAM2TritonClient
from triton_sam.export.sam2 import build_model
from triton_sam.sample import sample_image

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(900)]

SCORE_ATOL = 1e-4
LOGIT_ATOL = 1e-4
MIN_IOU = 0.99

IMAGE = sample_image(640, 427)  # W x H, non-square
H, W = IMAGE.shape[:2]
CLICK = [[0.3 * W, 0.42 * H]]
NEG = [[0.7 * W, 0.55 * H]]
BOX = [0.12 * W, 0.15 * H, 0.5 * W, 0.7 * H]

# name -> predict kwargs (mask_input refinement is its own test)
PROMPTS: dict[str, dict] = {
    "click": dict(point_coords=CLICK, point_labels=[1]),
    "clicks_with_negative": dict(point_coords=CLICK + NEG, point_labels=[1, 0]),
    "box": dict(box=BOX),
    "box_and_click": dict(box=BOX, point_coords=CLICK, point_labels=[1]),
    "multimask": dict(point_coords=CLICK, point_labels=[1], multimask_output=True),
    "box_multimask": dict(box=BOX, multimask_output=True),
}


@pytest.fixture(scope="module")
def upstream(sam2_tiny_spec, sam2_tiny_checkpoint):
    """The official predictor, same weights, with the image set."""
    from sam2.sam2_image_predictor import SAM2ImagePredictor

    predictor = SAM2ImagePredictor(build_model(sam2_tiny_spec, sam2_tiny_checkpoint))
    predictor.set_image(IMAGE)
    return predictor


@pytest.fixture(scope="module", params=["http", "grpc"])
def client(request, sam2_tiny_server):
    server = sam2_tiny_server
    url = server.http_url if request.param == "http" else server.grpc_url
    with SAM2TritonClient(url, model_type="sam2", protocol=request.param) as c:
        c.set_image(IMAGE)
        yield c


def upstream_predict(predictor, **kwargs):
    kwargs = {k: (np.asarray(v) if k != "multimask_output" else v) for k, v in kwargs.items()}
    kwargs.setdefault("multimask_output", False)
    return predictor.predict(return_logits=True, **kwargs)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)


def assert_same(ours, ref_masks, ref_scores, ref_low_res) -> None:
    assert ours.masks.shape == (1, *ref_masks.shape)
    assert ours.masks.shape[-2:] == (H, W)
    np.testing.assert_allclose(ours.iou_predictions[0], ref_scores, atol=SCORE_ATOL, rtol=0)
    np.testing.assert_allclose(ours.masks[0], ref_masks, atol=LOGIT_ATOL, rtol=0)
    np.testing.assert_allclose(ours.low_res_logits[0], ref_low_res, atol=LOGIT_ATOL, rtol=0)
    for i in range(ref_masks.shape[0]):
        assert iou(ours.masks[0, i] > 0, ref_masks[i] > 0) >= MIN_IOU


@pytest.mark.parametrize("name", list(PROMPTS))
def test_prompt_matrix_matches_sam2_image_predictor(client, upstream, name):
    kwargs = PROMPTS[name]
    ref_masks, ref_scores, ref_low_res = upstream_predict(upstream, **kwargs)
    assert_same(client.predict_full(**kwargs), ref_masks, ref_scores, ref_low_res)


def test_mask_input_refinement_matches(client, upstream):
    first = PROMPTS["click"]
    _, _, ref_low = upstream_predict(upstream, **first)
    ours_first = client.predict_full(**first)
    refine = dict(point_coords=CLICK + NEG, point_labels=[1, 0])
    ref = upstream_predict(upstream, mask_input=ref_low[0:1], **refine)
    ours = client.predict_full(mask_input=ours_first.low_res_logits[0, 0], **refine)
    assert_same(ours, *ref)
    # The mask input must matter, or this test proves nothing about it.
    without = client.predict_full(**refine)
    assert np.abs(without.low_res_logits - ours.low_res_logits).max() > 10 * LOGIT_ATOL


def test_masks_are_not_degenerate(client):
    """Random weights must still give masks with both classes, or IoU would be vacuous."""
    masks, _ = client.predict(**PROMPTS["box"])
    fraction = float((masks[0, 0] > 0).mean())
    assert 0.0 < fraction < 1.0


def test_predict_tuple_api_matches_reference_readme(client):
    masks, iou_pred = client.predict(point_coords=[[W // 2, H // 2]], point_labels=[1])
    assert masks.shape == (1, 1, H, W) and masks.dtype == np.float32
    assert iou_pred.shape == (1, 1)
