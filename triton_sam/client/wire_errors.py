"""The one place that maps tritonclient / grpc / socket errors to the package's errors.

Both transports (:mod:`~triton_sam.client.transport`, :mod:`~triton_sam.client.async_transport`)
raise what :func:`translate_error` returns, chained ``from`` the library's exception.
"""

from __future__ import annotations

import asyncio
import re

from triton_sam.errors import (
    EmbeddingNotFoundError,
    ExemplarNotFoundError,
    HandleNotFoundError,
    InferenceTimeoutError,
    InvalidRequestError,
    ModelNotReadyError,
    RequestCancelledError,
    ServerError,
    ServerOverloadedError,
    ServerUnavailableError,
)
from triton_sam.serving import protocol

# Triton's messages (2.51) for a request rejected by the queue policy (max_queue_size,
# default_timeout_microseconds with timeout_action REJECT), lowercased.
_OVERLOAD_MESSAGES = ("exceeds maximum queue size", "request timeout expired")
# "Request for unknown model: 'm' is not found" / "... has no available versions" /
# "... version 1 is not at ready state".
_UNKNOWN_MODEL = re.compile(r"[Rr]equest for unknown model: '(?P<model>[^']+)'")
# Connection lost mid-request, as geventhttpclient (sync HTTP) and aiohttp name it; neither is
# an OSError.
_DISCONNECTED = frozenset({"HTTPConnectionClosed", "ServerDisconnectedError"})
# Triton's own input checks (HTTP answers them with status 400 and no gRPC status name).
_INVALID_MESSAGES = (
    "unexpected shape",
    "unexpected datatype",
    "data-type is",
    "unexpected inference input",
    "unexpected inference output",
    "missing required input",
    "onnxruntime failed",
)


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
        lowered = message.lower()
        parsed = protocol.parse_error(status, message)
        if parsed is not None and parsed[0] == protocol.ERR_EMBEDDING_NOT_FOUND:
            return EmbeddingNotFoundError(f"{what}: {message}")
        if parsed is not None and parsed[0] == protocol.ERR_EXEMPLAR_NOT_FOUND:
            return ExemplarNotFoundError(
                f"{what}: {message}; draw the exemplar boxes again (predict_concepts(boxes=...)) "
                "for a new id"
            )
        if parsed is not None and parsed[0] == protocol.ERR_HANDLE_NOT_FOUND:
            return HandleNotFoundError(
                f"{what}: {message}; the image was closed, evicted or the server restarted: "
                "open it again (open_dataset / open_array)"
            )
        if "DEADLINE_EXCEEDED" in status or "Deadline Exceeded" in message:
            return InferenceTimeoutError(f"{what}: timed out ({message})")
        if "CANCELLED" in status or "Cancelled" in message:
            return RequestCancelledError(f"{what}: cancelled ({message})")
        overloaded = parsed is not None and parsed[0] == protocol.ERR_OVERLOADED
        if overloaded or any(needle in lowered for needle in _OVERLOAD_MESSAGES):
            return ServerOverloadedError(
                f"{what}: the server is overloaded and rejected the request ({message}); "
                "retry later, lower the request rate, or raise the model's max_queue_size"
            )
        match = _UNKNOWN_MODEL.search(message)
        if match is not None:
            name = match["model"]
            return ModelNotReadyError(
                name,
                f"model: {name!r} is not loaded or not ready on the server ({what}: {message}); "
                "check `curl <server>/v2/models/<model>/ready` and the server log",
            )
        if "UNAVAILABLE" in status or "failed to connect" in lowered:
            return ServerUnavailableError(f"{what}: server unavailable ({message})")
        invalid = status in ("400", "StatusCode.INVALID_ARGUMENT")  # HTTP 400 / gRPC
        if invalid or any(n in lowered for n in _INVALID_MESSAGES):
            return InvalidRequestError(f"{what}: the server rejected the request: {message}")
        return ServerError(f"{what}: server error: {message}")
    # asyncio.TimeoutError is not the builtin TimeoutError before Python 3.11
    if isinstance(e, TimeoutError | asyncio.TimeoutError) or type(e).__name__ in {
        "timeout",
        "Timeout",
    }:
        return InferenceTimeoutError(f"{what}: timed out ({e})")
    if isinstance(e, ConnectionError | OSError) or type(e).__name__ in _DISCONNECTED:
        return ServerUnavailableError(f"{what}: cannot reach the server ({type(e).__name__}: {e})")
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
