"""A thin, protocol-neutral layer over tritonclient's HTTP and gRPC clients.

Everything that touches ``tritonclient`` lives here, including the one function that turns
its exceptions into ours, so the SAM clients above deal in numpy arrays and TritonSamErrors.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from triton_sam.errors import (
    InferenceTimeoutError,
    InputValidationError,
    RequestCancelledError,
    ServerError,
    ServerUnavailableError,
)

Protocol = Literal["http", "grpc"]
DEFAULT_PORTS: dict[str, int] = {"http": 8000, "grpc": 8001}

_NUMPY_TO_TRITON = {
    "float32": "FP32",
    "float16": "FP16",
    "int32": "INT32",
    "int64": "INT64",
    "uint8": "UINT8",
    "bool": "BOOL",
}


@dataclass(frozen=True)
class Endpoint:
    """Where a Triton server listens.

    Attributes:
        address: ``host:port`` as tritonclient expects it (no scheme).
        protocol: ``"http"`` or ``"grpc"``.
        ssl: True for ``https://`` (or ``grpcs://``) URLs.
    """

    address: str
    protocol: Protocol
    ssl: bool


def resolve_endpoint(url: str | None, protocol: str) -> Endpoint:
    """Turn a user URL (or ``$TRITON_URL``, or the default port) into an Endpoint.

    ``https://host:port`` enables TLS; a bare ``host`` gets the protocol's default port.

    Raises:
        InputValidationError: unknown protocol or malformed URL.
    """
    if protocol not in DEFAULT_PORTS:
        raise InputValidationError("protocol", f"got {protocol!r}, expected 'http' or 'grpc'")
    url = url or os.environ.get("TRITON_URL") or f"localhost:{DEFAULT_PORTS[protocol]}"
    ssl = url.startswith(("https://", "grpcs://"))
    address = url.split("://", 1)[-1].rstrip("/")
    if not address or "/" in address or " " in address:
        raise InputValidationError("url", f"got {url!r}, expected host[:port] or https://host:port")
    if ":" not in address.rsplit("]", 1)[-1]:
        address = f"{address}:{DEFAULT_PORTS[protocol]}"
    return Endpoint(address=address, protocol=protocol, ssl=ssl)  # type: ignore[arg-type]


def translate_error(e: Exception, *, what: str) -> Exception:
    """Map a tritonclient/grpc/socket error to a TritonSamError (the only place that does).

    Args:
        e: the library exception.
        what: a short description of the call ("infer on sam2_decoder") for the message.
    """
    from tritonclient.utils import InferenceServerException

    e = _from_grpc(e)
    if isinstance(e, InferenceServerException):
        status = str(e.status() or "")
        message = e.message() or str(e)
        if "DEADLINE_EXCEEDED" in status or "Deadline Exceeded" in message:
            return InferenceTimeoutError(f"{what}: timed out ({message})")
        if "CANCELLED" in status or "Cancelled" in message:
            return RequestCancelledError(f"{what}: cancelled ({message})")
        if "UNAVAILABLE" in status or "failed to connect" in message.lower():
            return ServerUnavailableError(f"{what}: server unavailable ({message})")
        return ServerError(f"{what}: server error: {message}")
    # asyncio.TimeoutError is not the builtin TimeoutError before Python 3.11
    if isinstance(e, TimeoutError | asyncio.TimeoutError) or type(e).__name__ in {
        "timeout",
        "Timeout",
    }:
        return InferenceTimeoutError(f"{what}: timed out ({e})")
    if isinstance(e, ConnectionError | OSError):
        return ServerUnavailableError(f"{what}: cannot reach the server ({e})")
    return ServerError(f"{what}: {type(e).__name__}: {e}")


def _from_grpc(e: Exception) -> Exception:
    """A raw ``grpc.RpcError`` (grpc.aio raises them where tritonclient does not wrap) as
    tritonclient's InferenceServerException, the way tritonclient converts them."""
    try:
        import grpc
        from tritonclient.utils import InferenceServerException
    except ImportError:  # pragma: no cover - grpc is a dependency of tritonclient[grpc]
        return e
    if isinstance(e, grpc.RpcError) and hasattr(e, "code") and hasattr(e, "details"):
        return InferenceServerException(msg=e.details(), status=str(e.code()))
    return e


class Transport:
    """Synchronous inference over HTTP or gRPC with numpy in and out.

    Args:
        endpoint: where the server is.
        timeout_s: per-request timeout (connect + network for HTTP, deadline for gRPC).
    """

    def __init__(self, endpoint: Endpoint, *, timeout_s: float = 60.0) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        try:
            if endpoint.protocol == "http":
                import tritonclient.http as module

                self._client: Any = module.InferenceServerClient(
                    endpoint.address,
                    ssl=endpoint.ssl,
                    connection_timeout=timeout_s,
                    network_timeout=timeout_s,
                )
            else:
                import tritonclient.grpc as module

                self._client = module.InferenceServerClient(endpoint.address, ssl=endpoint.ssl)
        except Exception as e:
            raise translate_error(e, what=f"connect to {endpoint.address}") from e
        self._module = module

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise translate_error(e, what=what) from e

    def is_server_ready(self) -> bool:
        """True when the server answers and reports ready; False when unreachable."""
        try:
            return bool(self._client.is_server_ready())
        except Exception:
            return False

    def is_model_ready(self, model: str) -> bool:
        """True when ``model`` is loaded and ready."""
        return bool(self._call(f"readiness of {model}", self._client.is_model_ready, model))

    def model_metadata(self, model: str) -> dict[str, Any]:
        """The model's metadata (inputs/outputs with shapes and datatypes) as a dict."""
        meta = self._call(f"metadata of {model}", self._client.get_model_metadata, model)
        if self.endpoint.protocol == "grpc":
            from google.protobuf.json_format import MessageToDict

            meta = MessageToDict(meta, preserving_proto_field_name=True)
        return meta

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
    ) -> dict[str, np.ndarray]:
        """Run ``model`` on ``inputs`` and return the requested ``outputs`` by name."""
        infer_inputs = build_infer_inputs(self._module, inputs, http=self._is_http)
        requested = [
            self._module.InferRequestedOutput(n, **({"binary_data": True} if self._is_http else {}))
            for n in outputs
        ]
        kwargs: dict[str, Any] = {} if self._is_http else {"client_timeout": self.timeout_s}
        result = self._call(
            f"infer on {model}",
            self._client.infer,
            model,
            infer_inputs,
            outputs=requested,
            **kwargs,
        )
        return {n: result.as_numpy(n) for n in outputs}

    @property
    def _is_http(self) -> bool:
        return self.endpoint.protocol == "http"

    def close(self) -> None:
        """Close connections (idempotent)."""
        # closing a broken connection must not mask the error that broke it
        with contextlib.suppress(Exception):
            self._client.close()


def build_infer_inputs(module: Any, inputs: Mapping[str, np.ndarray], *, http: bool) -> list[Any]:
    """tritonclient InferInput objects for numpy arrays (shared by sync and async clients)."""
    result = []
    for name, array in inputs.items():
        array = np.ascontiguousarray(array)
        datatype = _NUMPY_TO_TRITON[array.dtype.name]
        item = module.InferInput(name, list(array.shape), datatype)
        if http:
            item.set_data_from_numpy(array, binary_data=True)
        else:
            item.set_data_from_numpy(array)
        result.append(item)
    return result
