"""Exemplar prompts of the ``sam3_concept`` model without a server: the boxes a request may
send (refusals name the field), their normalisation, the tenant-bound store of encoded
exemplars, and the serving model's exemplar path driven with a stand-in ``pb_utils`` and a
fake BLS."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
import types

import numpy as np
import pytest
from pb_stand_in import Tensor

from triton_sam.repository import concept as concept_repo
from triton_sam.serving import cache, concept_exemplars
from triton_sam.serving import protocol as envelope
from triton_sam.serving.bounds import RequestError
from triton_sam.serving.protocol import concept as protocol
from triton_sam.serving.protocol.concept import ConceptSettings

HW = (24, 32)  # (H, W) of the request's image
WIDTH = 4  # channels of the fake graphs' tokens


class _Request:
    def __init__(self, **inputs):
        self.inputs = {n: Tensor(n, v) for n, v in inputs.items()}


_PB = types.SimpleNamespace(get_input_tensor_by_name=lambda r, name: r.inputs.get(name))


def _boxes(boxes, labels=None, max_boxes=3):
    inputs = {} if boxes is None else {protocol.EXEMPLAR_BOXES: np.asarray([boxes], np.float32)}
    if labels is not None:
        inputs[protocol.EXEMPLAR_LABELS] = np.asarray([labels], np.int32)
    return concept_exemplars.boxes(_PB, _Request(**inputs), HW, max_boxes)


def test_boxes_and_labels_are_read_with_labels_positive_by_default():
    boxes, labels = _boxes([[0, 0, 32, 24], [1.5, 2, 3, 4]])
    np.testing.assert_array_equal(boxes, [[0, 0, 32, 24], [1.5, 2, 3, 4]])
    np.testing.assert_array_equal(labels, [1, 1])
    assert labels.dtype == np.int64
    np.testing.assert_array_equal(_boxes([[1, 2, 3, 4], [5, 6, 7, 8]], [0, 1])[1], [0, 1])
    assert _boxes(None) is None


@pytest.mark.parametrize(
    "boxes, labels, message",
    [
        ([[1, 2, 3, 4], [5, 6, 4, 8]], None, "exemplar_boxes[1]: (5, 6, 4, 8) is empty"),
        ([[1, 2, 3, 4], [5, 6, 5, 8]], None, "exemplar_boxes[1]: (5, 6, 5, 8) is empty"),
        ([[1, 2, 3, 24.5]], None, "exemplar_boxes[0]: (1, 2, 3, 24.5) is outside the image"),
        ([[-1, 2, 3, 4]], None, "exemplar_boxes[0]: (-1, 2, 3, 4) is outside the image"),
        (
            [[1, 2, 3, 4], [np.nan, 2, 3, 4]],
            None,
            "exemplar_boxes[1]: (nan, 2, 3, 4) is not finite",
        ),
        ([[1, 2, 3, 4]] * 4, None, "exemplar_boxes: shape [4, 4], expected [G, 4]"),
        ([[1, 2, 3]], None, "exemplar_boxes: shape [1, 3], expected [G, 4]"),
        ([[1, 2, 3, 4]], [1, 0], "exemplar_labels: got 2 labels for 1 boxes"),
        ([[1, 2, 3, 4], [1, 2, 3, 4]], [1, 2], "exemplar_labels[1]: got 2, expected 1"),
        (None, [1], "exemplar_labels: sent without exemplar_boxes"),
    ],
)
def test_bad_boxes_are_refused_naming_the_field(boxes, labels, message):
    with pytest.raises(RequestError, match=re.escape(message)):
        _boxes(boxes, labels)


def test_boxes_are_normalised_cxcywh_as_sam3_processor_sends_them():
    found = np.array([[0, 0, 32, 24], [8, 6, 16, 18]], np.float64)
    expected = [[0.5, 0.5, 1, 1], [0.375, 0.5, 0.25, 0.5]]  # /W, /H, then centre and size
    normalised = concept_exemplars.normalised_cxcywh(found, HW)
    assert normalised.dtype == np.float32
    np.testing.assert_array_equal(normalised, expected)


def test_exemplar_ids_are_bounded_in_count_and_length():
    def ids(values):
        request = _Request(exemplar_ids=np.array([values], dtype=np.object_))
        return concept_exemplars.exemplar_ids(_PB, request, 2)

    assert ids([b"a", b"b"]) == ["a", "b"]
    assert concept_exemplars.exemplar_ids(_PB, _Request(), 2) == []
    with pytest.raises(RequestError, match=re.escape("exemplar_ids: got 3 ids, expected 1 to 2")):
        ids([b"a", b"b", b"c"])
    with pytest.raises(RequestError, match=re.escape("exemplar_ids[1]: 65 bytes")):
        ids([b"a", b"x" * 65])


def test_store_issues_128_bit_ids_bound_to_the_tenant_and_evicts_lru():
    store = concept_exemplars.ExemplarStore(2)
    tokens = [np.full((2, WIDTH), i, np.float32) for i in range(3)]
    first = store.keep("team-y", tokens[0])
    again = store.keep("team-y", tokens[0])
    assert first != again  # a new id per encode call, never derived from the content
    # 16 random bytes in URL-safe base64 without padding: 22 characters, 128 bits
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", first)
    np.testing.assert_array_equal(store.tokens("team-y", [first])[0], tokens[0])
    for tenant in ("team-x", ""):  # another tenant, the default one too: as if never issued
        with pytest.raises(concept_exemplars.ExemplarMiss, match=r"exemplar_ids\[0\]: .* not held"):
            store.tokens(tenant, [first])
    store.tokens("team-y", [first])  # now the most recently used: `again` goes next
    store.keep("team-y", tokens[2])
    assert len(store) == 2
    with pytest.raises(concept_exemplars.ExemplarMiss, match=r"exemplar_ids\[1\]"):
        store.tokens("team-y", [first, again])


@pytest.fixture
def model(monkeypatch):
    pb_utils = sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("pb_utils"))
    monkeypatch.setattr(pb_utils, "Tensor", Tensor, raising=False)
    monkeypatch.setattr(
        pb_utils, "get_input_tensor_by_name", lambda r, name: r.inputs.get(name), raising=False
    )
    monkeypatch.setattr(
        pb_utils, "get_output_tensor_by_name", lambda r, name: r.outputs[name], raising=False
    )
    spec = importlib.util.spec_from_file_location("concept_model", concept_repo.SERVING_SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    instance = module.TritonPythonModel()  # what initialize sets, without a server
    instance.settings = ConceptSettings(
        vision_model="vision",
        text_model="text",
        decoder_model="decoder",
        feature_names=("f0", "f2"),
        feature_bytes=100,
        pad_token_id=0,
        num_queries=200,
        max_images=4,
        max_bytes=0,
        max_phrases_cached=8,
        max_phrases=4,
        phrases_per_decode=4,
        max_image_pixels=10**6,
        exemplar_model="exemplar",
        max_exemplars=4,
        max_boxes=3,
    )
    instance.images, instance.phrases = cache.LruCache(4), cache.LruCache(8)
    instance.exemplars = concept_exemplars.ExemplarStore(4)
    instance.calls = []

    async def bls(model_name, inputs, outputs, *, gpu):
        feeds = {t.name(): t.as_numpy() for t in inputs}
        instance.calls.append((model_name, feeds))
        count = feeds[protocol.EXEMPLAR_BOXES].shape[1]  # the exemplar graph: G + 1 tokens
        tokens = np.arange((count + 1) * WIDTH, dtype=np.float32).reshape(1, count + 1, WIDTH)
        return types.SimpleNamespace(outputs={"exemplar_features": Tensor("x", tokens)})

    instance._bls = bls
    return module, instance


def test_boxes_run_the_exemplar_graph_on_the_coarsest_level_and_are_kept(model):
    _, model = model
    features = {"f0": np.zeros(1), "f2": np.ones((1, WIDTH, 3, 3), np.float32)}
    request = _Request(
        exemplar_boxes=np.array([[[0, 0, 32, 24], [8, 6, 16, 18]]], np.float32),
        exemplar_labels=np.array([[1, 0]], np.int32),
    )
    exemplar_id, tokens = asyncio.run(model._exemplars(request, features, HW, "team-y", []))
    [(name, feeds)] = model.calls
    assert name == "exemplar"
    assert set(feeds) == {"f2", protocol.EXEMPLAR_BOXES, protocol.EXEMPLAR_LABELS}
    np.testing.assert_array_equal(feeds["f2"], features["f2"])
    np.testing.assert_array_equal(
        feeds["exemplar_boxes"][0], [[0.5, 0.5, 1, 1], [0.375, 0.5, 0.25, 0.5]]
    )
    assert feeds[protocol.EXEMPLAR_LABELS].dtype == np.int64  # the graph's labels are int64
    assert tokens.shape == (3, WIDTH)  # 2 boxes + CLS
    np.testing.assert_array_equal(model.exemplars.tokens("team-y", [exemplar_id])[0], tokens)
    # the kept exemplar then follows this request's own: [own 3 tokens, kept 3 tokens]
    request = _Request(exemplar_boxes=np.array([[[1, 1, 2, 2]]], np.float32))
    kept = model.exemplars.tokens("team-y", [exemplar_id])
    second_id, both = asyncio.run(model._exemplars(request, features, HW, "team-y", kept))
    assert second_id not in ("", exemplar_id)
    assert both.shape == (2 + 3, WIDTH)
    np.testing.assert_array_equal(both[2:], tokens)
    # ids alone: no graph runs, no new id
    none_id, only = asyncio.run(model._exemplars(_Request(), features, HW, "team-y", kept))
    assert (none_id, len(model.calls)) == ("", 2)
    np.testing.assert_array_equal(only, tokens)


def test_prompts_are_text_tokens_then_exemplar_tokens_all_valid():
    text = np.zeros((2, 32, WIDTH), np.float32)
    mask = np.zeros((2, 32), np.int64)
    mask[:, :3] = 1
    same, same_mask = concept_exemplars.with_exemplars(text, mask, None)
    assert same is text and same_mask is mask  # text-only prompts: unchanged
    exemplars = np.ones((5, WIDTH), np.float32)
    prompts, prompt_mask = concept_exemplars.with_exemplars(text, mask, exemplars)
    assert prompts.shape == (2, 37, WIDTH) and prompt_mask.shape == (2, 37)
    np.testing.assert_array_equal(prompts[:, 32:], 1)
    np.testing.assert_array_equal(prompt_mask.sum(1), [3 + 5, 3 + 5])


# -- client side -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, field, message",
    [
        ({"boxes": [[1, 2, 3, 4], [5, 6, 4, 8]]}, "boxes[1]", "(5, 6, 4, 8) is empty"),
        ({"boxes": [[1, 2, 3, 4], [0, 0, 33, 4]]}, "boxes[1]", "outside the image"),
        ({"boxes": [[-0.5, 2, 3, 4]]}, "boxes[0]", "outside the image"),
        ({"boxes": [[1, 2, 3, 4], [1, np.nan, 3, 4]]}, "boxes[1]", "not finite"),
        ({"boxes": [[1, 2, 3, 4]] * 17}, "boxes", "shape [17, 4], expected [G, 4]"),
        ({"boxes": [[1, 2, 3, 4]], "box_labels": [2]}, "box_labels", "got [2], expected"),
        ({"boxes": [[1, 2, 3, 4]], "box_labels": [1, 0]}, "box_labels", "per box (1)"),
        ({"box_labels": [1]}, "box_labels", "given without boxes"),
        ({"exemplar_ids": ["a"] * 5}, "exemplar_ids", "got 5 ids, expected 1 to 4"),
        ({"exemplar_ids": ["a", ""]}, "exemplar_ids[1]", "expected an exemplar_id"),
    ],
)
def test_client_refuses_bad_exemplars_naming_the_field(kwargs, field, message):
    from triton_sam.client.concept_exemplars import check_exemplars
    from triton_sam.errors import InputValidationError

    args = {"boxes": None, "box_labels": None, "exemplar_ids": None} | kwargs
    with pytest.raises(InputValidationError, match=re.escape(message)) as raised:
        check_exemplars(args["boxes"], args["box_labels"], args["exemplar_ids"], HW)
    assert raised.value.field == field


def test_client_sends_exemplars_as_the_protocol_names_them():
    from triton_sam.client.concept_exemplars import check_exemplars
    from triton_sam.client.concepts import ConceptImage

    image = ConceptImage.of(np.zeros((*HW, 3), np.uint8), protocol.MODEL)
    exemplars = check_exemplars([1, 2, 3, 4], [0], "kept-id", HW)  # one box, one id
    options = {"threshold": 0.3, "mask_threshold": 0.5, "max_instances": None}
    inputs = image.predict_inputs([], **options, exemplars=exemplars)
    assert protocol.TEXT not in inputs  # exemplars alone: the server prompts with "visual"
    np.testing.assert_array_equal(inputs[protocol.EXEMPLAR_BOXES], [[[1, 2, 3, 4]]])
    assert inputs[protocol.EXEMPLAR_BOXES].dtype == np.float32
    np.testing.assert_array_equal(inputs[protocol.EXEMPLAR_LABELS], [[0]])
    assert inputs[protocol.EXEMPLAR_LABELS].dtype == np.int32
    assert inputs[protocol.EXEMPLAR_IDS].tolist() == [[b"kept-id"]]
    text_only = image.predict_inputs(["cat"], **options)
    assert not {protocol.EXEMPLAR_BOXES, protocol.EXEMPLAR_IDS} & set(text_only)


@pytest.mark.parametrize("status", ["404", "StatusCode.NOT_FOUND"])
def test_an_exemplar_miss_is_its_own_error_and_is_not_retried_with_pixels(status):
    """An image miss makes the client resend the image; an exemplar miss cannot be cured so
    (the exemplar was drawn on another image), so it has its own code and error."""
    from tritonclient.utils import InferenceServerException

    from triton_sam.client.concept_session import ConceptSession
    from triton_sam.client.wire_errors import translate_error
    from triton_sam.errors import EmbeddingNotFoundError, ExemplarNotFoundError

    miss = concept_exemplars.ExemplarMiss("exemplar_ids[0]: 'x' is not held")
    assert miss.code == envelope.ERR_EXEMPLAR_NOT_FOUND
    assert envelope.ERROR_STATUS[miss.code] == "NOT_FOUND"
    wire = InferenceServerException(msg=envelope.error_message(miss.code, str(miss)), status=status)
    error = translate_error(wire, what="infer on sam3_concept")
    assert isinstance(error, ExemplarNotFoundError)
    assert not isinstance(error, EmbeddingNotFoundError) and "boxes" in str(error)

    sent = []

    class _Transport:
        def infer(self, model, inputs, outputs, idempotent):
            sent.append(sorted(inputs))
            raise error

    session = ConceptSession(_Transport(), "sam3_concept")
    session.image = types.SimpleNamespace(predict_inputs=lambda phrases, **kw: {"image_id": 1})
    with pytest.raises(ExemplarNotFoundError):
        session.predict(["cat"], {"exemplar_ids": ["x"]}, "none")
    assert len(sent) == 1  # no second request with the pixels
