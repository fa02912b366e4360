"""Exemplar prompts on the ``sam3_concept`` server from the client and over the wire: the
client's ``predict_concepts(boxes=..., box_labels=..., exemplar_ids=...)``, plain JSON as curl
sends it, and bad boxes refused naming the field with the server staying ready (numbers
against Sam3Model: ``tests/parity/test_sam3_concept_exemplar_parity.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import requests
from concept_wire import raw_infer as _raw

from triton_sam.client import SAM2TritonClient
from triton_sam.errors import ExemplarNotFoundError, InputValidationError, InvalidRequestError
from triton_sam.serving.protocol import concept as protocol

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(600)]

IMAGE_A = np.random.default_rng(31).integers(0, 256, (48, 64, 3), dtype=np.uint8)
IMAGE_B = np.random.default_rng(32).integers(0, 256, (40, 56, 3), dtype=np.uint8)
BOXES = [[4.0, 6.0, 30.0, 40.0], [35.0, 2.0, 60.0, 20.0]]


def test_client_keeps_an_exemplar_and_applies_it_to_another_image(concept_server):
    with SAM2TritonClient(concept_server.grpc_url, model_type="sam3_concept", protocol="grpc") as c:
        c.set_image(IMAGE_A)
        with pytest.raises(InputValidationError) as raised:  # refused before sending
            c.predict_concepts("cat", boxes=[BOXES[0], [10, 10, 5, 20]])
        assert raised.value.field == "boxes[1]"
        none = {"threshold": 0.0, "mask_format": "none"}  # every query, no 200 masks to encode
        first = c.predict_concepts("cat", boxes=BOXES, box_labels=[1, 0], **none)
        assert first.exemplar_id and len(first) == 200  # threshold 0: every query
        alone = c.predict_concepts(boxes=BOXES, threshold=0.0, max_instances=3, mask_format="none")
        assert alone.phrases == (protocol.EXEMPLAR_ONLY_PHRASE,) and len(alone) == 3
        assert alone.exemplar_id not in (None, first.exemplar_id)
        c.set_image(IMAGE_B)
        on_b = c.predict_concepts("cat", exemplar_ids=[first.exemplar_id], **none)
        assert on_b.exemplar_id is None and on_b.image_size == (40, 56) and len(on_b) == 200
        text_only = c.predict_concepts("cat", **none)
        assert np.abs(text_only.scores - on_b.scores).max() > 1e-3  # the exemplar counts
        with pytest.raises(ExemplarNotFoundError, match=r"exemplar_ids\[0\]"):
            c.predict_concepts("cat", exemplar_ids=["A" * 22])


@pytest.mark.parametrize("protocol_name", ["http", "grpc"])
def test_bad_boxes_are_refused_naming_the_field_and_the_server_stays_ready(
    concept_server, protocol_name
):
    image = {"image": IMAGE_A[None], "text": np.array([[b"cat"]], dtype=np.object_)}
    for boxes, message in (
        ([BOXES[0], [10, 10, 5, 20]], r"exemplar_boxes\[1\]: \(10, 10, 5, 20\) is empty"),
        ([[0, 0, 65, 10]], r"exemplar_boxes\[0\]: .* is outside the image"),
        ([[np.nan, 0, 5, 10]], r"exemplar_boxes\[0\]: .* is not finite"),
        ([BOXES[0]] * 17, r"exemplar_boxes: shape \[17, 4\]"),
    ):
        request = image | {"exemplar_boxes": np.array([boxes], np.float32)}
        with pytest.raises(InvalidRequestError, match=message):
            _raw(concept_server, protocol_name, request)
    good = _raw(
        concept_server, protocol_name, image | {"exemplar_boxes": np.array([BOXES], np.float32)}
    )
    assert good["num_instances"].shape == (1, 1)


def test_plain_json_with_boxes_as_curl_sends_it(concept_server):
    url = f"{concept_server.http_url}/v2/models/{protocol.MODEL}/infer"
    body = {
        "inputs": [
            {"name": "image", "shape": [1, *IMAGE_A.shape], "datatype": "UINT8",
             "data": IMAGE_A.reshape(-1).tolist()},
            {"name": "exemplar_boxes", "shape": [1, 2, 4], "datatype": "FP32",
             "data": np.ravel(BOXES).tolist()},
            {"name": "exemplar_labels", "shape": [1, 2], "datatype": "INT32", "data": [1, 0]},
            {"name": "max_instances", "shape": [1, 1], "datatype": "INT32", "data": [2]},
            {"name": "threshold", "shape": [1, 1], "datatype": "FP32", "data": [0.0]},
        ],
        "outputs": [{"name": n} for n in ("exemplar_id", "num_instances", "scores", "boxes")],
    }  # fmt: skip
    response = requests.post(url, json=body)
    assert response.status_code == 200, response.text
    out = {o["name"]: o["data"] for o in response.json()["outputs"]}
    assert out["num_instances"] == [2] and len(out["boxes"]) == 8
    [exemplar_id] = out["exemplar_id"]
    on_b = {
        "inputs": [
            {"name": "image", "shape": [1, *IMAGE_B.shape], "datatype": "UINT8",
             "data": IMAGE_B.reshape(-1).tolist()},
            {"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["cat"]},
            {"name": "exemplar_ids", "shape": [1, 1], "datatype": "BYTES", "data": [exemplar_id]},
        ],
        "outputs": [{"name": "num_instances"}],
    }  # fmt: skip
    response = requests.post(url, json=on_b)
    assert response.status_code == 200, response.text
    bad = dict(body, inputs=[*body["inputs"][:1], {**body["inputs"][1], "data": [4, 6, 3, 40] * 2}])
    response = requests.post(url, json=bad)
    assert response.status_code == 400 and "exemplar_boxes[0]" in response.json()["error"]
