"""A thin, protocol-neutral layer over tritonclient's HTTP and gRPC clients.

Everything that touches ``tritonclient`` lives here, including the one function that turns
its exceptions into ours, so the SAM clients above deal in numpy arrays and TritonSamErrors.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from triton_sam.client.retry import DEFAULT_RETRY, RetryPolicy, call_with_retry
from triton_sam.client.routing import routing_headers
from triton_sam.errors import (
    EmbeddingNotFoundError,
    InferenceTimeoutError,
    InputValidationError,
    InvalidRequestError,
    ModelNotReadyError,
    RequestCancelledError,
    ServerError,
    ServerOverloadedError,
    ServerUnavailableError,
)
from triton_sam.serving import protocol

Protocol = Literal["http", "grpc"]
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
DEFAULT_PORTS: dict[str, int] = {"http": 8000, "grpc": 8001}

_NUMPY_TO_TRITON = {
    "float32": "FP32",
    "float16": "FP16",
    "int32": "INT32",
    "int64": "INT64",
    "uint8": "UINT8",
    "bool": "BOOL",
    "object": "BYTES",  # numpy object arrays of bytes (the session model's image_id)
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
        lowered = message.lower()
        parsed = protocol.parse_error(status, message)
        if parsed is not None and parsed[0] == protocol.ERR_EMBEDDING_NOT_FOUND:
            return EmbeddingNotFoundError(f"{what}: {message}")
        if "DEADLINE_EXCEEDED" in status or "Deadline Exceeded" in message:
            return InferenceTimeoutError(f"{what}: timed out ({message})")
        if "CANCELLED" in status or "Cancelled" in message:
            return RequestCancelledError(f"{what}: cancelled ({message})")
        if any(needle in lowered for needle in _OVERLOAD_MESSAGES):
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


@dataclass(frozen=True)
class TlsOptions:
    """Client-side TLS for a server behind TLS (``https://`` / ``grpcs://`` URLs).

    Attributes:
        root_certificates: PEM file of the CA that signed the server's certificate (None:
            the system's trust store).
        private_key / certificate_chain: PEM files of a client certificate, for servers
            that require mutual TLS (``--grpc-use-ssl-mutual``).
        insecure: HTTP only: skip verifying the server's certificate (testing only).
    """

    root_certificates: str | None = None
    private_key: str | None = None
    certificate_chain: str | None = None
    insecure: bool = False

    def http_options(self) -> dict[str, Any]:
        """``ssl_options`` / ``insecure`` for ``tritonclient.http`` (geventhttpclient)."""
        files = {
            "ca_certs": self.root_certificates,
            "certfile": self.certificate_chain,
            "keyfile": self.private_key,
        }
        return {
            "ssl_options": {k: v for k, v in files.items() if v} or None,
            "insecure": self.insecure,
        }

    def grpc_options(self) -> dict[str, Any]:
        """Keyword arguments for ``tritonclient.grpc`` (sync and aio): file paths."""
        return {
            "root_certificates": self.root_certificates,
            "private_key": self.private_key,
            "certificate_chain": self.certificate_chain,
        }

    def ssl_context(self) -> Any:
        """An ``ssl.SSLContext`` for ``tritonclient.http.aio`` (aiohttp)."""
        import ssl

        context = ssl.create_default_context(cafile=self.root_certificates)
        if self.certificate_chain:
            context.load_cert_chain(self.certificate_chain, self.private_key)
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


class Transport:
    """Synchronous inference over HTTP or gRPC with numpy in and out; safe to share between
    threads.

    Each thread gets its own tritonclient connection: tritonclient's clients are not
    thread-safe, and the HTTP one (gevent) hangs when called from another thread than the
    one that made it (triton-inference-server/server#4223).

    Args:
        endpoint: where the server is.
        timeout_s: per-request timeout (connect + network for HTTP, deadline for gRPC).
        retry: backoff for idempotent calls (see :mod:`triton_sam.client.retry`); None
            uses ``DEFAULT_RETRY``, ``NO_RETRY`` turns retries off.
        tls: certificates for an ``https://`` endpoint (None: the system's trust store).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
        tls: TlsOptions | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.retry = DEFAULT_RETRY if retry is None else retry
        self.tls = tls or TlsOptions()
        if endpoint.protocol == "http":
            import tritonclient.http as module
        else:
            import tritonclient.grpc as module
        self._module: Any = module
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[Any] = []  # every thread's connection, for close()
        self._thread_client()  # a malformed address fails here, in the caller's thread

    @property
    def _client(self) -> Any:
        return self._thread_client()

    def _thread_client(self) -> Any:
        """This thread's connection (opened on its first call)."""
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._connect()
            with self._lock:
                self._open.append(client)
        return client

    def _connect(self) -> Any:
        endpoint, module = self.endpoint, self._module
        try:
            if endpoint.protocol == "http":
                tls = self.tls.http_options() if endpoint.ssl else {}
                client: Any = module.InferenceServerClient(
                    endpoint.address,
                    ssl=endpoint.ssl,
                    connection_timeout=self.timeout_s,
                    network_timeout=self.timeout_s,
                    **tls,
                )
            else:
                tls = self.tls.grpc_options() if endpoint.ssl else {}
                client = module.InferenceServerClient(endpoint.address, ssl=endpoint.ssl, **tls)
        except Exception as e:
            raise translate_error(e, what=f"connect to {endpoint.address}") from e
        return client

    def reconnect(self) -> None:
        """Drop this thread's connection and open a fresh one (after a server restart: a
        pooled HTTP connection is dead, and a gRPC channel may sit in reconnect backoff).
        Other threads reconnect on their own next failure."""
        old = getattr(self._local, "client", None)
        self._local.client = None
        if old is not None:
            with self._lock:
                self._open = [c for c in self._open if c is not old]
            with contextlib.suppress(Exception):
                old.close()
        self._thread_client()

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise translate_error(e, what=what) from e

    def _idempotent(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``self._client.<method>(...)``, retried per :attr:`retry` (looked up anew after a
        reconnect)."""
        return call_with_retry(
            lambda: self._call(what, getattr(self._client, method), *args, **kwargs),
            self.retry,
            deadline_s=self.timeout_s,
            before_retry=self._reconnect_quietly,
        )

    def _reconnect_quietly(self) -> None:
        with contextlib.suppress(Exception):  # the next attempt reports what is wrong
            self.reconnect()

    def is_server_ready(self) -> bool:
        """True when the server answers and reports ready; False when unreachable."""
        try:
            return bool(self._client.is_server_ready())
        except Exception:
            return False

    def is_model_ready(self, model: str) -> bool:
        """True when ``model`` is loaded and ready."""
        return bool(self._idempotent(f"readiness of {model}", "is_model_ready", model))

    def model_metadata(self, model: str) -> dict[str, Any]:
        """The model's metadata (inputs/outputs with shapes and datatypes) as a dict."""
        meta = self._idempotent(f"metadata of {model}", "get_model_metadata", model)
        if self.endpoint.protocol == "grpc":
            from google.protobuf.json_format import MessageToDict

            meta = MessageToDict(meta, preserving_proto_field_name=True)
        return meta

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        *,
        idempotent: bool = False,
        routing_key: str | None = None,
    ) -> dict[str, np.ndarray]:
        """Run ``model`` on ``inputs`` and return the requested ``outputs`` by name.

        Args:
            model: Triton model name.
            inputs: tensors by name.
            outputs: output names to request.
            idempotent: the call may safely run twice (encoder, stateless decoder): retry it
                per :attr:`retry` when the server is unreachable. False never retries.
            routing_key: the replica-affinity key, when not the image the inputs name
                (a tracked video's; see :mod:`triton_sam.client.routing`).

        Raises:
            TritonSamError: the translated error (see :func:`translate_error`).
        """
        infer_inputs = build_infer_inputs(self._module, inputs, http=self._is_http)
        requested = [
            self._module.InferRequestedOutput(n, **({"binary_data": True} if self._is_http else {}))
            for n in outputs
        ]
        kwargs: dict[str, Any] = {} if self._is_http else {"client_timeout": self.timeout_s}
        kwargs["headers"] = routing_headers(inputs, routing_key)  # affinity behind a proxy
        what = f"infer on {model}"
        if idempotent:
            result = self._idempotent(
                what, "infer", model, infer_inputs, outputs=requested, **kwargs
            )
        else:
            result = self._call(
                what, self._client.infer, model, infer_inputs, outputs=requested, **kwargs
            )
        return {n: result.as_numpy(n) for n in outputs}

    def start_infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        *,
        routing_key: str | None = None,
    ) -> PendingInfer:
        """Send a request without waiting; the returned handle waits for it or cancels it.

        Over gRPC the request can be cancelled for real (the call is cancelled, so Triton
        drops it if still queued, and a python-backend model can see ``is_cancelled``); over
        HTTP, which has no cancellation, the request runs to its end and the handle only
        discards the answer.
        """
        what = f"infer on {model}"
        if self._is_http:
            try:
                result = self.infer(model, inputs, outputs, routing_key=routing_key)
                return PendingInfer(result=result)
            except Exception as e:  # delivered by wait(), like the gRPC path
                return PendingInfer(error=e)
        pending = PendingInfer()
        infer_inputs = build_infer_inputs(self._module, inputs, http=False)
        requested = [self._module.InferRequestedOutput(n) for n in outputs]

        def done(result: Any, error: Any) -> None:
            if error is not None:
                pending.finish(error=translate_error(error, what=what))
            else:
                pending.finish(result={n: result.as_numpy(n) for n in outputs})

        try:
            pending.context = self._client.async_infer(
                model,
                infer_inputs,
                done,
                outputs=requested,
                client_timeout=self.timeout_s,
                headers=routing_headers(inputs, routing_key),  # affinity behind a proxy
            )
        except Exception as e:
            raise translate_error(e, what=what) from e
        return pending

    @property
    def _is_http(self) -> bool:
        return self.endpoint.protocol == "http"

    def close(self) -> None:
        """Close every thread's connection (idempotent)."""
        with self._lock:
            clients, self._open = self._open, []
        self._local = threading.local()
        for client in clients:
            # closing a broken connection must not mask the error that broke it
            with contextlib.suppress(Exception):
                client.close()


class PendingInfer:
    """A request in flight (see :meth:`Transport.start_infer`)."""

    def __init__(self, result: dict[str, np.ndarray] | None = None, error: Exception | None = None):
        self._done = threading.Event()
        self._result, self._error = result, error
        self.context: Any = None  # tritonclient's CallContext (gRPC)
        self.cancelled = False
        if result is not None or error is not None:
            self._done.set()

    def finish(
        self, *, result: dict[str, np.ndarray] | None = None, error: Exception | None = None
    ):
        self._result, self._error = result, error
        self._done.set()

    def cancel(self) -> None:
        """Cancel the call (gRPC); :meth:`wait` then raises RequestCancelledError."""
        self.cancelled = True
        if self.context is not None:
            with contextlib.suppress(Exception):
                self.context.cancel()
        self._done.set()

    def wait(self, timeout_s: float | None = None) -> dict[str, np.ndarray]:
        """The outputs by name.

        Raises:
            RequestCancelledError: cancelled; InferenceTimeoutError: no answer in time; the
            translated server error otherwise.
        """
        if not self._done.wait(timeout_s):
            raise InferenceTimeoutError(f"no answer within {timeout_s} s")
        if self.cancelled:
            raise RequestCancelledError("the request was cancelled")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


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
