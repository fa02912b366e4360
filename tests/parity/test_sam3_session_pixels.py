"""The SAM3 tracker's session model in original pixels: the masks it finishes on the server.

Three computations of the same prompts on the same seeded small Sam3TrackerModel
(``tests/conftest.py``'s ``sam3_small_checkpoint``, served by the shared ``sam3_server``):

- **served**: raw KServe v2 requests to ``sam3_session`` (no triton_sam code on the way): the
  PNG's bytes, then ``points`` / ``labels`` / ``box`` in original pixels; the answer's
  ``masks_rle`` decoded;
- **client**: ``SAM2TritonClient(model_type="sam3")`` on its session path (prompts mapped into
  the 1008 frame and logits upsampled by the client, through the same
  ``triton_sam.serving.rules.Sam3ProcessorRule``);
- **upstream**: transformers' ``Sam3TrackerProcessor`` (prompt scaling) + ``Sam3TrackerModel``
  + ``Sam3TrackerProcessor.post_process_masks`` (bilinear to the original size, > 0).

Tolerance: served == client exactly (one decoder, one rule, one threshold). Against upstream
a pixel may differ only where upstream's upsampled logit is within ``LOGIT_ATOL`` of the
threshold 0: onnxruntime and torch round differently (|ours - upstream| <= 1e-4 on logits,
tests/parity/test_sam3_parity.py), so a logit that close to 0 may fall either side; no other
pixel may differ. A planted coordinate bug (x scaled by the height, y by the width: the
mistake the rule exists to prevent) runs through the model-frame path of the same session
model and must fail that comparison, or the comparison proves nothing.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import np_to_triton_dtype

from triton_sam.client import SAM2TritonClient
from triton_sam.models.sam3 import IMAGE_SIZE
from triton_sam.serving import masks as mask_codec
from triton_sam.tools.sample import sample_image

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(900)]

SESSION = "sam3_session"
W, H = 320, 224  # non-square, so a rule that swaps the axes moves every prompt
IMAGE = sample_image(W, H, seed=11)
LOGIT_ATOL = 1e-4  # onnxruntime vs torch on these logits (test_sam3_parity.py's bound)
# (points [[x, y, label]], box or None, multimask)
PROMPTS = {
    "click_multimask": ([[96.5, 94.0, 1]], None, True),
    "box_click_negative": (
        [[150.0, 100.0, 1], [230.0, 130.0, 0]],
        [38.0, 33.0, 250.5, 190.0],
        False,
    ),
}


@pytest.fixture(scope="module")
def upstream(sam3_small_checkpoint):
    from transformers import Sam3TrackerModel, Sam3TrackerProcessor
    from transformers.models.sam3.image_processing_sam3 import Sam3ImageProcessor

    model = Sam3TrackerModel.from_pretrained(sam3_small_checkpoint).eval()
    processor = Sam3TrackerProcessor(image_processor=Sam3ImageProcessor())
    inputs = processor(images=IMAGE, return_tensors="pt")
    with torch.no_grad():
        embeddings = model.get_image_embeddings(inputs["pixel_values"])
    return model, processor, inputs["original_sizes"], embeddings


def upstream_logits(upstream, points, box, multimask) -> tuple[np.ndarray, np.ndarray]:
    """(logits [M, H, W] at the original size, scores [M]) as transformers gives them."""
    model, processor, sizes, embeddings = upstream
    prompts = {}
    if points:
        prompts["input_points"] = [[[p[:2] for p in points]]]
        prompts["input_labels"] = [[[p[2] for p in points]]]
    if box is not None:
        prompts["input_boxes"] = [[box]]
    inputs = processor(original_sizes=sizes, return_tensors="pt", **prompts)
    with torch.no_grad():
        out = model(
            image_embeddings=embeddings,
            input_points=inputs.get("input_points"),
            input_labels=inputs.get("input_labels"),
            input_boxes=inputs.get("input_boxes"),
            multimask_output=multimask,
        )
    low_res = out.pred_masks[:, 0]  # point batch 0: [1, M, 288, 288]
    logits = processor.post_process_masks([low_res], sizes, binarize=False)[0][0]
    return logits.numpy(), out.iou_scores[0, 0].numpy()


def infer(client, inputs: dict[str, np.ndarray], outputs) -> dict[str, np.ndarray]:
    """One raw KServe v2 request (binary tensors) to the session model."""
    tensors = []
    for name, value in inputs.items():
        tensor = httpclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value, binary_data=True)
        tensors.append(tensor)
    wanted = [httpclient.InferRequestedOutput(n, binary_data=True) for n in outputs]
    result = client.infer(SESSION, tensors, outputs=wanted)
    return {n: result.as_numpy(n) for n in outputs}


def served_masks(http, image_id, points, box, multimask) -> tuple[np.ndarray, np.ndarray]:
    """(masks bool [M, H, W], scores [M]) the session model finishes from pixel prompts."""
    inputs = {"image_id": np.array([[image_id]], dtype=np.object_)}
    if points:
        inputs["points"] = np.array([[p[:2] for p in points]], np.float32)
        inputs["labels"] = np.array([[p[2] for p in points]], np.int32)
    if box is not None:
        inputs["box"] = np.array([box], np.float32)
    inputs["multimask_output"] = np.array([[int(multimask)]], np.int32)
    out = infer(http, inputs, ["masks_rle", "mask_scores", "image_size"])
    hw = tuple(int(v) for v in out["image_size"][0])
    assert hw == (H, W)
    masks = np.stack([mask_codec.decode_rle(c, hw) for c in out["masks_rle"][0]])
    return masks, out["mask_scores"][0]


def assert_matches_upstream(masks: np.ndarray, ref_logits: np.ndarray) -> int:
    """Masks equal upstream's logits > 0 except where |logit| <= LOGIT_ATOL; returns how many
    pixels differ (all of them that close to the threshold)."""
    assert masks.shape == ref_logits.shape
    differ = masks != (ref_logits > 0)
    assert np.all(np.abs(ref_logits[differ]) <= LOGIT_ATOL), (
        f"{int(differ.sum())} pixels differ from upstream, "
        f"{int((differ & (np.abs(ref_logits) > LOGIT_ATOL)).sum())} of them away from 0"
    )
    return int(differ.sum())


@pytest.fixture(scope="module")
def served(sam3_server):
    buffer = io.BytesIO()
    Image.fromarray(IMAGE).save(buffer, format="PNG")
    with httpclient.InferenceServerClient(sam3_server.http_url.removeprefix("http://")) as http:
        embedded = infer(
            http,
            {"image_bytes": np.array([[buffer.getvalue()]], dtype=np.object_)},
            ["image_id", "encoded"],
        )
        yield http, embedded["image_id"][0][0].decode()


@pytest.fixture(scope="module")
def client(sam3_server):
    with SAM2TritonClient(sam3_server.http_url, model_type="sam3") as c:
        assert c.uses_server_embeddings
        c.set_image(IMAGE)
        yield c


@pytest.mark.parametrize("name", list(PROMPTS))
def test_served_masks_equal_the_client_and_transformers(served, client, upstream, name):
    points, box, multimask = PROMPTS[name]
    masks, scores = served_masks(*served, points, box, multimask)
    assert masks.shape[0] == (3 if multimask else 1)
    assert 0 < masks.mean() < 1  # both classes present, or equality would be vacuous

    ours = client.predict_full(
        point_coords=[p[:2] for p in points],
        point_labels=[p[2] for p in points],
        box=box,
        multimask_output=multimask,
    )
    np.testing.assert_array_equal(masks, ours.masks[0] > 0)
    np.testing.assert_array_equal(scores, ours.iou_predictions[0])

    ref_logits, ref_scores = upstream_logits(upstream, points, box, multimask)
    differ = assert_matches_upstream(masks, ref_logits)
    np.testing.assert_allclose(scores, ref_scores, atol=LOGIT_ATOL, rtol=0)
    print(f"\n{name}: {differ} of {masks.size} pixels differ from transformers (|logit| <= 1e-4)")


def test_a_planted_coordinate_bug_fails_the_comparison(served, upstream):
    """x scaled by 1008 / H and y by 1008 / W (the axes swapped), sent in the model frame
    (the session model's point_coords path, kept for existing clients): its masks must not
    pass the comparison the served masks pass."""
    http, image_id = served
    points, box, multimask = PROMPTS["box_click_negative"]
    clicks = np.array([p[:2] for p in points], np.float32)
    corners = np.array(box, np.float32).reshape(2, 2)
    swapped = np.concatenate([clicks, corners, np.zeros((1, 2), np.float32)])
    swapped[:-1, 0] *= IMAGE_SIZE / H
    swapped[:-1, 1] *= IMAGE_SIZE / W
    labels = np.array([[p[2] for p in points] + [2, 3, -1]], np.float32)
    out = infer(
        http,
        {
            "image_id": np.array([[image_id]], dtype=np.object_),
            "point_coords": swapped[None],
            "point_labels": labels,
        },
        ["masks"],
    )
    from triton_sam.models.sam3 import PREPROCESSING
    from triton_sam.serving import prompt_frame

    wrong = prompt_frame.upsample(out["masks"], (H, W), PREPROCESSING)[0] > 0
    ref_logits, _ = upstream_logits(upstream, points, box, multimask)
    with pytest.raises(AssertionError, match="away from 0"):
        assert_matches_upstream(wrong, ref_logits)
