"""The large-image client against the served ``sam2_large`` model, live.

The shared SAM2.1-tiny server (tests/conftest.py, random-init weights) serves ``sam2_large``
beside the session model it embeds tiles through. A 128 x 128 image cut into 2 x 2 tiles of
64 (the protocol's smallest tile, ``MIN_TILE``) with a halo of 16 keeps each encoder run the
usual one image. Checked, with counts the server answers (never times):

- ``open_array`` creates the image and puts it in pieces; the server says it is complete;
- a click in one tile embeds that tile once: the second click on it embeds nothing;
- ``precompute`` embeds every tile, and run again embeds none (it resumes from ``status``);
- a closed handle, or one the server never issued, is ``HandleNotFoundError``.

Random-init weights give noise masks, so the masks are checked for their geometry (inside
the image, crop and area consistent), not their shape. Each test sends its own image
(another seed): the session cache is keyed by content, and a tile another test embedded
would be held already.
"""

from __future__ import annotations

import pytest

from triton_sam import HandleNotFoundError, SAM2TritonClient
from triton_sam.client.large_image import LargeImage
from triton_sam.tools.sample import sample_image

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(600)]

SIDE, TILE, HALO = 128, 64, 16  # 2 x 2 tiles


@pytest.fixture(scope="module")
def client(sam2_tiny_server):
    with SAM2TritonClient(sam2_tiny_server.http_url, model_type="sam2") as c:
        yield c


def _open(client: SAM2TritonClient, seed: int) -> LargeImage:
    image = sample_image(SIDE, SIDE, seed=seed)  # H x W x 3 uint8
    return client.open_array(image, tile=TILE, halo=HALO, piece=48, progress=False)


def test_open_array_sends_the_image_in_pieces(client):
    with _open(client, seed=31) as image:
        assert image.complete and image.shape == (SIDE, SIDE, 3) and image.axes == "yxc"
        assert (image.tile, image.halo, image.grid) == ((TILE, TILE), (HALO, HALO), (2, 2))
        assert image.held_tiles() == set()


def test_a_click_embeds_its_tile_once(client):
    with _open(client, seed=32) as image:
        first = image.predict(point_coords=[[20, 30]], point_labels=[1], mode="tile")
        assert image.last_answer.tiles == (0,) and image.last_answer.embedded == 1
        image.predict(point_coords=[[25, 35]], point_labels=[1], mode="tile")
        assert image.last_answer.embedded == 0  # the tile's features are held
        assert image.held_tiles() == {0}
    [mask] = first
    assert mask.area == int(mask.crop().sum())
    for axis in (0, 1):  # the crop lies inside the image
        assert min(mask.offset[axis], SIDE - mask.offset[axis] - mask.size[axis]) >= 0
    assert mask.dense((SIDE, SIDE)).sum() == mask.area


def test_precompute_embeds_every_tile_and_resumes(client):
    with _open(client, seed=33) as image:
        first = image.precompute(progress=False, batch=3)
        assert (first.tiles, first.embedded, first.held) == (4, 4, 0)
        again = image.precompute(progress=False)
        assert (again.tiles, again.embedded, again.held) == (4, 0, 4)
        image.predict(point_coords=[[100, 100]], point_labels=[1], mode="tile")
        assert image.last_answer.embedded == 0


def test_a_closed_or_unknown_handle_is_not_found(client):
    image = _open(client, seed=34)
    model, handle = image.model, image.handle
    image.close()
    with pytest.raises(HandleNotFoundError, match="open it again"):
        model.call({"op": "status", "handle": handle})  # the server's answer, not ours
    with pytest.raises(HandleNotFoundError):
        model.call({"op": "status", "handle": "0" * 32})
    with pytest.raises(HandleNotFoundError):
        image.predict(point_coords=[[1, 1]], point_labels=[1])
