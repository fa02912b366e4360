"""The one session flow (client/flow.py) as both clients run it, against a fake session model.

Each test pins a drift the five hand-written copies of the flow had: the sync client's clicks
asked for point-list outputs whatever the family's layout, and read them without
``select_outputs``; the async client's blocking re-embed was not idempotent, so it was never
retried.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import numpy as np
import pytest

from triton_sam.client import connection, embedding_path, flow, prompts
from triton_sam.client import sync as sync_client
from triton_sam.client.speculative import SpeculativeSAM2Client
from triton_sam.client.sync import SAM2TritonClient
from triton_sam.errors import EmbeddingNotFoundError, ServerUnavailableError
from triton_sam.models.registry import get_family
from triton_sam.serving.protocol import embedding_cache

IMAGE = np.zeros((60, 100, 3), np.uint8)


class FakeServer:
    """Encoder, decoder and session model of one family; the session model's cache is a set
    of ids that a test can empty (an eviction)."""

    def __init__(self, family: str) -> None:
        self.family = get_family(family)
        self.held: set[str] = set()
        self.calls: list[dict[str, Any]] = []  # every session-model infer, in order
        self.issued: dict[str, str] = {}  # logits key the server issued -> its image id

    def is_server_ready(self) -> bool:
        return True

    def is_model_ready(self, model: str) -> bool:
        return True

    def model_metadata(self, model: str) -> dict:
        return {"inputs": [{"name": t.name} for t in self.family.decoder_inputs]}

    def infer(self, model: str, inputs: dict, outputs: Any, **options: Any) -> dict:
        assert model == self.family.session_model
        if embedding_cache.IMAGE_RGB in inputs:  # an embed: the server computes the id
            rgb = inputs[embedding_cache.IMAGE_RGB][0]
            self.calls.append({"kind": "embed", "outputs": tuple(outputs), **options})
            image = embedding_path.image_id(rgb, self.family, self.family.encoder_model)
            self.held.add(image)
            return {
                embedding_cache.ENCODED: np.ones((1, 1), np.int32),
                embedding_cache.IMAGE_ID: embedding_path.bytes_tensor(image),
            }
        image = bytes(inputs[embedding_cache.IMAGE_ID].reshape(-1)[0]).decode()
        kind = "probe" if len(inputs) == 1 else "click"
        self.calls.append({"kind": kind, "outputs": tuple(outputs), **options})
        if image not in self.held:
            raise EmbeddingNotFoundError(f"image_id {image!r}: not cached")
        if kind == "probe":
            return {embedding_cache.ENCODED: np.zeros((1, 1), np.int32)}
        previous = inputs.get(embedding_cache.PREVIOUS_KEY)
        self.calls[-1]["previous_key"] = None if previous is None else previous.reshape(-1)[0]
        if previous is not None and self.issued.get(previous.reshape(-1)[0].decode()) != image:
            raise EmbeddingNotFoundError("previous_key: no low-res logits kept under this key")
        known = {t.name for t in self.family.decoder_outputs}
        decoder = [n for n in outputs if n != embedding_cache.LOGITS_KEY]
        assert set(decoder) <= known, f"asked for {outputs}, the decoder has {known}"
        out = {n: self._output(n) for n in decoder}
        if embedding_cache.LOGITS_KEY in outputs:  # the server issues the key, never the client
            key = secrets.token_hex(16)
            self.issued[key] = image
            out[embedding_cache.LOGITS_KEY] = embedding_path.bytes_tensor(key)
        return out

    def _output(self, name: str) -> np.ndarray:
        spec = next(t for t in self.family.decoder_outputs if t.name == name)
        shape = [1, *(3 if d == -1 else d for d in spec.shape)]
        scores = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        return scores


class FakeTransport:
    server: FakeServer

    def __init__(self, endpoint: Any, **options: Any) -> None:
        self.endpoint = endpoint

    def __getattr__(self, name: str) -> Any:
        return getattr(FakeTransport.server, name)

    def close(self) -> None:
        pass


@pytest.fixture
def server(monkeypatch, request):
    FakeTransport.server = FakeServer(request.param)
    monkeypatch.setattr(sync_client, "Transport", FakeTransport)
    monkeypatch.setattr(connection, "Transport", FakeTransport)
    return FakeTransport.server


@pytest.mark.parametrize("server", ["sam3_onnx_community", "sam2"], indirect=True)
def test_sync_clicks_ask_for_the_layouts_outputs_and_select_from_them(server):
    family = server.family
    with SAM2TritonClient("h:8000", model_type=family.family) as client:
        assert client.uses_server_embeddings and client.family is family
        client.set_image(IMAGE)
        masks, scores = client.predict(point_coords=[[10, 10]], point_labels=[1])
    expected = embedding_path.click_outputs(prompts.output_names(False, family), family)
    assert server.calls[-1]["outputs"] == expected
    assert masks.shape == (1, 1, 60, 100) and scores.shape == (1, 1)  # one mask, selected


@pytest.mark.parametrize("server", ["sam2"], indirect=True)
def test_every_session_call_is_idempotent_after_a_miss_in_both_clients(server):
    sync = SAM2TritonClient("h:8000", model_type="sam2")
    sync.set_image(IMAGE)
    speculative = SpeculativeSAM2Client("h:8001", model_type="sam2")
    speculative.set_image(IMAGE)
    for client in (sync, speculative):
        server.held.clear()  # evicted: the click misses, re-embeds and resends
        server.calls.clear()
        predict = getattr(client, "predict_sync", None) or client.predict
        masks, _ = predict([[5, 5]], [1])
        assert [c["kind"] for c in server.calls] == ["click", "embed", "click"]
        assert all(c.get("idempotent") for c in server.calls), server.calls
        assert masks.shape == (1, 1, 60, 100)
    sync.close()
    speculative.close()


@pytest.mark.parametrize("server", ["sam2"], indirect=True)
def test_refinement_names_the_issued_key_and_sends_the_mask_when_it_is_unknown(server):
    sync = SAM2TritonClient("h:8000", model_type="sam2")
    sync.set_image(IMAGE)
    speculative = SpeculativeSAM2Client("h:8001", model_type="sam2")
    speculative.set_image(IMAGE)
    for client in (sync, speculative):
        predict = getattr(client, "predict_full_sync", None) or client.predict_full
        first = predict([[5, 5]], [1])
        assert embedding_cache.LOGITS_KEY in server.calls[-1]["outputs"]
        issued = list(server.issued)[-1]
        mask = first.low_res_logits[0, 0]
        server.calls.clear()
        predict([[5, 5]], [1], mask_input=mask)  # by reference: the key the server issued
        assert [c["kind"] for c in server.calls] == ["click"]
        assert server.calls[0]["previous_key"] == issued.encode()
        server.issued.clear()  # the server lost it (evicted, restarted): the mask goes itself
        server.calls.clear()
        predict([[5, 5]], [1], mask_input=mask)
        assert [c["kind"] for c in server.calls] == ["click", "embed", "click"]
        assert server.calls[-1]["previous_key"] is None
    sync.close()
    speculative.close()


def test_the_runners_throw_errors_into_the_flow_and_return_its_value():
    def steps() -> flow.Flow[str]:
        try:
            yield flow.Step("is_model_ready", ("missing",))
        except ServerUnavailableError:
            answer = yield flow.Step("is_server_ready", ())
            return f"recovered {answer}"
        return "no error"

    def send(step: flow.Step) -> Any:
        if step.args == ("missing",):
            raise ServerUnavailableError("missing")
        return True

    async def asend(step: flow.Step) -> Any:
        return send(step)

    assert flow.run(steps(), send) == "recovered True"
    assert asyncio.run(flow.arun(steps(), asend)) == "recovered True"
