"""How a request looks on the wire, without sending it: numpy tensors as tritonclient's
``InferInput`` objects, a gRPC ``ModelInferRequest`` as bytes, and a request's size.

The transports build their requests here; :class:`SentRequest` is what they hand to their
``on_request`` hook for each inference request, so a client counts the bytes it sent by
watching the wire instead of rebuilding the request itself. :class:`SentBytes` is such a hook
that keeps the count as a value the client reads after its call (nothing calls the client).
:class:`Link` is what both transports are told about reaching the server, and the headers
their requests carry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_sam.client.endpoint import Endpoint, TlsOptions
from triton_sam.client.retry import DEFAULT_RETRY, RetryPolicy
from triton_sam.client.routing import routing_headers

NUMPY_TO_TRITON = {
    "float32": "FP32",
    "float16": "FP16",
    "int32": "INT32",
    "int64": "INT64",
    "uint8": "UINT8",
    "bool": "BOOL",
    "object": "BYTES",  # numpy object arrays of bytes (the session model's image_id)
}
# Requests whose tensors hold more than this are sized by their tensor bytes: an image or
# features, whose bytes dominate, are not serialised a second time just to be counted.
EXACT_SIZE_LIMIT = 1 << 20


def build_infer_inputs(module: Any, inputs: Mapping[str, np.ndarray], *, http: bool) -> list[Any]:
    """tritonclient InferInput objects for numpy arrays (shared by sync and async clients)."""
    result = []
    for name, array in inputs.items():
        array = np.ascontiguousarray(array)
        datatype = NUMPY_TO_TRITON[array.dtype.name]
        item = module.InferInput(name, list(array.shape), datatype)
        if http:
            item.set_data_from_numpy(array, binary_data=True)
        else:
            item.set_data_from_numpy(array)
        result.append(item)
    return result


def encode_infer_request(
    inputs: Mapping[str, np.ndarray],
    *,
    model: str = "",
    outputs: Sequence[str] = (),
    request_id: str = "",
) -> bytes:
    """Serialise a gRPC ``ModelInferRequest`` (or a fragment of one: only what is given).

    Tensors go as ``raw_input_contents`` (what tritonclient sends), C-contiguous, in order;
    BYTES tensors length-prefixed, as tritonclient serialises them.
    """
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for name, array in inputs.items():
        array = np.ascontiguousarray(array)
        request.inputs.add(
            name=name, datatype=NUMPY_TO_TRITON[array.dtype.name], shape=list(array.shape)
        )
        request.raw_input_contents.append(_raw(array))
    for name in outputs:
        request.outputs.add(name=name)
    return request.SerializeToString()


def _raw(array: np.ndarray) -> bytes:
    if array.dtype != np.object_:
        return array.tobytes()
    from tritonclient.utils import serialize_byte_tensor

    serialized = serialize_byte_tensor(array)
    return serialized.item() if serialized.size > 0 else b""


def payload_bytes(array: np.ndarray) -> int:
    """Bytes a tensor carries: its buffer, or for BYTES (object) tensors its elements."""
    if array.dtype == np.object_:
        return sum(len(x) if isinstance(x, bytes | str) else 8 for x in array.reshape(-1))
    return array.nbytes


def request_bytes(
    protocol: str, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
) -> int:
    """Size of the serialised inference request as tritonclient sends it (no I/O).

    gRPC: the ``ModelInferRequest`` message; HTTP: the body (JSON header + binary tensors).
    Transport framing (HTTP/2 frames, HTTP headers) comes on top
    (tests/integration/test_session_model.py measures it on the wire). Requests whose tensors
    exceed :data:`EXACT_SIZE_LIMIT` (an image, features) count their tensor bytes.
    """
    payload = sum(payload_bytes(np.asarray(a)) for a in inputs.values())
    if payload > EXACT_SIZE_LIMIT:
        return payload
    if protocol != "http":
        return len(encode_infer_request(inputs, model=model, outputs=outputs))
    import tritonclient.http as module

    requested = [module.InferRequestedOutput(n, binary_data=True) for n in outputs]
    infer_inputs = build_infer_inputs(module, inputs, http=True)
    body, _ = module.InferenceServerClient.generate_request_body(infer_inputs, outputs=requested)
    return len(body)


@dataclass(frozen=True)
class SentRequest:
    """One inference request a transport sends, as its ``on_request`` hook sees it.

    Attributes:
        protocol: ``"http"`` or ``"grpc"``.
        model: the Triton model.
        wire_bytes: :func:`request_bytes` of the request.
    """

    protocol: str
    model: str
    wire_bytes: int

    @classmethod
    def of(
        cls, protocol: str, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> SentRequest:
        """The record of sending ``inputs`` to ``model`` asking for ``outputs``."""
        return cls(protocol, model, request_bytes(protocol, model, inputs, outputs))


@dataclass
class SentBytes:
    """A transport's ``on_request`` hook keeping the size of the last request sent.

    Attributes:
        last: :attr:`SentRequest.wire_bytes` of the last inference request (0 before any).
    """

    last: int = 0

    def __call__(self, request: SentRequest) -> None:
        self.last = request.wire_bytes


RequestHook = Callable[[SentRequest], None]


class Link:
    """What both transports (blocking and asyncio) know about reaching the server; each
    opens its connection in ``_open_connection``, called last by the constructor.

    Args:
        endpoint: where the server is.
        timeout_s: per-request timeout (HTTP: connect and network; gRPC: the deadline).
        retry: backoff for idempotent calls (see :mod:`triton_sam.client.retry`); None
            uses ``DEFAULT_RETRY``, ``NO_RETRY`` turns retries off.
        tls: certificates for an ``https://`` / ``grpcs://`` endpoint (None: the system's
            trust store).
        headers: sent with every inference request (HTTP headers / gRPC metadata), e.g. the
            tenant a gateway that speaks for many tenants forwards.
        on_request: called with each inference request before it is sent (byte counters,
            such as :class:`SentBytes`).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
        tls: TlsOptions | None = None,
        headers: Mapping[str, str] | None = None,
        on_request: RequestHook | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.retry = DEFAULT_RETRY if retry is None else retry
        self.tls = tls or TlsOptions()
        self.headers = dict(headers or {})
        self.on_request = on_request
        self._open_connection()

    def _open_connection(self) -> None:  # pragma: no cover - each transport opens its own
        raise NotImplementedError

    @property
    def is_http(self) -> bool:
        """True over HTTP (no server-side cancellation), False over gRPC."""
        return self.endpoint.protocol == "http"

    def request_headers(
        self, inputs: Mapping[str, np.ndarray], routing_key: str | None = None
    ) -> dict[str, str] | None:
        """The headers of one inference request: :attr:`headers` and the routing header
        (image affinity behind a proxy, :mod:`~triton_sam.client.routing`), or None."""
        return {**self.headers, **(routing_headers(inputs, routing_key) or {})} or None

    def sending(self, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> None:
        """Show the request about to be sent to :attr:`on_request`, if set."""
        if self.on_request is not None:
            self.on_request(SentRequest.of(self.endpoint.protocol, model, inputs, outputs))
