"""The session model's store: crops of an everything job live in an area of their own, so they
never evict the images a user is clicking on (``serving/embedding_cache/store.py``)."""

from __future__ import annotations

import pytest

from triton_sam.serving.embedding_cache.requests import Inputs
from triton_sam.serving.embedding_cache.store import EmbeddingCache, EmbeddingMiss, Scoped
from triton_sam.serving.protocol import ProtocolError
from triton_sam.serving.protocol import embedding_cache as protocol


def _user(name, tenant="t"):
    return Scoped(tenant, name)


def test_crops_never_evict_a_users_images():
    cache = EmbeddingCache(max_images=2, max_bytes=100)
    mine = [_user("a"), _user("b")]
    for scoped in mine:
        cache.put(scoped, {"f": scoped.image_id}, 50)
    evicted = []
    for i in range(3 * protocol.CROP_AREA_IMAGES):  # a layer-2 job's worth of crops
        evicted += cache.put(_user(f"crop{i}"), {}, 50, crop=True)
    assert all(k.image_id.startswith("crop") for k in evicted)
    assert cache.ids() == mine and all(cache.get(s)["f"] == s.image_id for s in mine)


def test_the_crop_area_is_bounded_and_keeps_the_newest_crops():
    cache = EmbeddingCache(max_images=16)
    crops = [_user(f"crop{i}") for i in range(protocol.CROP_AREA_IMAGES + 3)]
    for scoped in crops:
        cache.put(scoped, {}, 10, hw=(4, 4), crop=True)
    assert cache.ids(crops=True) == crops[-protocol.CROP_AREA_IMAGES :]
    assert len(cache) == protocol.CROP_AREA_IMAGES and cache.nbytes == 10 * len(cache)
    assert cache.evictions == 3 and cache.ids() == []
    with pytest.raises(EmbeddingMiss):
        cache.get(crops[0])
    assert cache.original_size(crops[-1]) == (4, 4)  # a held crop answers like an image


def test_crops_are_tenant_scoped():
    cache = EmbeddingCache(max_images=4)
    cache.put(_user("c", tenant="x"), {}, 10, crop=True)
    assert _user("c", tenant="x") in cache and _user("c", tenant="y") not in cache


def test_a_users_embed_of_a_held_crop_moves_it_to_the_images_and_a_crop_embed_does_not():
    cache = EmbeddingCache(max_images=4)
    crop = _user("c")
    cache.put(crop, {"f": 1}, 10, crop=True)
    entry, evicted = cache.hit(crop, crop=True)  # a crop embed again: stays a crop
    assert entry.features == {"f": 1} and evicted == [] and cache.ids(crops=True) == [crop]
    entry, evicted = cache.hit(crop)  # the user embeds that very picture: no encoder run
    assert entry.features == {"f": 1} and cache.ids() == [crop] and cache.ids(crops=True) == []
    assert cache.nbytes == 10 and len(cache) == 1
    assert cache.hit(_user("never")) == (None, [])


def test_a_crop_embed_of_a_users_image_finds_it_where_it_is():
    cache = EmbeddingCache(max_images=4)
    image = _user("a")
    cache.put(image, {"f": 1}, 10)
    entry, _ = cache.hit(image, crop=True)
    assert entry.features == {"f": 1} and cache.ids() == [image] and cache.ids(crops=True) == []


class _Request:
    def __init__(self, parameters):
        self._parameters = parameters

    def parameters(self):
        return self._parameters


def test_the_cache_area_is_a_request_parameter_with_two_values():
    def area(parameters):
        return Inputs(None, _Request(parameters)).cache_area()

    assert area("") == area("{}") == protocol.IMAGES_AREA
    assert area('{"triton-sam-tenant": "x"}') == protocol.IMAGES_AREA
    assert area('{"cache_area": "crops"}') == protocol.CROPS_AREA
    with pytest.raises(ProtocolError, match="cache_area: got 'disk', expected one of") as info:
        area('{"cache_area": "disk"}')
    assert info.value.code == "InvalidInput" and info.value.field == protocol.CACHE_AREA
