"""The ``sam3_concept`` model keeps its caches per tenant (no server: its image and phrase
paths driven with a stand-in for ``triton_python_backend_utils`` and a fake BLS)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import types

import numpy as np
import pytest
from pb_stand_in import Tensor as _Tensor

from triton_sam.repository import concept as concept_repo
from triton_sam.serving import cache
from triton_sam.serving.protocol.concept import ConceptSettings

IMAGE = np.random.default_rng(3).integers(0, 256, (24, 32, 3), dtype=np.uint8)


class _Request:
    def __init__(self, **inputs):
        self.inputs = {n: _Tensor(n, v) for n, v in inputs.items()}


@pytest.fixture
def model(monkeypatch):
    pb_utils = sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("pb_utils"))
    monkeypatch.setattr(pb_utils, "Tensor", _Tensor, raising=False)
    monkeypatch.setattr(
        pb_utils,
        "get_input_tensor_by_name",
        lambda request, name: request.inputs.get(name),
        raising=False,
    )
    spec = importlib.util.spec_from_file_location("concept_model", concept_repo.SERVING_SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    instance = module.TritonPythonModel()  # what initialize sets, without a server
    instance.name, instance.on_gpu = "sam3_concept", False
    instance.settings = ConceptSettings(
        vision_model="vision",
        text_model="text",
        decoder_model="decoder",
        feature_names=("f",),
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
    instance.exemplars = module.concept_exemplars.ExemplarStore(4)
    instance.bls_calls = []

    async def bls(model_name, inputs, outputs, *, gpu):
        instance.bls_calls.append(model_name)
        if model_name == "vision":
            return types.SimpleNamespace(output_tensors=lambda: [_Tensor("f", np.ones(2))])
        count = len(inputs[0].as_numpy())
        features = _Tensor("text_features", np.zeros((count, 32, 4), np.float32))
        return types.SimpleNamespace(features=features)

    instance._bls = bls
    monkeypatch.setattr(
        pb_utils, "get_output_tensor_by_name", lambda r, name: r.features, raising=False
    )
    return module, instance


def test_another_tenants_image_is_a_miss_and_is_encoded_again(model):
    module, instance = model
    pixels = _Request(image=IMAGE[None])

    def image(request, tenant):
        return asyncio.run(instance._image(request, {}, tenant))

    image_id, encoded, _ = image(pixels, "team-y")
    assert encoded == 1
    by_id = _Request(image_id=np.array([[image_id.encode()]], dtype=np.object_))
    with pytest.raises(module.ImageMiss):
        image(by_id, "team-x")
    with pytest.raises(module.ImageMiss):
        image(by_id, "")  # the default tenant too
    assert image(by_id, "team-y")[:2] == (image_id, 0)  # the same tenant shares it
    assert image(pixels, "team-x")[:2] == (image_id, 1)  # encoded again: nothing tells
    assert instance.bls_calls == ["vision", "vision"]


def test_phrase_features_are_cached_per_tenant(model):
    _, instance = model
    ids = np.zeros((1, 32), np.int64)
    ids[0, :3] = (49406, 320, 49407)
    mask = (ids > 0).astype(np.int64)
    for tenant in ("team-y", "team-y", "team-x"):
        asyncio.run(instance._text(ids, mask, tenant))
    assert instance.bls_calls == ["text", "text"]  # once per tenant
