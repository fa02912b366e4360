"""The served ``model.py`` of ``<family>_large`` as the repository writes it, driven through a
stand-in of Triton's ``pb_utils``: requests in, JSON answers or typed errors out through the
response sender, data roots from the environment (the live model:
tests/integration/test_large_images.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import types

import numpy as np
import pytest
from large_stand_in import Datasets, Pixels, Session
from pb_stand_in import Tensor

from triton_sam.models.registry import get_family
from triton_sam.repository.large_config import large_artifact
from triton_sam.repository.writer import write_models
from triton_sam.serving.protocol import large as protocol
from triton_sam.serving.protocol.tenancy import TENANT_HEADER


class _Error:
    INVALID_ARG, NOT_FOUND, INTERNAL, UNAVAILABLE = "INVALID_ARG", "NOT_FOUND", "INTERNAL", "U"

    def __init__(self, message, status=None):
        self._message, self.status = message, status

    def message(self):
        return self._message


class _Response:
    def __init__(self, output_tensors, error=None):
        self.outputs, self.error = output_tensors, error


def _pb_utils():
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor, pb.TritonError, pb.InferenceResponse = Tensor, _Error, _Response
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    pb.get_input_tensor_by_name = lambda request, name: request.inputs.get(name)
    return pb


class _Request:
    def __init__(self, request, pixels=None, tenant=None):
        self.inputs = {protocol.REQUEST: Tensor(protocol.REQUEST, np.array([request], object))}
        if pixels is not None:
            name = protocol.PIXEL_INPUTS[str(pixels.dtype)]
            self.inputs[name] = Tensor(name, pixels)
        self.tenant, self.done, self.answer = tenant, threading.Event(), None

    def parameters(self):
        return json.dumps({TENANT_HEADER: self.tenant} if self.tenant is not None else {})

    def get_response_sender(self):
        request = self

        class Sender:
            def send(self, response, flags=0):
                assert flags == 1  # one response, FINAL
                request.answer = response
                request.done.set()

        return Sender()


@pytest.fixture
def served(tmp_path, monkeypatch):
    """(model instance, stand-in session, stand-in readers) of the written sam2_large."""
    (folder,) = write_models(tmp_path, [large_artifact(get_family("sam2"))])
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _pb_utils())
    spec = importlib.util.spec_from_file_location("large_model_under_test", folder / "1/model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shipped = sys.modules["triton_sam_serving.large.service"]
    readers = Datasets({"sections/a.zarr": np.zeros((40, 40), np.uint8)})
    monkeypatch.setattr(shipped, "pixel_mapping", lambda: Pixels)
    monkeypatch.setattr(shipped, "datasets", lambda: readers)
    roots = json.dumps({"lab": {"path": str(tmp_path)}})
    monkeypatch.setenv(protocol.DATA_ROOTS_ENV, roots)
    model = module.TritonPythonModel()
    config = json.loads(json.dumps({"parameters": {}}))
    text = (folder / "config.pbtxt").read_text()
    for key, value in _parameters(text).items():
        config["parameters"][key] = {"string_value": value}
    model.initialize({"model_config": json.dumps(config), "model_name": "sam2_large"})
    session = Session()
    model.service.session = session
    yield model, session
    model.finalize()
    for name in [n for n in sys.modules if n.startswith("triton_sam_serving")]:
        del sys.modules[name]


def _parameters(text):
    from triton_sam.repository.config import parse_config

    return {k: v.string_value for k, v in parse_config(text).parameters.items()}


def ask(model, request, pixels=None, tenant=None):
    blob = request if isinstance(request, bytes) else json.dumps(request).encode()
    call = _Request(blob, pixels, tenant)
    assert model.execute([call]) is None  # answered through the sender
    assert call.done.wait(10)
    response = call.answer
    if response.error is not None:
        return response.error
    (out,) = response.outputs
    assert out.name() == protocol.ANSWER
    return json.loads(out.as_numpy()[0])


def test_a_created_image_is_put_and_clicked_through_the_model(served):
    model, session = served
    made = ask(model, {"op": "create", "shape": [40, 50], "dtype": "uint16"}, tenant="a")
    assert set(made) == set(protocol.IMAGE_FIELDS) and not made["complete"]
    image = np.zeros((40, 50, 1), np.uint16)
    image[10:20, 10:20] = 200
    put = {"op": "put", "handle": made["handle"], "offset": [0, 0]}
    assert ask(model, put, image, tenant="a") == {"received": 2000, "complete": True}
    click = {"op": "predict", "handle": made["handle"], "points": [[12, 12]], "labels": [1]}
    got = ask(model, click, tenant="a")
    assert got["masks"][0]["area"] == 100 and got["masks"][0]["offset"] == [10, 10]
    assert session.encoded == 1
    miss = ask(model, click, tenant="b")  # another tenant: the handle is not found
    assert miss.status == "NOT_FOUND" and "triton_sam.HandleNotFound" in miss.message()


def test_refusals_are_typed_and_name_the_field(served):
    model, _ = served
    for request, pixels, status, text in (
        (b"{", None, "INVALID_ARG", "triton_sam.InvalidInput: request: not UTF-8 JSON"),
        ({"op": "status"}, None, "INVALID_ARG", "request.handle"),
        ({"op": "close"}, np.zeros((1, 1, 1), np.uint8), "INVALID_ARG", "pixels: given"),
        (b"x" * (protocol.DEFAULT_MAX_REQUEST_BYTES + 1), None, "INVALID_ARG", "request: got"),
    ):
        error = ask(model, request, pixels)
        assert error.status == status and text in error.message()


def test_data_roots_come_from_the_servers_environment(served):
    model, _ = served
    opened = ask(model, {"op": "open", "dataset": "lab/sections/a.zarr"})
    assert opened["shape"] == [40, 40] and opened["complete"]
    refused = ask(model, {"op": "open", "dataset": "elsewhere/sections/a.zarr"})
    assert refused.status == "INVALID_ARG" and "request.dataset" in refused.message()
