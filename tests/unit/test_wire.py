"""The wire layer without a server: request sizes as tritonclient builds the requests, the
transport's ``on_request`` hook, and URLs whose scheme names the protocol (the walk of an
image from ``set_image`` down to the wire: test_client_walk.py)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from triton_sam.client import SAM2TritonClient, wire
from triton_sam.client.endpoint import resolve_endpoint
from triton_sam.client.transport import Transport
from triton_sam.client.wire import SentRequest, build_infer_inputs

INPUTS = {
    "image_id": np.array([[b"ab" * 16]], dtype=np.object_),
    "point_coords": np.array([[[10.0, 20.0]]], np.float32),
    "point_labels": np.array([[1.0]], np.float32),
}
OUTPUTS = ("masks", "iou_predictions", "logits_key")


def _tritonclient_grpc_size(model: str) -> int:
    """The size of the message tritonclient itself sends (its request builder, as the client
    used to call it)."""
    import tritonclient.grpc as module
    from tritonclient.grpc import _utils

    inputs = build_infer_inputs(module, INPUTS, http=False)
    outputs = [module.InferRequestedOutput(n) for n in OUTPUTS]
    defaults = {"model_version": "", "request_id": "", "sequence_id": 0, "priority": 0}
    defaults |= {"sequence_start": False, "sequence_end": False}
    defaults |= dict.fromkeys(("timeout", "parameters"))
    request = _utils._get_inference_request(
        model_name=model, inputs=inputs, outputs=outputs, **defaults
    )
    return request.ByteSize()


def test_the_grpc_size_is_the_message_tritonclient_builds():
    assert wire.request_bytes("grpc", "sam2_session", INPUTS, OUTPUTS) == (
        _tritonclient_grpc_size("sam2_session")
    )


def test_the_http_size_is_the_body_tritonclient_builds():
    import tritonclient.http as module

    body, _ = module.InferenceServerClient.generate_request_body(
        build_infer_inputs(module, INPUTS, http=True),
        outputs=[module.InferRequestedOutput(n, binary_data=True) for n in OUTPUTS],
    )
    assert wire.request_bytes("http", "sam2_session", INPUTS, OUTPUTS) == len(body)


def test_a_large_request_counts_its_tensor_bytes():
    inputs = {"image": np.zeros((1, 3, 1024, 1024), np.float32)}
    assert wire.request_bytes("grpc", "sam2_encoder", inputs, ("image_embed",)) == 3 * 4 * 2**20


class _Result:
    def as_numpy(self, name: str) -> np.ndarray:
        return np.zeros(1, np.float32)


class _Conn:
    def infer(self, *args, **kwargs):
        return _Result()

    def close(self) -> None:
        pass


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_transport_hands_each_request_to_its_hook(protocol, monkeypatch):
    monkeypatch.setattr(Transport, "_connect", lambda self: _Conn())
    seen: list[SentRequest] = []
    transport = Transport(resolve_endpoint("h", protocol), on_request=seen.append)
    transport.infer("sam2_session", INPUTS, OUTPUTS)
    size = wire.request_bytes(protocol, "sam2_session", INPUTS, OUTPUTS)
    assert seen == [SentRequest(protocol, "sam2_session", size)]


def test_both_transports_send_their_headers_with_the_routing_header(monkeypatch):
    """Both transports are one :class:`wire.Link`: the same settings, headers and hook."""
    sent: list[dict] = []

    class Conn(_Conn):
        def infer(self, *args, **kwargs):
            sent.append(kwargs["headers"])
            return _Result()

    monkeypatch.setattr(Transport, "_connect", lambda self: Conn())
    counter = wire.SentBytes()
    endpoint = resolve_endpoint("h", "grpc")
    transport = Transport(endpoint, headers={"x-tenant": "a"}, on_request=counter)
    transport.infer("sam2_session", INPUTS, OUTPUTS)
    assert sent == [{"x-tenant": "a", "x-sam-image-id": "ab" * 16}]
    assert counter.last == wire.request_bytes("grpc", "sam2_session", INPUTS, OUTPUTS)
    assert transport.request_headers({}) == {"x-tenant": "a"}
    assert Transport(endpoint).request_headers({}) is None


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("scheme, ssl", [("grpc://", False), ("grpcs://", True)])
def test_a_grpc_scheme_selects_grpc_whatever_the_protocol_argument(protocol, scheme, ssl):
    endpoint = resolve_endpoint(f"{scheme}host:8001", protocol)
    assert (endpoint.address, endpoint.protocol, endpoint.ssl) == ("host:8001", "grpc", ssl)
    assert resolve_endpoint(f"{scheme}host", protocol).address == "host:8001"


def test_http_schemes_keep_the_protocol_argument():
    assert resolve_endpoint("http://host:8000", "http").protocol == "http"
    assert resolve_endpoint("https://host:8000", "http").ssl
    # https:// asks for TLS; over gRPC too, as before (SpeculativeSAM2Client's default)
    assert resolve_endpoint("https://host:8001", "grpc").protocol == "grpc"


class _ReadyConn(_Conn):
    def is_server_ready(self) -> bool:
        return True

    def is_model_ready(self, model: str) -> bool:
        return True

    def get_model_metadata(self, model: str):
        from tritonclient.grpc import service_pb2

        return service_pb2.ModelMetadataResponse(platform="onnxruntime_onnx")


def test_every_client_takes_grpc_from_the_url(monkeypatch):
    from triton_sam.client import SAM2VideoTritonClient, SpeculativeSAM2Client

    monkeypatch.setattr(Transport, "_connect", lambda self: _ReadyConn())
    with SAM2TritonClient("grpc://host:8001", use_server_embeddings=False) as client:
        assert client._transport.endpoint.protocol == "grpc"  # protocol="http" by default
    speculative = SpeculativeSAM2Client("grpc://host:8001", protocol="http")
    assert speculative.endpoint.protocol == "grpc"
    with SAM2VideoTritonClient("grpcs://host:8001", protocol="http") as video:
        assert (video.transport.endpoint.protocol, video.transport.endpoint.ssl) == ("grpc", True)


class _SessionConn(_ReadyConn):
    """Keeps nothing: every probe misses; an embed is answered the id the client expects."""

    def __init__(self) -> None:
        self.sent: list[dict[str, np.ndarray]] = []

    def infer(self, model, inputs, outputs=None, **kwargs):
        from tritonclient.utils import InferenceServerException

        from triton_sam.serving.protocol import embedding_cache as ec

        tensors = {i.name(): i for i in inputs}
        self.sent.append(tensors)
        if ec.IMAGE_BYTES not in tensors:
            raise InferenceServerException(
                msg="triton_sam.EmbeddingNotFound: not cached", status="StatusCode.NOT_FOUND"
            )
        answer = {ec.ENCODED: np.ones((1, 1), np.int32), ec.IMAGE_ID: np.array([[b"x"]], object)}
        result = _Result()
        result.as_numpy = answer.get
        return result


def test_set_image_reads_the_file_once_and_counts_the_bytes_on_the_wire(monkeypatch, tmp_path):
    import builtins

    from triton_sam.client import SAM2TritonClient

    path = tmp_path / "a.png"
    Image.fromarray(np.zeros((60, 100, 3), np.uint8)).save(path)
    conn = _SessionConn()
    monkeypatch.setattr(Transport, "_connect", lambda self: conn)
    opened, real_open = [], builtins.open

    def counting_open(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    with SAM2TritonClient("grpc://h:8001") as client:
        monkeypatch.setattr(builtins, "open", counting_open)
        client.set_image(path)
        monkeypatch.setattr(builtins, "open", real_open)
        assert opened.count(str(path)) == 1
        assert [sorted(t) for t in conn.sent] == [["image_id"], ["image_bytes", "image_id"]]
        assert path.stat().st_size < client.last_request_bytes <= path.stat().st_size + 512
        assert set(client.last_timings_ms) == {"probe", "preprocess", "encode"}
