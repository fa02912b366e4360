"""SAM3 tracker end to end vs transformers' Sam3TrackerModel + Sam3TrackerProcessor.

A small random-init Sam3TrackerModel (``triton_sam.export.sam3.small_config``: the real
1008x1008 input, feature levels and 288x288 masks, a 2-layer ViT) saved as a model
directory -> two repositories' worth of models in one production repository, served as its CPU
twin on Triton's onnxruntime backend in the embedded tritonserver:

- ``sam3_encoder``/``sam3_decoder``: our export (point-list decoder, mask input, both
  selections), compared with upstream on the whole prompt matrix, on the session path
  (``sam3_session``) and the stateless one;
- ``sam3c_encoder``/``sam3c_decoder``: the same weights exported in the onnx-community layout
  and imported as is; that decoder has no mask input and only the multimask outputs, so
  it is compared on multimask output, and its single mask on the best of the three.

The client reads which layout it talks to from the server (model_type="sam3" both times).

Tolerances (stated, tight):
- scores: |ours - upstream| <= 1e-4 (the requirement is 1e-3)
- logits at the original resolution and low-res logits: |ours - upstream| <= 1e-4
- binary masks (logits > 0): IoU >= 0.99

``sam3_session`` in original pixels (its finished masks, for clients that are not ours):
raw KServe requests (the image file's bytes, then ``points`` / ``labels`` / ``box``) answer
``masks_rle`` that equal the Python client's masks exactly (one decoder, one rule:
``serving/rules.py``'s ``Sam3ProcessorRule``, one threshold) and transformers'
``post_process_masks(...) > 0`` except at pixels whose upstream logit is within 1e-4 of 0
(onnxruntime and torch round differently there, so such a pixel may fall either side; no other
pixel may differ). A planted coordinate bug (the axes swapped: x scaled by 1008 / H), sent
through the session model's model-frame path, must fail that comparison.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from prompt_matrix import assert_same as assert_same_as_upstream
from prompt_matrix import prompt_matrix
from servers import module_server

from triton_sam.client import SAM2TritonClient
from triton_sam.serving import masks as mask_codec
from triton_sam.tools.sample import sample_image

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(900)]

SCORE_ATOL = 1e-4
LOGIT_ATOL = 1e-4
MIN_IOU = 0.99

IMAGE = sample_image(640, 427)  # W x H, non-square
H, W = IMAGE.shape[:2]
PROMPTS = prompt_matrix(W, H)  # the shared matrix


class Upstream:
    """transformers' flow: processor -> get_image_embeddings once -> model(...) per prompt ->
    processor.post_process_masks(binarize=False)."""

    def __init__(self, checkpoint) -> None:
        from transformers import Sam3TrackerModel, Sam3TrackerProcessor
        from transformers.models.sam3.image_processing_sam3 import Sam3ImageProcessor

        self.model = Sam3TrackerModel.from_pretrained(checkpoint).eval()
        self.processor = Sam3TrackerProcessor(image_processor=Sam3ImageProcessor())
        inputs = self.processor(images=IMAGE, return_tensors="pt")
        self.original_sizes = inputs["original_sizes"]
        self.embeddings = self.model.get_image_embeddings(inputs["pixel_values"])

    def predict(
        self,
        *,
        point_coords=None,
        point_labels=None,
        box=None,
        mask_input=None,
        multimask_output=False,
    ):
        """(masks [M,H,W], scores [M], low-res logits [M,288,288]), like SamPredictor's."""
        prompts = {}
        if point_coords is not None:
            prompts.update(input_points=[[point_coords]], input_labels=[[point_labels]])
        if box is not None:
            prompts.update(input_boxes=[[box]])
        inputs = self.processor(original_sizes=self.original_sizes, return_tensors="pt", **prompts)
        with torch.no_grad():
            out = self.model(
                image_embeddings=self.embeddings,
                input_points=inputs.get("input_points"),
                input_labels=inputs.get("input_labels"),
                input_boxes=inputs.get("input_boxes"),
                input_masks=None if mask_input is None else torch.as_tensor(mask_input),
                multimask_output=multimask_output,
            )
        low_res = out.pred_masks[:, 0]  # [1, M, 288, 288]: point batch 0
        masks = self.processor.post_process_masks([low_res], self.original_sizes, binarize=False)[0]
        return masks[0].numpy(), out.iou_scores[0, 0].numpy(), low_res[0].numpy()


# Every prompt runs over both protocols and both serving paths: the session model (features
# kept on the server, BLS to the encoder/decoder) and the stateless decoder.
PATHS = [(p, s) for p in ("http", "grpc") for s in ("session", "stateless")]


@pytest.fixture(scope="module")
def upstream(sam3_small_checkpoint):
    return Upstream(sam3_small_checkpoint)


@pytest.fixture(scope="module")
def parity_server(sam3_build):
    yield from module_server(sam3_build[0])  # see tests/servers.py


@pytest.fixture(scope="module", params=PATHS, ids=["-".join(p) for p in PATHS])
def client(request, parity_server):
    protocol, path = request.param
    url = parity_server.http_url if protocol == "http" else parity_server.grpc_url
    session = path == "session"
    with SAM2TritonClient(
        url, model_type="sam3", protocol=protocol, use_server_embeddings=session
    ) as c:
        assert c.uses_server_embeddings == session
        c.set_image(IMAGE)
        yield c


@pytest.fixture(scope="module", params=["http", "grpc"])
def imported_client(request, parity_server):
    url = parity_server.http_url if request.param == "http" else parity_server.grpc_url
    with SAM2TritonClient(
        url,
        model_type="sam3",
        protocol=request.param,
        encoder_model="sam3c_encoder",
        decoder_model="sam3c_decoder",
    ) as c:
        c.set_image(IMAGE)
        yield c


def assert_same(ours, ref_masks, ref_scores, ref_low_res) -> None:
    assert_same_as_upstream(
        ours,
        ref_masks,
        ref_scores,
        ref_low_res,
        hw=(H, W),
        score_atol=SCORE_ATOL,
        logit_atol=LOGIT_ATOL,
        min_iou=MIN_IOU,
    )


def test_client_picks_the_layout_the_server_has(client, imported_client):
    assert client.family.family == "sam3"
    assert imported_client.family.family == "sam3_onnx_community"


def test_embeddings_match_get_image_embeddings(client, imported_client, upstream):
    for c in (client, imported_client):
        ours = c.get_image_embedding()
        for i, ref in enumerate(upstream.embeddings):
            np.testing.assert_allclose(ours[f"image_embeddings.{i}"], ref.numpy(), atol=1e-4)


@pytest.mark.parametrize("name", list(PROMPTS))
def test_prompt_matrix_matches_sam3_tracker_model(client, upstream, name):
    kwargs = PROMPTS[name]
    assert_same(client.predict_full(**kwargs), *upstream.predict(**kwargs))


def test_mask_input_refinement_matches(client, upstream):
    first = PROMPTS["click"]
    _, _, ref_low = upstream.predict(**first)
    ours_first = client.predict_full(**first)
    refine = PROMPTS["clicks_with_negative"]
    ref = upstream.predict(mask_input=ref_low[None, 0:1], **refine)
    ours = client.predict_full(mask_input=ours_first.low_res_logits[0, 0], **refine)
    assert_same(ours, *ref)
    # The mask input must matter, or this test proves nothing about it.
    without = client.predict_full(**refine)
    assert np.abs(without.low_res_logits - ours.low_res_logits).max() > 10 * LOGIT_ATOL


@pytest.mark.parametrize("name", [n for n in PROMPTS if "multimask" not in n])
def test_imported_pair_matches_upstream_multimask(imported_client, client, upstream, name):
    kwargs = dict(PROMPTS[name], multimask_output=True)
    ref = upstream.predict(**kwargs)
    assert_same(imported_client.predict_full(**kwargs), *ref)
    # and the same masks as our own export of the same weights
    ours = client.predict_full(**kwargs)
    np.testing.assert_allclose(
        imported_client.predict_full(**kwargs).masks, ours.masks, atol=LOGIT_ATOL, rtol=0
    )


def test_imported_pair_single_mask_is_the_best_multimask(imported_client, upstream):
    masks, scores, low_res = upstream.predict(**PROMPTS["click"], multimask_output=True)
    best = int(np.argmax(scores))
    assert_same(
        imported_client.predict_full(**PROMPTS["click"]),
        masks[best : best + 1],
        scores[best : best + 1],
        low_res[best : best + 1],
    )


def test_imported_pair_refuses_mask_input(imported_client):
    from triton_sam.errors import InputValidationError

    with pytest.raises(InputValidationError, match="mask_input"):
        imported_client.predict(**PROMPTS["click"], mask_input=np.zeros((288, 288)))


def test_masks_are_not_degenerate(client):
    """Random weights must still give masks with both classes, or IoU would be vacuous."""
    masks, _ = client.predict(**PROMPTS["box"])
    fraction = float((masks[0, 0] > 0).mean())
    assert 0.0 < fraction < 1.0


@pytest.mark.parametrize("hw", [(427, 640), (1200, 900), (50, 70), (1008, 1008), (2000, 1009)])
def test_transforms_match_sam3_tracker_processor_exactly(hw):
    """Pixels (uint8 antialiased resize, (x - 127.5) / 127.5) and prompt coordinates are
    bit-identical to Sam3TrackerProcessor's (tolerance 0)."""
    from transformers import Sam3TrackerProcessor
    from transformers.models.sam3.image_processing_sam3 import Sam3ImageProcessor

    from triton_sam.client import model_frame
    from triton_sam.models.sam3 import PREPROCESSING

    h, w = hw
    image = np.random.default_rng(h * w).integers(0, 256, (h, w, 3), dtype=np.uint8)
    points, box = [[0.3 * w, 0.4 * h], [w - 0.5, 0.99 * h]], [1.5, 2.0, 0.7 * w, 0.9 * h]
    processor = Sam3TrackerProcessor(image_processor=Sam3ImageProcessor())
    ref = processor(
        images=image,
        input_points=[[points]],
        input_labels=[[[1, 0]]],
        input_boxes=[[box]],
        return_tensors="pt",
    )
    pixels = model_frame.preprocess(image, PREPROCESSING)
    np.testing.assert_array_equal(pixels, ref["pixel_values"].numpy())
    coords = model_frame.transform_coords(np.array(points), (h, w), PREPROCESSING)
    np.testing.assert_array_equal(coords, ref["input_points"][0, 0].numpy())
    corners = model_frame.transform_boxes(np.array([box]), (h, w), PREPROCESSING)
    np.testing.assert_array_equal(corners.reshape(1, 4), ref["input_boxes"][0].numpy())


@pytest.mark.parametrize("layout", ["ours", "onnx_community"])
def test_speculative_client_talks_to_either_layout(parity_server, upstream, layout):
    """The async client resolves the layout like the sync one, on both paths it takes."""
    import asyncio

    from triton_sam.client import SpeculativeSAM2Client

    models = {}
    if layout == "onnx_community":
        models = dict(encoder_model="sam3c_encoder", decoder_model="sam3c_decoder")
    kwargs = dict(PROMPTS["box_and_click"], multimask_output=True)

    async def main():
        async with SpeculativeSAM2Client(parity_server.grpc_url, model_type="sam3", **models) as c:
            await c.set_image_async(IMAGE)
            _, task = await c.predict_async(session_id="s", **kwargs)
            return c.family.prompt_layout, await task, c.predict_full_sync(**kwargs)

    prompt_layout, streamed, direct = asyncio.run(main())
    assert prompt_layout == ("point_list" if layout == "ours" else "hf_points_boxes")
    ref = upstream.predict(**kwargs)
    assert_same(direct, *ref)
    np.testing.assert_allclose(streamed[0], direct.masks, atol=LOGIT_ATOL, rtol=0)
    np.testing.assert_allclose(streamed[1], direct.iou_predictions, atol=SCORE_ATOL, rtol=0)


# -- sam3_session in original pixels: finished masks --------------------------------------------
PIXEL_PROMPTS = ["multimask", "clicks_with_negative", "box_and_click"]


def session_infer(http, inputs: dict[str, np.ndarray], outputs) -> dict[str, np.ndarray]:
    """One raw KServe v2 request (binary tensors) to ``sam3_session``: no triton_sam code."""
    import tritonclient.http as httpclient
    from tritonclient.utils import np_to_triton_dtype

    tensors = []
    for name, value in inputs.items():
        tensor = httpclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value, binary_data=True)
        tensors.append(tensor)
    wanted = [httpclient.InferRequestedOutput(n, binary_data=True) for n in outputs]
    result = http.infer("sam3_session", tensors, outputs=wanted)
    return {n: result.as_numpy(n) for n in outputs}


@pytest.fixture(scope="module")
def session_http(parity_server):
    """(HTTP client, image id): the image's PNG bytes embedded by ``sam3_session``."""
    import tritonclient.http as httpclient
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(IMAGE).save(buffer, format="PNG")
    with httpclient.InferenceServerClient(parity_server.http_url.split("://")[-1]) as http:
        image = np.array([[buffer.getvalue()]], dtype=np.object_)
        answer = session_infer(http, {"image_bytes": image}, ["image_id"])
        yield http, answer["image_id"][0][0].decode()


def served_masks(session_http, kwargs) -> tuple[np.ndarray, np.ndarray]:
    """(masks bool [M, H, W], scores [M]) the session model finishes from pixel prompts."""
    http, image_id = session_http
    inputs = {"image_id": np.array([[image_id]], dtype=np.object_)}
    if "point_coords" in kwargs:
        inputs["points"] = np.array([kwargs["point_coords"]], np.float32)
        inputs["labels"] = np.array([kwargs["point_labels"]], np.int32)
    if "box" in kwargs:
        inputs["box"] = np.array([kwargs["box"]], np.float32)
    inputs["multimask_output"] = np.array([[int(kwargs.get("multimask_output", False))]], np.int32)
    out = session_infer(http, inputs, ["masks_rle", "mask_scores", "image_size"])
    assert tuple(out["image_size"][0]) == (H, W)
    masks = np.stack([mask_codec.decode_rle(c, (H, W)) for c in out["masks_rle"][0]])
    return masks, out["mask_scores"][0]


def assert_masks_match_upstream(masks: np.ndarray, ref_logits: np.ndarray) -> int:
    """Masks equal upstream's logits > 0 except where |logit| <= LOGIT_ATOL; returns how many
    pixels differ (every one of them that close to the threshold)."""
    assert masks.shape == ref_logits.shape
    differ = masks != (ref_logits > 0)
    far = differ & (np.abs(ref_logits) > LOGIT_ATOL)
    assert not far.any(), f"{int(differ.sum())} pixels differ, {int(far.sum())} away from 0"
    return int(differ.sum())


@pytest.mark.parametrize("name", PIXEL_PROMPTS)
def test_session_finished_masks_equal_the_client_and_transformers(
    session_http, parity_server, upstream, name
):
    kwargs = PROMPTS[name]
    masks, scores = served_masks(session_http, kwargs)
    assert masks.shape[0] == (3 if kwargs.get("multimask_output") else 1)
    assert 0 < masks.mean() < 1  # both classes present, or equality would be vacuous
    with SAM2TritonClient(parity_server.http_url, model_type="sam3") as c:
        assert c.uses_server_embeddings
        c.set_image(IMAGE)
        ours = c.predict_full(**kwargs)
    np.testing.assert_array_equal(masks, ours.masks[0] > 0)
    np.testing.assert_array_equal(scores, ours.iou_predictions[0])
    ref_masks, ref_scores, _ = upstream.predict(**kwargs)
    differ = assert_masks_match_upstream(masks, ref_masks)
    np.testing.assert_allclose(scores, ref_scores, atol=SCORE_ATOL, rtol=0)
    print(f"\n{name}: {differ} of {masks.size} pixels differ from transformers")


def test_a_planted_coordinate_bug_fails_the_pixel_comparison(session_http, upstream):
    """The box-and-click prompt with x scaled by 1008 / H and y by 1008 / W, sent in the model
    frame (``point_coords``: the path kept for clients that map prompts themselves): its masks
    must fail the comparison the served masks pass."""
    from triton_sam.models.sam3 import IMAGE_SIZE, PREPROCESSING
    from triton_sam.serving import prompt_frame

    http, image_id = session_http
    kwargs = PROMPTS["box_and_click"]
    corners = np.array(kwargs["box"], np.float32).reshape(2, 2)
    swapped = np.concatenate([np.array(kwargs["point_coords"], np.float32), corners])
    swapped *= np.array([IMAGE_SIZE / H, IMAGE_SIZE / W], np.float32)
    coords = np.concatenate([swapped, np.zeros((1, 2), np.float32)])  # + the padding point
    labels = np.array([[*kwargs["point_labels"], 2, 3, -1]], np.float32)
    out = session_infer(
        http,
        {
            "image_id": np.array([[image_id]], dtype=np.object_),
            "point_coords": coords[None],
            "point_labels": labels,
        },
        ["masks"],
    )
    wrong = prompt_frame.upsample(out["masks"], (H, W), PREPROCESSING)[0] > 0
    ref_masks, _, _ = upstream.predict(**kwargs)
    with pytest.raises(AssertionError, match="away from 0"):
        assert_masks_match_upstream(wrong, ref_masks)
