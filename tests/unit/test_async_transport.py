"""The async transport's wire format and error translation (no server)."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request

from triton_sam.client.async_transport import AsyncTransport, encode_infer_request
from triton_sam.client.transport import Endpoint, build_infer_inputs, translate_error
from triton_sam.errors import (
    InferenceTimeoutError,
    InvalidRequestError,
    RequestCancelledError,
    ServerError,
    ServerUnavailableError,
)

RNG = np.random.default_rng(0)
EMBEDDINGS = {
    "image_embed": RNG.standard_normal((1, 8, 4, 4)).astype(np.float32),
    "high_res_feats_0": RNG.standard_normal((1, 2, 8, 8)).astype(np.float32),
}
PROMPTS = {
    "point_coords": np.array([[[10.0, 20.0], [0.0, 0.0]]], np.float32),
    "point_labels": np.array([[1.0, -1.0]], np.float32),
}


def test_prepared_embeddings_plus_prompts_is_the_request_tritonclient_would_send():
    """Protobuf concatenation = merge: the prepared fragment's inputs come first, then the
    request's, each paired with its raw contents, exactly as tritonclient builds it."""
    wire = encode_infer_request(EMBEDDINGS) + encode_infer_request(
        PROMPTS, model="sam2_decoder", outputs=["masks", "iou_predictions"], request_id="r7"
    )
    ours = service_pb2.ModelInferRequest.FromString(wire)
    reference = _get_inference_request(
        model_name="sam2_decoder",
        inputs=build_infer_inputs(grpcclient, {**EMBEDDINGS, **PROMPTS}, http=False),
        model_version="",
        request_id="r7",
        outputs=[grpcclient.InferRequestedOutput(n) for n in ("masks", "iou_predictions")],
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=None,
    )
    assert ours == reference
    names = [t.name for t in ours.inputs]
    assert names == [*EMBEDDINGS, *PROMPTS]
    for tensor, raw in zip(ours.inputs, ours.raw_input_contents, strict=True):
        expected = {**EMBEDDINGS, **PROMPTS}[tensor.name]
        assert list(tensor.shape) == list(expected.shape) and tensor.datatype == "FP32"
        np.testing.assert_array_equal(np.frombuffer(raw, np.float32), expected.ravel())


def test_non_contiguous_arrays_are_sent_in_logical_order():
    a = np.arange(12, dtype=np.float32).reshape(3, 4).T  # Fortran-ordered view
    request = service_pb2.ModelInferRequest.FromString(encode_infer_request({"a": a}))
    np.testing.assert_array_equal(
        np.frombuffer(request.raw_input_contents[0], np.float32), a.ravel()
    )


def test_grpc_transport_prepares_a_wire_fragment_and_http_infer_inputs():
    async def main():
        grpc_t = AsyncTransport(Endpoint("localhost:1", "grpc", False))
        http_t = AsyncTransport(Endpoint("localhost:1", "http", False))
        try:
            assert grpc_t.prepare_inputs(EMBEDDINGS).wire == encode_infer_request(EMBEDDINGS)
            prepared = http_t.prepare_inputs(EMBEDDINGS)
            assert prepared.wire is None and len(prepared.infer_inputs) == 2
            assert not await grpc_t.is_server_ready()  # nothing listens on port 1
            with pytest.raises(ServerUnavailableError):
                await grpc_t.infer("m", PROMPTS, ["masks"])
        finally:
            await grpc_t.close()
            await http_t.close()

    asyncio.run(main())


class _RpcError(grpc.RpcError):
    """What grpc.aio raises (AioRpcError has code() and details())."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    "code, expected",
    [
        (grpc.StatusCode.DEADLINE_EXCEEDED, InferenceTimeoutError),
        (grpc.StatusCode.CANCELLED, RequestCancelledError),
        (grpc.StatusCode.UNAVAILABLE, ServerUnavailableError),
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidRequestError),
        (grpc.StatusCode.INTERNAL, ServerError),
    ],
)
def test_raw_grpc_errors_go_through_the_one_translator(code, expected):
    err = translate_error(_RpcError(code, "details here"), what="infer on m")
    assert type(err) is expected and "details here" in str(err) and "infer on m" in str(err)


def test_asyncio_timeouts_are_timeouts():
    assert isinstance(translate_error(asyncio.TimeoutError(), what="w"), InferenceTimeoutError)


def test_the_asyncio_transport_shows_each_request_to_its_hook_and_sends_its_headers():
    """Both transports are one ``wire.Link``: the asyncio one counts bytes as the blocking one."""
    from triton_sam.client import wire

    sent: list[dict] = []

    class Result:
        def as_numpy(self, name):
            return np.zeros(1, np.float32)

    class Client:
        async def infer(self, model, inputs, **kwargs):
            sent.append(kwargs["headers"])
            return Result()

        async def close(self):
            pass

    async def main():
        counter = wire.SentBytes()
        endpoint = Endpoint("localhost:1", "http", False)
        transport = AsyncTransport(endpoint, headers={"x-tenant": "a"}, on_request=counter)
        await transport.close()  # the aiohttp session it opened; requests go to Client
        transport._client = Client()
        await transport.infer("sam2_decoder", PROMPTS, ["masks"])
        await transport.close()
        return counter.last

    assert asyncio.run(main()) == wire.request_bytes("http", "sam2_decoder", PROMPTS, ["masks"])
    assert sent == [{"x-tenant": "a"}]
