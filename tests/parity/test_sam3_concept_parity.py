"""SAM3 concept segmentation end to end vs transformers' Sam3Model + Sam3Processor.

A small random-init Sam3Model (``triton_sam.export.sam3_concept.small_config``: the real
1008x1008 input, 288/144/72 feature levels, 32 tokens, 200 queries, width 64; weights
re-scaled so scores, presence and masks carry signal) with the toy CLIP tokenizer, exported
into one embedded tritonserver (``sam3_concept`` + its three graphs), against upstream's flow
on two odd-sized images: ``Sam3Processor`` -> ``get_vision_features`` once -> ``Sam3Model``
per phrase -> ``post_process_instance_segmentation``.

Three phrases are chosen from the reference itself (deterministic for the seed): one with
several instances, one with exactly one, one with none because its presence is low, at one
threshold; the test checks the reference really has them, so it cannot pass vacuously.

Tolerances (stated, principled):
- the instance set: exactly the processor's (same queries, same order); the threshold is
  chosen at least ``MARGIN`` = 1e-4 away from every reference score, 50x the ORT-vs-torch
  score error measured at export (2e-6);
- scores and presence: |ours - upstream| <= 1e-4 (same margin);
- boxes: |ours - upstream| <= 0.01 px (normalised boxes differ by ~4e-7 times <= 1008 px);
- masks: IoU >= 0.99 per instance (pixels whose probability is within float error of 0.5
  may flip; measured min IoU is printed);
- low-res logits (``mask_format="logits"``): |ours - upstream| <= 1e-3 (ORT vs torch
  measured 2.9e-4 at export on logits up to ~40).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from servers import module_server

from triton_sam.client import SAM2TritonClient

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(1200)]

MARGIN = 1e-4
SCORE_ATOL = 1e-4
BOX_ATOL_PX = 0.01
MIN_IOU = 0.99
LOGIT_ATOL = 1e-3
CANDIDATES = (
    "cat", "red car", "mitochondrion", "the dog", "blue tree", "neuron", "a cell",
    "green membrane", "person", "synapse", "axon", "vesicle",
)  # fmt: skip
THRESHOLDS = np.round(np.arange(0.300, 0.955, 0.005), 3)
SIZES = ((333, 517), (480, 271))  # (H, W): odd, one landscape, one portrait


def _image(hw: tuple[int, int], seed: int) -> np.ndarray:
    """Random pixels with some structure (blocks of colour) so masks are not pure noise."""
    rng = np.random.default_rng(seed)
    h, w = hw
    blocks = rng.integers(0, 256, (h // 37 + 1, w // 37 + 1, 3))
    base = np.kron(blocks, np.ones((37, 37, 1)))[:h, :w]
    return np.clip(base + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)


class Upstream:
    """transformers' flow for one image and any phrases (vision features computed once)."""

    def __init__(self, checkpoint, image: np.ndarray) -> None:
        from transformers import Sam3Model, Sam3Processor

        self.model = Sam3Model.from_pretrained(checkpoint).eval()
        self.processor = Sam3Processor.from_pretrained(checkpoint)
        self.hw = image.shape[:2]
        pixels = self.processor(images=image, return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            self.vision = self.model.get_vision_features(pixel_values=pixels)

    def forward(self, phrases: list[str]):
        from transformers.models.sam3.modeling_sam3 import Sam3VisionEncoderOutput

        n = len(phrases)
        vision = Sam3VisionEncoderOutput(
            fpn_hidden_states=tuple(f.repeat(n, 1, 1, 1) for f in self.vision.fpn_hidden_states),
            fpn_position_encoding=tuple(
                p.repeat(n, 1, 1, 1) for p in self.vision.fpn_position_encoding
            ),
        )
        text = self.processor(text=phrases, return_tensors="pt")
        with torch.no_grad():
            return self.model(vision_embeds=vision, **text)

    def instances(self, outputs, threshold: float) -> list[dict]:
        return self.processor.post_process_instance_segmentation(
            outputs,
            threshold=threshold,
            mask_threshold=0.5,
            target_sizes=[self.hw] * len(outputs.pred_logits),
        )


def _scores(outputs) -> np.ndarray:
    return (outputs.pred_logits.sigmoid() * outputs.presence_logits.sigmoid()).numpy()


def _choose(first, second) -> tuple[float, list[int]]:
    """(threshold, [several, one, none]) over the candidates: those counts on the first
    image, as many instances as can be on the second (at least one), every score of both
    images at least MARGIN from the threshold."""
    scores, other = _scores(first), _scores(second)
    presence = first.presence_logits.sigmoid().numpy().reshape(-1)
    best, best_count = None, 0
    for threshold in THRESHOLDS:
        counts = (scores > threshold).sum(-1)
        others = (other > threshold).sum(-1)
        for several in np.flatnonzero((counts >= 2) & (counts <= 40)):
            for one in np.flatnonzero(counts == 1):
                for none in np.flatnonzero((counts == 0) & (presence < 0.5)):
                    rows = [several, one, none]
                    gap = min(np.abs(s[rows] - threshold).min() for s in (scores, other))
                    count = others[several] + others[one]
                    if gap >= MARGIN and count > best_count:
                        best = float(threshold), [int(several), int(one), int(none)]
                        best_count = count
    assert best is not None, "the reference has no threshold giving several / one / none"
    return best


@pytest.fixture(scope="module")
def reference(concept_checkpoint):
    """Per image: the upstream model and its raw outputs for the three chosen phrases."""
    images = [_image(hw, seed) for seed, hw in enumerate(SIZES)]
    upstreams = [Upstream(concept_checkpoint, image) for image in images]
    everything = [u.forward(list(CANDIDATES)) for u in upstreams]
    threshold, chosen = _choose(*everything)
    phrases = [CANDIDATES[i] for i in chosen]
    cases = []
    for image, upstream in zip(images, upstreams, strict=True):
        outputs = upstream.forward(phrases)
        assert np.abs(_scores(outputs) - threshold).min() >= MARGIN
        cases.append((image, outputs, upstream.instances(outputs, threshold)))
    print(f"\nthreshold {threshold}, phrases {phrases}")
    for image, _, instances in cases:
        print(image.shape[:2], "instances per phrase:", [len(r["scores"]) for r in instances])
    return threshold, phrases, cases


@pytest.fixture(scope="module")
def parity_server(concept_build):
    yield from module_server(concept_build[0])  # see tests/servers.py


@pytest.fixture(params=["http", "grpc"])
def client(request, parity_server):
    url = parity_server.http_url if request.param == "http" else parity_server.grpc_url
    with SAM2TritonClient(url, model_type="sam3_concept", protocol=request.param) as c:
        yield c


def test_reference_has_several_one_and_no_instance(reference):
    threshold, phrases, cases = reference
    _, outputs, instances = cases[0]
    counts = [len(r["scores"]) for r in instances]
    assert counts[0] >= 2 and counts[1] == 1 and counts[2] == 0
    assert float(outputs.presence_logits[2].sigmoid()) < 0.5


def test_instances_match_sam3_processor(client, reference):
    threshold, phrases, cases = reference
    worst_iou = 1.0
    for image, outputs, instances in cases:
        client.set_image(image)
        ours = client.predict_concepts(phrases, threshold=threshold)
        presence = outputs.presence_logits.sigmoid().numpy().reshape(-1)
        np.testing.assert_allclose(ours.presence, presence, atol=SCORE_ATOL, rtol=0)
        for p, ref in enumerate(instances):
            mine = ours.for_phrase(p)
            scores = _scores(outputs)[p]
            keep = np.flatnonzero(scores > threshold)  # the processor's order: query order
            np.testing.assert_array_equal(mine.query_index, keep)
            np.testing.assert_allclose(mine.scores, ref["scores"].numpy(), atol=SCORE_ATOL, rtol=0)
            np.testing.assert_allclose(mine.boxes, ref["boxes"].numpy(), atol=BOX_ATOL_PX, rtol=0)
            masks = ref["masks"].numpy().astype(bool)
            assert mine.masks.shape == (len(keep), *image.shape[:2])
            assert len(masks) == len(keep)  # (the processor leaves an empty [0, 288, 288])
            for a, b in zip(mine.masks, masks, strict=True):
                union = (a | b).sum()
                iou = (a & b).sum() / union if union else 1.0
                worst_iou = min(worst_iou, iou)
                assert iou >= MIN_IOU
    print(f"\n{client._transport.endpoint.protocol}: worst mask IoU {worst_iou:.6f}")


def test_png_and_logits_formats_match(client, reference):
    threshold, phrases, cases = reference
    image, outputs, _ = cases[1]
    client.set_image(image)
    rle = client.predict_concepts(phrases, threshold=threshold)
    png = client.predict_concepts(phrases, threshold=threshold, mask_format="png")
    np.testing.assert_array_equal(png.masks, rle.masks)
    logits = client.predict_concepts(phrases, threshold=threshold, mask_format="logits")
    for p in range(len(phrases)):
        mine = logits.for_phrase(p)
        expected = outputs.pred_masks[p].numpy()[mine.query_index]
        np.testing.assert_allclose(mine.low_res_logits, expected, atol=LOGIT_ATOL, rtol=0)
    boxes_only = client.predict_concepts(phrases, threshold=threshold, mask_format="none")
    assert boxes_only.masks is None and np.array_equal(boxes_only.scores, rle.scores)


def test_max_instances_keeps_the_best_scores_in_query_order(client, reference):
    threshold, phrases, cases = reference
    image, outputs, _ = cases[0]
    client.set_image(image)
    ours = client.predict_concepts(phrases[0], threshold=threshold, max_instances=2)
    scores = _scores(outputs)[0]
    best = np.sort(np.argsort(-scores)[:2])
    np.testing.assert_array_equal(ours.query_index, best)


def test_numpy_post_processing_equals_the_processor(reference):
    from triton_sam.serving import masks

    threshold, _, cases = reference
    for image, outputs, instances in cases:
        for p, ref in enumerate(instances):
            ours = masks.postprocess_instances(
                outputs.pred_logits[p].numpy(),
                outputs.pred_boxes[p].numpy(),
                outputs.pred_masks[p].numpy(),
                outputs.presence_logits[p].numpy(),
                threshold=threshold,
                mask_threshold=0.5,
                hw=image.shape[:2],
            )
            np.testing.assert_allclose(ours["scores"], ref["scores"].numpy(), atol=1e-6, rtol=0)
            np.testing.assert_array_equal(ours["boxes"], ref["boxes"].numpy())
            if not len(ref["scores"]):
                continue  # the processor leaves no instance as an empty [0, 288, 288]
            differ = (ours["masks"] != ref["masks"].numpy().astype(bool)).sum()
            assert differ <= 1e-5 * ours["masks"].size  # float rounding at 0.5 only


def test_server_tokenizer_equals_sam3_processor(concept_build, concept_checkpoint):
    """The serving model's tokenisation (tokenizers + its tokenizer.json) is the processor's."""
    import sys
    import types

    from transformers import Sam3Processor

    sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("pb_utils"))
    from triton_sam.serving.concept_model import RequestError, Tokenizer

    repo, build = concept_build
    tokenizer = Tokenizer(
        str(repo / "sam3_concept" / "1" / "tokenizer.json"), build.export.pad_token_id, 32
    )
    processor = Sam3Processor.from_pretrained(concept_checkpoint)
    phrases = ["cat", "Red  CAR", "a cell!", "mitochondrion 3", "  vesicle ", "x" * 25, "é ñ dog"]
    ids, mask = tokenizer.encode(phrases)
    expected = processor(text=phrases, return_tensors="np")
    np.testing.assert_array_equal(ids, expected["input_ids"])
    np.testing.assert_array_equal(mask, expected["attention_mask"])
    with pytest.raises(RequestError, match=r"text: phrase 0 .* 42 tokens, expected at most 32"):
        tokenizer.encode(["a " * 40])
