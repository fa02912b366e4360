"""Segment everything through the served ``<family>_everything`` model (gRPC stream).

The model is decoupled (:mod:`triton_sam.serving.protocol.everything`): one request on a
gRPC stream answers progress responses, then the instances. :func:`generate` drives it with
tritonclient's blocking stream, :func:`agenerate` with ``grpc.aio``; both share the request
builder (:func:`job_inputs`) and the answer parser (:func:`parse_answer`).

Cancellation reaches the server: leaving :func:`generate` early (an exception from the
``progress`` callback, ``KeyboardInterrupt``) stops the stream with ``cancel_requests=True``,
and cancelling the task awaiting :func:`agenerate` closes its ``grpc.aio`` stream; either
way Triton marks the request cancelled and the model stops before its next decoder batch.
"""

from __future__ import annotations

import json
import os
import queue
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

import numpy as np

from triton_sam.client.endpoint import Endpoint, TlsOptions
from triton_sam.client.image_io import load_image
from triton_sam.client.wire import build_infer_inputs
from triton_sam.errors import (
    EmbeddingNotFoundError,
    InputValidationError,
    InvalidRequestError,
    RequestCancelledError,
    ServerError,
    ServerOverloadedError,
    ServerUnavailableError,
)
from triton_sam.serving import everything, masks
from triton_sam.serving import protocol as envelope
from triton_sam.serving.bounds import RequestError
from triton_sam.serving.protocol import everything as protocol

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11

Progress = Callable[[int, int], Any]  # (done_batches, total_batches)
_R = TypeVar("_R")


class StreamOptions(TypedDict, total=False):
    """The keywords :func:`generate` and :func:`agenerate` take, each optional.

    Attributes:
        progress: called ``progress(done_batches, total_batches)`` after each decoder batch.
        timeout_s: for the whole stream and for each answer (None: no limit).
        tls: certificates for a ``grpcs://`` endpoint.
        headers: gRPC metadata sent with the request (e.g. the tenant header).
    """

    progress: Progress | None
    timeout_s: float | None
    tls: TlsOptions | None
    headers: Mapping[str, str] | None


@dataclass(frozen=True)
class EverythingResult:
    """Every instance of one image, as the official generator's ``coco_rle`` mode gives them.

    Attributes:
        image_size: (H, W) of the image.
        instances: COCO records (``segmentation`` {size, counts}, ``bbox`` [x, y, w, h],
            ``area``, ``predicted_iou``, ``stability_score``, ``point_coords`` [[x, y]],
            ``crop_box`` [x, y, w, h]), in the official generator's order.
    """

    image_size: tuple[int, int]
    instances: list[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.instances)

    def masks(self) -> np.ndarray:
        """The instances' masks, bool [N, H, W] (decoded from their RLE)."""
        h, w = self.image_size
        out = np.zeros((len(self.instances), h, w), bool)
        for i, record in enumerate(self.instances):
            out[i] = masks.decode_rle(record["segmentation"]["counts"], (h, w))
        return out


def check_params(family: str, params: Mapping[str, Any]) -> str:
    """``params`` checked as the server checks them, as the JSON text the request carries.

    Raises:
        InputValidationError: naming ``params.<key>`` (unknown key, wrong type, out of bounds).
    """
    try:
        everything.parse_params(family, dict(params))
    except RequestError as e:
        raise InputValidationError(e.field, str(e).split(": ", 1)[-1]) from e
    return json.dumps(dict(params), separators=(",", ":"))


def job_model(family: Any, model_type: str, session_model: str) -> str:
    """The everything model beside ``session_model`` for a client of ``family`` (a
    ``FamilySpec``).

    Raises:
        UnsupportedModelError: a family without one (SAM3, concepts).
    """
    from triton_sam.errors import UnsupportedModelError

    if getattr(family, "family", None) not in everything.FAMILIES or not hasattr(
        family, "prompt_layout"
    ):
        raise UnsupportedModelError(
            f"model_type: {model_type!r} has no segment-everything model (SAM1 and SAM2.1 have)"
        )
    return protocol.model_name(session_model)


def job_inputs(image: Any = None, *, image_id: str | None = None, params_json: str = "{}"):
    """The request's inputs (name -> array): a file's bytes for a path (decoded on the
    server, smaller on the wire), uint8 pixels for an array / PIL image, or an ``image_id``
    the session model answered (nothing sent again)."""
    inputs: dict[str, np.ndarray] = {
        protocol.PARAMS: np.array([params_json.encode("utf-8")], dtype=np.object_)
    }
    if image_id is not None:
        inputs[protocol.IMAGE_ID] = np.array([image_id.encode("utf-8")], dtype=np.object_)
    elif isinstance(image, str | os.PathLike):
        data = Path(image).read_bytes()
        inputs[protocol.IMAGE_BYTES] = np.array([data], dtype=np.object_)
    else:
        inputs[protocol.IMAGE_RGB] = load_image(image)
    return inputs


def job_requests(
    image: Any, cached: Any, params_json: str
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None]:
    """(inputs, fallback) of a job: on ``image`` when given, else on the client's current
    image kept by the server (``cached``, an ``embedding_path.CachedImage``): its id first,
    its pixels as the fallback for a miss (evicted, or the server restarted).

    Raises:
        ImageNotSetError: no image, and the current one is not kept (stateless path).
    """
    from triton_sam.errors import ImageNotSetError

    if image is not None:
        return job_inputs(image, params_json=params_json), None
    if cached is None or cached.rgb is None:
        raise ImageNotSetError(
            "image: none given, and the current image is not kept by the server (stateless "
            "decoder path); pass the image to generate_masks(image)"
        )
    first = job_inputs(image_id=cached.image_id, params_json=params_json)
    return first, job_inputs(cached.rgb, params_json=params_json)


def parse_answer(text: bytes | str) -> EverythingResult:
    """The final response's ``instances`` JSON as an :class:`EverythingResult`."""
    answer = json.loads(text)
    h, w = (int(v) for v in answer["image_size"])
    return EverythingResult((h, w), list(answer["instances"]))


def stream_error(message: str) -> Exception:
    """The package error of an error the stream carried (a protocol code in its message)."""
    code = envelope.error_code(message)
    kinds = {
        envelope.ERR_INVALID_INPUT: InvalidRequestError,
        envelope.ERR_LIMIT: InvalidRequestError,
        envelope.ERR_EMBEDDING_NOT_FOUND: EmbeddingNotFoundError,
        envelope.ERR_OVERLOADED: ServerOverloadedError,
        envelope.ERR_CANCELLED: RequestCancelledError,
    }
    if code is None and "unknown model" in message.lower():
        return ServerUnavailableError(f"segment everything: {message}")
    return kinds.get(code, ServerError)(f"segment everything: {message}")


def grpc_endpoint(endpoint: Endpoint, grpc_url: str | None) -> Endpoint:
    """The gRPC endpoint of the server (the model streams over gRPC only): ``grpc_url``,
    the client's own endpoint when it speaks gRPC, else Triton's default gRPC port beside
    an HTTP endpoint on its default port.

    Raises:
        InputValidationError: (``grpc_url``) an HTTP endpoint on another port, no gRPC URL.
    """
    from triton_sam.client.endpoint import DEFAULT_PORTS, resolve_endpoint

    if grpc_url is not None:
        return resolve_endpoint(grpc_url, "grpc")
    if endpoint.protocol == "grpc":
        return endpoint
    host, _, port = endpoint.address.rpartition(":")
    if port != str(DEFAULT_PORTS["http"]):
        raise InputValidationError(
            "grpc_url",
            f"segment everything streams over gRPC; the client speaks HTTP on "
            f"{endpoint.address}: pass grpc_url='host:port' of the server's gRPC port",
        )
    return Endpoint(f"{host}:{DEFAULT_PORTS['grpc']}", "grpc", endpoint.ssl)


def job_target(
    family: Any,
    model_type: str,
    session_model: str,
    params: Mapping[str, Any],
    endpoint: Endpoint,
    grpc_url: str | None,
) -> tuple[str, str, Endpoint]:
    """What a client's ``generate_masks`` sends to: the job model, the checked parameters
    (JSON) and the gRPC endpoint, checked in that order before anything is sent.

    Raises:
        UnsupportedModelError: a family without a segment-everything model.
        InputValidationError: a bad parameter (``params.<key>``) or ``grpc_url``.
    """
    model = job_model(family, model_type, session_model)
    params_json = check_params(family.family, params)
    return model, params_json, grpc_endpoint(endpoint, grpc_url)


def with_fallback(
    run: Callable[[dict[str, np.ndarray]], _R],
    first: dict[str, np.ndarray],
    fallback: dict[str, np.ndarray] | None,
) -> _R:
    """``run(first)``; when the server no longer holds the image it names (evicted, or the
    server restarted), ``run(fallback)`` with the pixels; with no fallback the error stands."""
    try:
        return run(first)
    except EmbeddingNotFoundError:
        if fallback is None:
            raise
        return run(fallback)


async def awith_fallback(
    run: Callable[[dict[str, np.ndarray]], Awaitable[_R]],
    first: dict[str, np.ndarray],
    fallback: dict[str, np.ndarray] | None,
) -> _R:
    """:func:`with_fallback` for a coroutine function ``run``."""
    try:
        return await run(first)
    except EmbeddingNotFoundError:
        if fallback is None:
            raise
        return await run(fallback)


def generate(
    endpoint: Endpoint,
    model: str,
    inputs: Mapping[str, np.ndarray],
    **options: Unpack[StreamOptions],
) -> EverythingResult:
    """Run one job on a blocking gRPC stream; ``progress(done, total)`` after each batch.

    Args:
        endpoint: the server's gRPC endpoint.
        model: the everything model's name.
        inputs: the request (:func:`job_inputs`).
        **options: :class:`StreamOptions` (``progress``, ``timeout_s``, ``tls``, ``headers``).

    Raises:
        InvalidRequestError: refused parameters or image (the message names the field).
        EmbeddingNotFoundError: an ``image_id`` the server does not hold for this tenant.
        ServerOverloadedError: the server's job slots and waiting line are full.
        ServerUnavailableError / InferenceTimeoutError / ServerError: as the transport's.
        Whatever ``progress`` raises (the job is cancelled on the server first).
    """
    import tritonclient.grpc as grpcclient

    opts = _Stream(**options)
    try:
        client = opts.connect(grpcclient, endpoint)
    except Exception as e:
        raise ServerUnavailableError(f"segment everything: {e}") from e
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    finished = False
    try:
        client.start_stream(
            callback=lambda result, error: answers.put((result, error)),
            stream_timeout=opts.timeout_s,
            headers=opts.metadata(),
        )
        client.async_stream_infer(model, build_infer_inputs(grpcclient, inputs, http=False))
        while True:
            result, error = answers.get(timeout=opts.timeout_s)
            finished = error is not None  # the server ended the job with an error
            done = opts.answer(result, error)
            if done is not None:
                finished = True
                return done
    except queue.Empty as e:
        from triton_sam.errors import InferenceTimeoutError

        raise InferenceTimeoutError(f"segment everything: no answer in {opts.timeout_s} s") from e
    finally:
        # Leaving early (progress raised, Ctrl-C, a timeout): the server stops the job.
        try:
            client.stop_stream(cancel_requests=not finished)
        finally:
            client.close()


@dataclass(frozen=True)
class _Stream:
    """:class:`StreamOptions` with their defaults (an unknown keyword is a TypeError), and
    what both drivers do with them."""

    progress: Progress | None = None
    timeout_s: float | None = None
    tls: TlsOptions | None = None
    headers: Mapping[str, str] | None = None

    def connect(self, module: Any, endpoint: Endpoint) -> Any:
        """``module.InferenceServerClient`` (tritonclient's gRPC or gRPC aio) to ``endpoint``."""
        tls_options = (self.tls or TlsOptions()).grpc_options() if endpoint.ssl else {}
        return module.InferenceServerClient(endpoint.address, ssl=endpoint.ssl, **tls_options)

    def metadata(self) -> dict[str, str] | None:
        return dict(self.headers or {}) or None

    def answer(self, result: Any, error: Any) -> EverythingResult | None:
        """One answer on the stream: its error raised, progress reported (None), or the
        final result."""
        if error is not None:
            raise stream_error(error.message() if hasattr(error, "message") else str(error))
        text = result.as_numpy(protocol.INSTANCES)
        if text is not None:
            return parse_answer(text.reshape(-1)[0])
        step = result.as_numpy(protocol.PROGRESS)
        if step is not None and self.progress is not None:
            self.progress(int(step[0]), int(step[1]))
        return None


async def agenerate(
    endpoint: Endpoint,
    model: str,
    inputs: Mapping[str, np.ndarray],
    **options: Unpack[StreamOptions],
) -> EverythingResult:
    """:func:`generate` over ``grpc.aio``; cancelling the awaiting task cancels the job on
    the server (the stream is closed, Triton cancels the request)."""
    import tritonclient.grpc.aio as aioclient

    opts = _Stream(**options)
    client = opts.connect(aioclient, endpoint)
    request = {"model_name": model, "inputs": build_infer_inputs(aioclient, inputs, http=False)}

    async def requests():
        yield request

    stream = client.stream_infer(requests(), stream_timeout=opts.timeout_s, headers=opts.metadata())
    try:
        async for result, error in stream:
            done = opts.answer(result, error)
            if done is not None:
                return done
        raise ServerError("segment everything: the stream ended without an answer")
    finally:
        stream.cancel()  # a no-op once answered; else Triton cancels the job
        await client.close()
