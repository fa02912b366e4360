"""The one BLS helper for calls to the session model, and the one error answer of a model."""

from __future__ import annotations

import asyncio
import types

import numpy as np
import pytest

from triton_sam.serving import model_io
from triton_sam.serving import protocol as envelope
from triton_sam.serving.bounds import RequestError
from triton_sam.serving.protocol import tenancy
from triton_sam.serving.session_call import SessionCall, SessionError


class _Response:
    def __init__(self, error=None, outputs=None):
        self._error, self.outputs = error, outputs or {}

    def has_error(self):
        return self._error is not None

    def error(self):
        return types.SimpleNamespace(message=lambda: self._error)


def _pb_utils(response, sent):
    class InferenceRequest:
        def __init__(self, **kwargs):
            sent.append(kwargs)

        def exec(self):
            return response

        async def async_exec(self):
            return response

    class TritonError:
        INVALID_ARG, NOT_FOUND, INTERNAL = "INVALID_ARG", "NOT_FOUND", "INTERNAL"

        def __init__(self, message, code=None):
            self.text, self.code = message, code

    return types.SimpleNamespace(
        InferenceRequest=InferenceRequest,
        TritonError=TritonError,
        InferenceResponse=lambda output_tensors, error: error,
        get_output_tensor_by_name=lambda r, name: r.outputs[name],
    )


def test_a_call_carries_the_tenant_and_extra_parameters_and_returns_outputs_by_name():
    sent = []
    call = SessionCall(_pb_utils(_Response(outputs={"image_id": "t"}), sent), "sam2_session")
    out = call.call("team-a", ["x"], ["image_id"], parameters={"keep": "false"})
    assert out == {"image_id": "t"}
    assert sent[0]["model_name"] == "sam2_session"
    assert sent[0]["parameters"] == {"keep": "false", tenancy.TENANT_HEADER: "team-a"}
    call.call(tenancy.DEFAULT_TENANT, ["x"], ["image_id"])
    assert "parameters" not in sent[1]  # the default tenant sends none


def test_the_session_models_refusal_is_relayed_with_its_code_and_text():
    message = envelope.error_message(envelope.ERR_EMBEDDING_NOT_FOUND, "image_id: 'x' not cached")
    call = SessionCall(_pb_utils(_Response(error=f"[StatusCode.NOT_FOUND] {message}"), []), "s")
    with pytest.raises(SessionError) as raised:
        asyncio.run(call.acall("t", [], ["masks"]))
    assert raised.value.code == envelope.ERR_EMBEDDING_NOT_FOUND
    assert str(raised.value) == "image_id: 'x' not cached"
    other = SessionCall(_pb_utils(_Response(error="model not ready"), []), "sam2_session")
    with pytest.raises(RuntimeError, match="^sam2_session: model not ready$"):
        other.call("t", [], ["masks"])


@pytest.mark.parametrize(
    "error, code, text",
    [
        (RequestError("params", "got 3 bytes"), "InvalidInput", "params: got 3 bytes"),
        (SessionError(envelope.ERR_OVERLOADED, "busy"), "Overloaded", "busy"),
        (KeyError("x"), "Internal", "KeyError: 'x'"),
    ],
)
def test_one_error_answer_for_every_model(error, code, text):
    pb_utils = _pb_utils(None, [])
    answer = model_io.error_answer(pb_utils, error)
    assert answer.text == f"triton_sam.{code}: {text}"
    assert answer.code == getattr(pb_utils.TritonError, envelope.ERROR_STATUS[code], None)


def test_inputs_are_read_one_way():
    tensors = {"image_id": np.array([b"abc"], object), "two": np.array([1, 2])}
    pb_utils = types.SimpleNamespace(
        get_input_tensor_by_name=lambda r, n: (
            types.SimpleNamespace(as_numpy=lambda: tensors[n]) if n in tensors else None
        )
    )
    assert model_io.string(pb_utils, None, "image_id") == "abc"
    assert model_io.one_value(pb_utils, None, "absent") is None
    with pytest.raises(RequestError, match="^two: got 2 values, expected 1$"):
        model_io.one_value(pb_utils, None, "two")
    with pytest.raises(RequestError, match="^text: not valid UTF-8"):
        model_io.utf8(b"\xff", "text")
