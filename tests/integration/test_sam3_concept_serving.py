"""The ``sam3_concept`` serving model as an untrusting server: raw requests bypassing the client.

Every bad request gets INVALID_ARG (HTTP 400 / gRPC INVALID_ARGUMENT) with a message naming
the field, the server stays ready, and the next good request works. Also: ids are computed
by the server (a hint never binds pixels to another id), an image is sent once, an evicted
image is resent transparently, and plain JSON (what curl sends) works.
"""

from __future__ import annotations

import numpy as np
import pytest
import requests
from concept_wire import raw_infer as _raw

from triton_sam.client import SAM2TritonClient
from triton_sam.errors import EmbeddingNotFoundError, InputValidationError, InvalidRequestError
from triton_sam.serving import images, masks
from triton_sam.serving.protocol import concept as protocol

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(900)]

MODEL = protocol.MODEL


def _rgb(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


IMAGE = _rgb(61, 83, 0)


def _text(*phrases: bytes) -> np.ndarray:
    return np.array([list(phrases)], dtype=np.object_)


BAD_REQUESTS = {
    "empty phrase": ({"text": _text(b"")}, r"text\[0\]: empty"),
    "blank phrase": ({"text": _text(b"cat", b"   ")}, r"text\[1\]: empty"),
    "33+ tokens": (
        {"text": _text(b"a " * 40)},
        r"text: phrase 0 .* 42 tokens, expected at most 32",
    ),
    "not UTF-8": ({"text": _text(b"cat", b"\xff\xfe dog")}, r"text\[1\]: not valid UTF-8"),
    "10,000 phrases": (
        {"text": np.array([[b"cat"] * 10_000], dtype=np.object_)},
        r"text: got 10000 phrases, expected 1 to 16",
    ),
    "huge phrase": ({"text": _text(b"x" * 5000)}, r"text\[0\]: 5000 bytes, expected at most 1024"),
    "threshold NaN": (
        {"text": _text(b"cat"), "threshold": np.array([[np.nan]], np.float32)},
        r"threshold: got nan, expected a number in \[0, 1\]",
    ),
    "threshold > 1": (
        {"text": _text(b"cat"), "threshold": np.array([[1.5]], np.float32)},
        r"threshold: got 1.5",
    ),
    "max_instances 0": (
        {"text": _text(b"cat"), "max_instances": np.array([[0]], np.int32)},
        r"max_instances: got 0, expected a number in \[1, 200\]",
    ),
    "two images": ({"image": np.stack([IMAGE, IMAGE])}, r"image: batch 2, expected 1"),
    "too many pixels": ({"image": _rgb(1001, 1000, 1)[None]}, r"image: 1000x1001 = 1001000"),
    "four channels": ({"image": np.zeros((1, 8, 8, 4), np.uint8)}, r"image|unexpected shape"),
    "no image at all": ({"text": _text(b"cat")}, r"image: missing"),
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
@pytest.mark.parametrize("protocol_name", ["http", "grpc"])
def test_bad_request_is_refused_naming_the_field_and_the_server_stays_ready(
    concept_server, protocol_name, name
):
    inputs, message = BAD_REQUESTS[name]
    if "image" not in inputs and name != "no image at all":
        inputs = {"image": IMAGE[None], **inputs}
    with pytest.raises(InvalidRequestError, match=message):
        _raw(concept_server, protocol_name, inputs)
    good = _raw(concept_server, protocol_name, {"image": IMAGE[None], "text": _text(b"cat")})
    assert good["num_instances"].shape == (1, 1)


def test_unknown_image_id_is_a_typed_miss(concept_server):
    with pytest.raises(EmbeddingNotFoundError, match="not cached on this server"):
        _raw(concept_server, "grpc", {"image_id": _text(b"0" * 32), "text": _text(b"cat")})


def test_the_server_computes_the_id_a_hint_never_binds_other_pixels(concept_server):
    other = _rgb(40, 50, 7)
    other_id = images.image_id(other, protocol.image_namespace(MODEL))
    # Pixels of IMAGE sent with OTHER's id as a hint: the features go under IMAGE's id.
    out = _raw(
        concept_server,
        "http",
        {"image": IMAGE[None], "image_id": _text(other_id.encode())},
        outputs=("image_id",),
    )
    served = bytes(out["image_id"].reshape(-1)[0]).decode()
    assert served == images.image_id(IMAGE, protocol.image_namespace(MODEL)) != other_id
    with pytest.raises(EmbeddingNotFoundError):  # OTHER was never sent: still unknown
        _raw(concept_server, "http", {"image_id": _text(other_id.encode()), "text": _text(b"a")})


def test_an_image_is_sent_once_and_an_evicted_one_resent_transparently(concept_server):
    with SAM2TritonClient(concept_server.grpc_url, model_type="sam3_concept", protocol="grpc") as c:
        c.set_image(IMAGE)
        first = c.predict_concepts("cat", threshold=0.5)
        c.set_image(IMAGE)  # the server holds it: a probe of the id only
        assert c.last_request_bytes < 200
        assert c.predict_concepts("cat", threshold=0.5).query_index.tolist() == (
            first.query_index.tolist()
        )
        for seed in (11, 12):  # the test repository keeps 2 images: IMAGE is evicted
            c.set_image(_rgb(30, 40, seed))
        c.set_image(IMAGE)  # probe misses, pixels sent again
        again = c.predict_concepts("cat", threshold=0.5)
        np.testing.assert_array_equal(again.query_index, first.query_index)
        np.testing.assert_array_equal(again.masks, first.masks)


def test_client_checks_before_sending(concept_server):
    with SAM2TritonClient(concept_server.http_url, model_type="sam3_concept") as c:
        c.set_image(IMAGE)
        for kwargs, field in (
            ({"text": ""}, "text"),
            ({"text": ["cat"] * 17}, "text"),
            ({"text": "cat", "threshold": 2}, "threshold"),
            ({"text": "cat", "max_instances": 0}, "max_instances"),
            ({"text": "cat", "mask_format": "jpeg"}, "mask_format"),
        ):
            with pytest.raises(InputValidationError) as raised:
                c.predict_concepts(**kwargs)
            assert raised.value.field == field


def test_plain_json_as_curl_sends_it(concept_server):
    """KServe v2 JSON, no binary extension: what `curl -d @request.json` posts."""
    body = {
        "inputs": [
            {"name": "image", "shape": [1, *IMAGE.shape], "datatype": "UINT8",
             "data": IMAGE.reshape(-1).tolist()},
            {"name": "text", "shape": [1, 2], "datatype": "BYTES", "data": ["cat", "red car"]},
            {"name": "threshold", "shape": [1, 1], "datatype": "FP32", "data": [0.5]},
        ],
        "outputs": [{"name": n} for n in ("num_instances", "scores", "boxes", "masks_rle")],
    }  # fmt: skip
    response = requests.post(f"{concept_server.http_url}/v2/models/{MODEL}/infer", json=body)
    assert response.status_code == 200, response.text
    out = {o["name"]: o for o in response.json()["outputs"]}
    k = sum(out["num_instances"]["data"])
    assert len(out["scores"]["data"]) == k and len(out["masks_rle"]["data"]) == k
    if k:  # a COCO RLE string: decodes to a mask of the image's size
        mask = masks.decode_rle(out["masks_rle"]["data"][0], IMAGE.shape[:2])
        assert mask.shape == IMAGE.shape[:2]
    bad = dict(body, inputs=[body["inputs"][0], {**body["inputs"][1], "data": ["", "cat"]}])
    response = requests.post(f"{concept_server.http_url}/v2/models/{MODEL}/infer", json=bad)
    assert response.status_code == 400 and "text[0]: empty" in response.json()["error"]
