"""A thin, protocol-neutral layer over tritonclient's HTTP and gRPC clients (the blocking wire).

Everything that touches ``tritonclient`` lives in the wire modules: this one (I/O and the
retry loop), :mod:`~triton_sam.client.wire` (requests as tritonclient builds them, their
size and headers, and :class:`~triton_sam.client.wire.Link`, the settings both transports
share) and :mod:`~triton_sam.client.wire_errors` (the one function that turns the library's
exceptions into ours), so the SAM clients above deal in numpy arrays and TritonSamErrors.
Observation is a hook: :attr:`Transport.on_request` sees every inference request sent (a
:class:`~triton_sam.client.wire.SentRequest`); nothing here calls a client back otherwise.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from triton_sam.client.endpoint import (  # re-exported: their home before the split
    DEFAULT_PORTS,
    Endpoint,
    Protocol,
    TlsOptions,
    resolve_endpoint,
)
from triton_sam.client.retry import Backoff
from triton_sam.client.wire import NUMPY_TO_TRITON as _NUMPY_TO_TRITON
from triton_sam.client.wire import Link, build_infer_inputs
from triton_sam.client.wire_errors import translate_error
from triton_sam.errors import InferenceTimeoutError, RequestCancelledError

__all__ = [
    "DEFAULT_PORTS",
    "Endpoint",
    "PendingInfer",
    "Protocol",
    "TlsOptions",
    "Transport",
    "build_infer_inputs",
    "resolve_endpoint",
    "translate_error",
]
_ = _NUMPY_TO_TRITON  # kept importable from here


class Transport(Link):
    """Synchronous inference over HTTP or gRPC with numpy in and out; safe to share between
    threads.

    Each thread gets its own tritonclient connection: tritonclient's clients are not
    thread-safe, and the HTTP one (gevent) hangs when called from another thread than the
    one that made it (triton-inference-server/server#4223).

    Its arguments (endpoint, timeout, retry policy, TLS, headers, ``on_request`` hook) are
    :class:`~triton_sam.client.wire.Link`'s.
    """

    def _open_connection(self) -> None:
        if self.endpoint.protocol == "http":
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
        reconnect). The loop is here, and :class:`~triton_sam.client.retry.Backoff` only
        decides, so the retry policy never calls the wire back."""
        backoff = Backoff(self.retry, deadline_s=self.timeout_s)
        while True:
            try:
                return self._call(what, getattr(self._client, method), *args, **kwargs)
            except Exception as e:
                wait = backoff.after(e)
                if wait is None:
                    raise
            time.sleep(wait)
            if backoff.reconnect:
                self._reconnect_quietly()

    def _reconnect_quietly(self) -> None:
        with contextlib.suppress(Exception):  # the next attempt reports what is wrong
            self.reconnect()

    def header_kwargs(self) -> dict[str, Any]:
        """``headers=`` for tritonclient's calls besides inference (health, metadata,
        config, statistics) when this transport has headers (a bearer token behind the
        token proxy), else nothing: those calls then go as they always did."""
        return {"headers": self.headers} if self.headers else {}

    def is_server_ready(self) -> bool:
        """True when the server answers and reports ready; False when unreachable."""
        try:
            return bool(self._client.is_server_ready(**self.header_kwargs()))
        except Exception:
            return False

    def is_model_ready(self, model: str) -> bool:
        """True when ``model`` is loaded and ready."""
        return bool(
            self._idempotent(
                f"readiness of {model}", "is_model_ready", model, **self.header_kwargs()
            )
        )

    def model_metadata(self, model: str) -> dict[str, Any]:
        """The model's metadata (inputs/outputs with shapes and datatypes) as a dict."""
        meta = self._idempotent(
            f"metadata of {model}", "get_model_metadata", model, **self.header_kwargs()
        )
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
        self.sending(model, inputs, outputs)
        infer_inputs = build_infer_inputs(self._module, inputs, http=self.is_http)
        requested = [
            self._module.InferRequestedOutput(n, **({"binary_data": True} if self.is_http else {}))
            for n in outputs
        ]
        kwargs: dict[str, Any] = {} if self.is_http else {"client_timeout": self.timeout_s}
        kwargs["headers"] = self.request_headers(inputs, routing_key)
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
        if self.is_http:
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
                headers=self.request_headers(inputs, routing_key),
            )
        except Exception as e:
            raise translate_error(e, what=what) from e
        return pending

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
