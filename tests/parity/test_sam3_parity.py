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
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from prompt_matrix import assert_same as assert_same_as_upstream
from prompt_matrix import prompt_matrix
from servers import module_server

from triton_sam.client import SAM2TritonClient
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
