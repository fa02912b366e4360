"""The session model wired end to end without Triton: a stand-in ``pb_utils`` whose encoder
and decoder are numpy functions, driven through ``initialize`` / ``execute`` as Triton does.

The live model is tested in tests/integration/test_session_model.py; this catches the wiring
of its parts (settings, store, requests, embedder, predictor, answers) in a second."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import types

import numpy as np
import pytest
from pb_stand_in import Tensor

from triton_sam.models import get_family
from triton_sam.repository.config import RepositoryOptions
from triton_sam.repository.session_config import SESSION_SOURCE, build_session_config
from triton_sam.serving import protocol as envelope
from triton_sam.serving.protocol import embedding_cache as protocol

SAM2 = get_family("sam2")


class Response:
    def __init__(self, output_tensors=(), error=None):
        self.outputs = {t.name(): t for t in output_tensors}
        self.error_ = error

    def has_error(self):
        return self.error_ is not None

    def error(self):
        return self.error_


class TritonError:
    def __init__(self, message, code=None):
        self._message = message

    def message(self):
        return self._message


def _bls(calls):
    class InferenceRequest:
        def __init__(self, model_name, inputs, requested_output_names, **kwargs):
            self.model, self.inputs, self.names = model_name, inputs, requested_output_names

        async def async_exec(self):
            calls.append(self.model)
            if self.model == SAM2.encoder_model:
                shapes = {t.name: t.shape for t in SAM2.encoder_outputs}
                return Response([Tensor(n, np.ones(shapes[n], np.float32)) for n in self.names])
            return Response(
                [Tensor("masks", np.full((1, 1, 256, 256), 50.0, np.float32))]
                + [Tensor("iou_predictions", np.ones((1, 1), np.float32))]
            )

    return InferenceRequest


def _pb_utils(calls):
    return types.SimpleNamespace(
        Tensor=Tensor,
        InferenceResponse=Response,
        TritonError=TritonError,
        InferenceRequest=_bls(calls),
        TRITONSERVER_RESPONSE_COMPLETE_FINAL=1,
        get_input_tensor_by_name=lambda request, name: request.tensors.get(name),
        get_output_tensor_by_name=lambda response, name: response.outputs.get(name),
    )


class Request:
    def __init__(self, tensors, wanted=(), parameters=None):
        self.tensors = {n: Tensor(n, v) for n, v in tensors.items()}
        self.wanted, self._parameters = list(wanted), json.dumps(parameters or {})
        self.answered = threading.Event()

    def inputs(self):
        return list(self.tensors.values())

    def requested_output_names(self):
        return self.wanted

    def parameters(self):
        return self._parameters

    def is_cancelled(self):
        return False

    def get_response_sender(self):
        return self

    def send(self, response, flags):
        self.response = response
        self.answered.set()


@pytest.fixture()
def served(monkeypatch):
    """(model, BLS calls): the session model initialized from the rendered SAM2 config."""
    calls = []
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _pb_utils(calls))
    spec = importlib.util.spec_from_file_location("session_model_wiring", SESSION_SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = build_session_config(SAM2, RepositoryOptions())
    from google.protobuf import json_format

    config_json = json_format.MessageToJson(config, preserving_proto_field_name=True)
    model = module.TritonPythonModel()
    model.initialize({"model_config": config_json, "model_name": "sam2_session"})
    yield model, calls
    model.finalize()


def _answer(model, request):
    model.execute([request])
    assert request.answered.wait(10)
    return request.response


def _image(seed):
    return np.random.default_rng(seed).integers(0, 255, (1, 24, 32, 3), dtype=np.uint8)


def test_embed_probe_and_click_answer_through_the_parts(served):
    model, calls = served
    embed = _answer(model, Request({protocol.IMAGE_RGB: _image(0)}, ["image_id", "encoded"]))
    assert not embed.has_error() and embed.outputs["encoded"].as_numpy().tolist() == [[1]]
    image_id = embed.outputs["image_id"].as_numpy()[0, 0]
    probe = _answer(model, Request({protocol.IMAGE_ID: np.array([[image_id]], object)}))
    assert probe.outputs["encoded"].as_numpy().tolist() == [[0]]
    click = Request(
        {
            protocol.IMAGE_ID: np.array([[image_id]], object),
            protocol.POINTS: np.array([[[10.0, 10.0]]], np.float32),
            protocol.LABELS: np.array([[1]], np.int32),
        },
        [protocol.MASKS_RLE, protocol.IMAGE_SIZE],
    )
    masks = _answer(model, click)
    assert not masks.has_error(), masks.error().message()
    assert masks.outputs[protocol.IMAGE_SIZE].as_numpy().tolist() == [[24, 32]]
    assert calls == [SAM2.encoder_model, SAM2.decoder_model]


def test_a_crop_embed_leaves_the_users_images_in_place(served):
    model, _ = served
    _answer(model, Request({protocol.IMAGE_RGB: _image(1)}))
    for seed in range(2, 2 + 2 * protocol.CROP_AREA_IMAGES):
        crop = Request({protocol.IMAGE_RGB: _image(seed)}, parameters=protocol.CROP_EMBED)
        assert not _answer(model, crop).has_error()
    assert len(model.cache.ids()) == 1
    assert len(model.cache.ids(crops=True)) == protocol.CROP_AREA_IMAGES


def test_refusals_answer_the_envelope(served):
    model, _ = served
    missing = _answer(model, Request({protocol.IMAGE_ID: np.array([[b"0" * 32]], object)}))
    assert missing.error().message().startswith("triton_sam.EmbeddingNotFound: image_id")
    nothing = _answer(model, Request({}))
    assert nothing.error().message().startswith("triton_sam.InvalidInput: image_id: missing")
    area = Request({protocol.IMAGE_RGB: _image(0)}, parameters={"cache_area": "disk"})
    assert envelope.error_code(_answer(model, area).error().message()) == "InvalidInput"
