"""Clicks on held tiles go straight to the session model (client/large_clicks.py), and their
answers are the large model's to the bit.

The transport here serves both models without Triton: ``<family>_large`` is the server's
own ``Service`` (serving/large/service.py) over the stand-in session model of
tests/large_stand_in.py (a "SAM" that segments bright pixels), and ``<family>_session`` is
that same stand-in, so a click the client answers itself can be compared with the answer the
large model gives to the same click.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from large_stand_in import Session
from large_support import client_over

from triton_sam.errors import EmbeddingNotFoundError
from triton_sam.serving import protocol as envelope
from triton_sam.serving.large import service
from triton_sam.serving.protocol import embedding_cache as session_protocol
from triton_sam.serving.protocol.large import LargeSettings

TILE, HALO = 64, 16


class Fp32Session(Session):
    """The stand-in with its scores as the session model's FP32 output carries them (over
    BLS to the large model, or over the wire to the client)."""

    async def predict(self, *args):
        return [(c, float(np.float32(s))) for c, s in await super().predict(*args)]


class TwoModels:
    """A transport to ``sam2_large`` (the real service) and ``sam2_session`` (the stand-in)."""

    def __init__(self, tmp_path):
        self.session = Fp32Session()
        pools = ThreadPoolExecutor(2), ThreadPoolExecutor(2)
        settings = LargeSettings(
            family="sam2", session_model="sam2_session", spool_dir=str(tmp_path)
        )
        self.large = service.Service(settings, self.session, clicks=pools[0], background=pools[1])
        self.models: list[str] = []
        self.routing_keys: set[str | None] = set()

    def infer(self, model, inputs, outputs, *, idempotent=False, routing_key=None):
        self.models.append(model)
        self.routing_keys.add(routing_key)
        if model == "sam2_large":
            blob = bytes(inputs["request"][0])
            pixels = next((inputs[n] for n in ("pixels",) if n in inputs), None)
            answer = asyncio.run(self.large.answer("", blob, pixels))
            return {"answer": np.array([json.dumps(answer).encode()], dtype=np.object_)}
        assert model == "sam2_session"
        assert tuple(outputs) == (session_protocol.MASKS_RLE, session_protocol.MASK_SCORES)
        image_id = inputs[session_protocol.IMAGE_ID].reshape(-1)[0].decode()
        points = inputs.get(session_protocol.POINTS)
        labels = inputs.get(session_protocol.LABELS)
        box = inputs.get(session_protocol.BOX)
        multimask = bool(inputs[session_protocol.MULTIMASK].reshape(-1)[0])
        try:
            found = asyncio.run(
                self.session.predict(
                    "",
                    image_id,
                    None if points is None else points[0],
                    None if labels is None else labels[0],
                    None if box is None else box[0],
                    multimask,
                )
            )
        except envelope.ProtocolError as e:
            raise EmbeddingNotFoundError(str(e)) from e
        counts = np.array([c for c, _ in found], dtype=np.object_)
        scores = np.array([s for _, s in found], np.float32)
        return {session_protocol.MASKS_RLE: counts, session_protocol.MASK_SCORES: scores}

    def reconnect(self):
        pass

    def close(self):
        pass


def image_with_squares():
    image = np.zeros((160, 200), np.uint8)
    image[70:80, 75:85] = 200  # inside tile (1, 1)'s core
    image[30:90, 120:160] = 200  # crosses the top edge of tile (1, 2)'s block (row 48)
    return image


@pytest.fixture
def opened(tmp_path):
    models = TwoModels(tmp_path)
    client = client_over(models)
    image = client.open_array(image_with_squares(), tile=TILE, halo=HALO, progress=False)
    models.models.clear()
    return models, image


def large_answer(models, image, **fields):
    """What the large model answers for ``fields``, asked directly."""
    body = {"op": "predict", "handle": image.handle, **fields}
    return asyncio.run(models.large.answer("", json.dumps(body).encode(), None))


@pytest.mark.parametrize(
    "prompt",
    [
        {"point_coords": [[80, 75]], "point_labels": [1]},
        {"point_coords": [[80, 75], [78, 72], [150, 70]], "point_labels": [1, 0, 1]},  # 1 out
        {"box": [70, 66, 90, 84]},
        {"box": [70, 66, 90, 84], "point_coords": [[80, 75]], "point_labels": [1]},
    ],
)
@pytest.mark.parametrize("multimask", [False, True])
def test_a_click_on_a_held_tile_is_the_large_models_answer_from_the_session_model(
    opened, prompt, multimask
):
    models, image = opened
    first = image.predict([[78, 74]], [1], mode="tile")  # embeds the tile, learns its id
    assert models.models == ["sam2_large"] and image.last_answer.embedded == 1
    ours = image.predict(**prompt, multimask_output=multimask, mode="tile")
    assert models.models == ["sam2_large", "sam2_session"]  # no large model this time
    assert len(models.routing_keys) == 1  # both went where the image lives
    fields = {"mode": "tile", "multimask_output": multimask}
    if "point_coords" in prompt:
        fields |= {"points": prompt["point_coords"], "labels": prompt["point_labels"]}
    if "box" in prompt:
        fields["box"] = prompt["box"]
    expected = large_answer(models, image, **fields)
    assert [m.to_json() for m in ours] == expected["masks"]
    assert image.last_answer.tiles == tuple(expected["tiles"]) and first


def test_auto_goes_to_the_large_model_when_the_tiles_mask_is_cut(opened):
    models, image = opened
    image.predict([[140, 70]], [1], mode="tile")  # the crossing square's tile is held now
    models.models.clear()
    masks = image.predict([[140, 70]], [1])  # auto: the tile's mask is cut, a window answers
    assert models.models == ["sam2_session", "sam2_large"]
    assert image.last_answer.mode == "window" and not masks[0].cut
    assert masks[0].area == int((image_with_squares() > 127).sum())  # the stand-in's "object"


def test_an_evicted_tile_is_forgotten_and_the_large_model_embeds_it_again(opened):
    models, image = opened
    image.predict([[80, 75]], [1], mode="tile")
    models.session.forget()  # the session model evicted it (or restarted)
    models.models.clear()
    image.predict([[80, 75]], [1], mode="tile")
    assert models.models == ["sam2_session", "sam2_large"]
    assert image.last_answer.embedded == 1
    models.models.clear()
    image.predict([[80, 75]], [1], mode="tile")
    assert models.models == ["sam2_session"]  # held again, by its new id


def test_window_clicks_and_unknown_tiles_go_to_the_large_model(opened):
    models, image = opened
    image.predict([[80, 75]], [1], mode="window")
    image.predict([[80, 75]], [1], mode="window")  # a window is never remembered as a tile
    image.predict([[20, 20]], [1], mode="tile")  # a tile never clicked
    assert models.models == ["sam2_large"] * 3
