"""The asyncio sibling of :class:`~triton_sam.client.transport.Transport`.

gRPC goes through ``tritonclient.grpc.aio`` (grpc.aio): cancelling the asyncio task that awaits
:meth:`AsyncTransport.infer` cancels the RPC, Triton's gRPC endpoint sees the cancellation, and
a request still waiting in a dynamic batcher's queue is dropped (counted by Triton as
``nv_inference_request_failure{reason="CANCELED"}``); one already handed to the model runs
(the python-runner fallback answers it unrun). HTTP goes through ``tritonclient.http.aio``
(aiohttp): cancelling the task closes the connection and stops the wait, but Triton's HTTP
endpoint has no cancellation, so the server still executes the request.

Errors are translated by the one translator, :func:`wire_errors.translate_error`;
``asyncio.CancelledError`` is never caught.

Over gRPC, tensors reused by many requests (the image embeddings, ~16 MiB for SAM2) are
serialised once (:meth:`AsyncTransport.prepare_inputs`) and each request only serialises its
prompts: protobuf messages concatenate, so ``prepared + per-request`` bytes parse as one
``ModelInferRequest`` whose inputs are the prepared ones, then the request's. Serialising the
embeddings anew costs ~70 ms of event-loop time per request on a 2-core CPU machine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from triton_sam.client.retry import Backoff
from triton_sam.client.wire import Link, build_infer_inputs, encode_infer_request
from triton_sam.client.wire_errors import translate_error

__all__ = ["AsyncTransport", "PreparedInputs", "encode_infer_request"]

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
_T = TypeVar("_T")


@dataclass(frozen=True)
class PreparedInputs:
    """Tensors shared by many requests, encoded once.

    Attributes:
        names: tensor names, in order.
        infer_inputs: tritonclient ``InferInput`` objects (HTTP, or gRPC without a channel).
        wire: serialised ``ModelInferRequest`` fragment holding only these inputs (gRPC).
    """

    names: tuple[str, ...]
    infer_inputs: tuple[Any, ...] = ()
    wire: bytes | None = None


class AsyncTransport(Link):
    """Asynchronous inference over gRPC (default) or HTTP with numpy in and out.

    Create it inside a running event loop (the gRPC channel binds to it); use it from that
    loop only; :meth:`close` it there.

    Its arguments (endpoint, timeout, retry policy, TLS, headers, ``on_request`` hook) are
    :class:`~triton_sam.client.wire.Link`'s.
    """

    def _open_connection(self) -> None:
        self._client, self._module = self._connect()
        self._raw_infer = self._raw_infer_call()

    def _connect(self) -> tuple[Any, Any]:
        endpoint = self.endpoint
        try:
            if endpoint.protocol == "http":
                import tritonclient.http.aio as module

                context = {"ssl_context": self.tls.ssl_context()} if endpoint.ssl else {}
                client: Any = module.InferenceServerClient(
                    endpoint.address, ssl=endpoint.ssl, conn_timeout=self.timeout_s, **context
                )
            else:
                import tritonclient.grpc.aio as module

                tls = self.tls.grpc_options() if endpoint.ssl else {}
                client = module.InferenceServerClient(endpoint.address, ssl=endpoint.ssl, **tls)
        except Exception as e:
            raise translate_error(e, what=f"connect to {endpoint.address}") from e
        return client, module

    async def reconnect(self) -> None:
        """Close the connection and open a fresh one (see ``Transport.reconnect``)."""
        old = self._client
        self._client, self._module = self._connect()
        self._raw_infer = self._raw_infer_call()
        with contextlib.suppress(Exception):
            await old.close()

    async def _reconnect_quietly(self) -> None:
        with contextlib.suppress(Exception):  # the next attempt reports what is wrong
            await self.reconnect()

    def _raw_infer_call(self) -> Any:
        """ModelInfer on tritonclient's own channel taking pre-serialised bytes (gRPC)."""
        channel = getattr(self._client, "_channel", None)
        if self.is_http or channel is None:
            return None
        from tritonclient.grpc import service_pb2

        return channel.unary_unary(
            MODEL_INFER,
            request_serializer=None,  # bytes go out as they are
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )

    async def _call(self, what: str, awaitable: Awaitable[Any]) -> Any:
        # Exception, never BaseException: asyncio.CancelledError must pass untouched.
        try:
            return await awaitable
        except Exception as e:
            raise translate_error(e, what=what) from e

    async def is_server_ready(self) -> bool:
        """True when the server answers and reports ready; False when unreachable."""
        try:
            return bool(await self._client.is_server_ready())
        except Exception:
            return False

    async def is_model_ready(self, model: str) -> bool:
        """True when ``model`` is loaded and ready (retried per :attr:`retry`)."""
        what = f"readiness of {model}"
        ready = await self._retried(lambda: self._call(what, self._client.is_model_ready(model)))
        return bool(ready)

    async def model_metadata(self, model: str) -> dict[str, Any]:
        """The model's metadata (inputs/outputs with shapes and datatypes) as a dict."""
        kwargs = {} if self.is_http else {"as_json": True}
        what = f"metadata of {model}"
        meta = await self._retried(
            lambda: self._call(what, self._client.get_model_metadata(model, **kwargs))
        )
        return dict(meta)

    def prepare_inputs(self, inputs: Mapping[str, np.ndarray]) -> PreparedInputs:
        """Encode tensors reused by many requests (the embeddings) once, for :meth:`infer`."""
        names = tuple(inputs)
        if self._raw_infer is not None:
            return PreparedInputs(names, wire=encode_infer_request(inputs))
        infer_inputs = build_infer_inputs(self._module, inputs, http=self.is_http)
        return PreparedInputs(names, infer_inputs=tuple(infer_inputs))

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        *,
        prepared: PreparedInputs | None = None,
        request_id: str = "",
        idempotent: bool = False,
    ) -> dict[str, np.ndarray]:
        """Run ``model`` and return the requested ``outputs`` by name.

        Args:
            model: Triton model name.
            inputs: per-request tensors by name.
            outputs: output names to request (only those cross the wire).
            prepared: inputs from :meth:`prepare_inputs`, sent before ``inputs``.
            request_id: Triton request id (shows in the server's log and traces).
            idempotent: the call may safely run twice (encoder, stateless decoder): retry
                it per :attr:`retry` when the server is unreachable.

        Raises:
            TritonSamError: the translated tritonclient/grpc/aiohttp error.
            asyncio.CancelledError: the awaiting task was cancelled (the RPC is cancelled).
        """
        if not idempotent:
            return await self._infer_once(model, inputs, outputs, prepared, request_id)
        return await self._retried(
            lambda: self._infer_once(model, inputs, outputs, prepared, request_id)
        )

    async def _retried(self, attempt: Callable[[], Awaitable[_T]]) -> _T:
        """``await attempt()``, retried per :attr:`retry`; the loop is here and
        :class:`~triton_sam.client.retry.Backoff` only decides (as ``Transport``'s)."""
        backoff = Backoff(self.retry, deadline_s=self.timeout_s)
        while True:
            try:
                return await attempt()
            except Exception as e:  # never BaseException: CancelledError passes
                wait = backoff.after(e)
                if wait is None:
                    raise
            await asyncio.sleep(wait)
            if backoff.reconnect:
                await self._reconnect_quietly()

    async def _infer_once(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        prepared: PreparedInputs | None,
        request_id: str,
    ) -> dict[str, np.ndarray]:
        what = f"infer on {model}"
        self.sending(model, inputs, outputs)  # the request's own inputs, not the prepared
        if prepared is not None and prepared.wire is not None and self._raw_infer is not None:
            body = prepared.wire + encode_infer_request(
                inputs, model=model, outputs=outputs, request_id=request_id
            )
            metadata = tuple(self.headers.items()) or None
            call = self._raw_infer(body, timeout=self.timeout_s, metadata=metadata)
            result = self._module.InferResult(await self._call(what, call))
            return {n: result.as_numpy(n) for n in outputs}
        shared = prepared.infer_inputs if prepared is not None else ()
        infer_inputs = [*shared, *build_infer_inputs(self._module, inputs, http=self.is_http)]
        if self.is_http:
            # the session's total timeout (conn_timeout) bounds each HTTP request
            requested = [self._module.InferRequestedOutput(n, binary_data=True) for n in outputs]
            kwargs: dict[str, Any] = {}
        else:
            requested = [self._module.InferRequestedOutput(n) for n in outputs]
            kwargs = {"client_timeout": self.timeout_s}
        result = await self._call(
            what,
            self._client.infer(
                model,
                infer_inputs,
                outputs=requested,
                request_id=request_id,
                headers=self.request_headers(inputs),
                **kwargs,
            ),
        )
        return {n: result.as_numpy(n) for n in outputs}

    async def close(self) -> None:
        """Close the connection (idempotent)."""
        # closing a broken connection must not mask the error that broke it
        with contextlib.suppress(Exception):
            await self._client.close()
