"""The client's conversations with the server, written once and run by a sync or async shell.

A flow is a generator that yields :class:`Step` values (one transport call each) and receives
each call's result; when a call raises, the exception is thrown into the flow at its
``yield``, so the flow's own ``try``/``except`` decides (an embedding miss: embed again and
resend). :func:`run` drives a flow with a blocking transport, :func:`arun` with an asyncio
one: the clients differ only in which runner they use, as tritonclient's ``grpc`` and
``grpc.aio`` share ``grpc/_utils`` for their requests.

Flows here:

- :func:`connect`: server ready, models ready, decoder layout, session model offered;
- :func:`embed`: probe → embed on a miss (server-side embeddings);
- :func:`click`: one click on the session model → re-embed on a miss → resend the fallback
  (the mask itself instead of a reference to kept logits).

Every session-model call is idempotent (an embed and a probe are, and a click only (re)writes
its own logits key), so both runners retry all of them on transport errors.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from triton_sam.client import embedding_path, prompts
from triton_sam.client.prediction import Prediction, make_prediction
from triton_sam.client.transport import Endpoint
from triton_sam.errors import EmbeddingNotFoundError, ServerUnavailableError
from triton_sam.models.spec import FamilySpec
from triton_sam.serving.protocol import embedding_cache

T = TypeVar("T")
Inputs = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Step:
    """One transport call: ``transport.<method>(*args)``; for ``infer`` the args are
    ``(model, inputs, outputs)`` and the call is made ``idempotent`` (retried).

    Attributes:
        method: ``"infer"``, ``"is_server_ready"``, ``"is_model_ready"`` or
            ``"model_metadata"`` (methods both transports have).
        args: the call's arguments.
        build: for ``infer``: makes the inputs when they are costly (an image to
            preprocess); the async runner calls it off the event loop. ``args[1]`` is None.
        label: what the call is, for timings (``"probe"``, ``"encode"``, ``"decode"``).
    """

    method: str
    args: tuple[Any, ...]
    build: Callable[[], Inputs] | None = field(default=None, compare=False)
    label: str = ""


Flow = Generator[Step, Any, T]


def infer(
    model: str,
    inputs: Inputs | Callable[[], Inputs],
    outputs: tuple[str, ...],
    label: str,
) -> Step:
    """An ``infer`` step; ``inputs`` may be a function making them (see :attr:`Step.build`)."""
    if callable(inputs):
        return Step("infer", (model, None, outputs), build=inputs, label=label)
    return Step("infer", (model, inputs, outputs), label=label)


# -- runners ---------------------------------------------------------------------------------
def run(flow: Flow[T], send: Callable[[Step], Any]) -> T:
    """Drive ``flow`` to its end with the blocking ``send`` (see :func:`sender`)."""
    outcome: _Outcome = (None, None)
    while not isinstance(step := _resume(flow, outcome), _Done):
        try:
            outcome = (send(step), None)
        except Exception as e:  # the flow decides: handled at its yield, or re-raised
            outcome = (None, e)
    return step.value


async def arun(flow: Flow[T], send: Callable[[Step], Awaitable[Any]]) -> T:
    """Drive ``flow`` to its end with the asyncio ``send`` (see :func:`async_sender`)."""
    outcome: _Outcome = (None, None)
    while not isinstance(step := _resume(flow, outcome), _Done):
        try:
            outcome = (await send(step), None)
        except Exception as e:  # never asyncio.CancelledError: a cancel ends the flow
            outcome = (None, e)
    return step.value


_Outcome = tuple[Any, Exception | None]  # the last step's result, or its error


@dataclass(frozen=True)
class _Done:
    value: Any


def _resume(flow: Flow[Any], outcome: _Outcome) -> Step | _Done:
    """Hand the last step's result (or throw its error) into ``flow``: its next step, or
    :class:`_Done` with what it returned."""
    value, error = outcome
    try:
        return flow.send(value) if error is None else flow.throw(error)
    except StopIteration as stop:
        return _Done(stop.value)


def sender(
    transport: Any,
    timings: dict[str, float] | None = None,
    *,
    observe: Callable[[str, Any, tuple[str, ...]], None] | None = None,
) -> Callable[[Step], Any]:
    """``send`` for :func:`run` over a blocking ``Transport``.

    Args:
        transport: the blocking transport.
        timings: each step's milliseconds are added to ``timings[label]`` (failed calls
            too; building inputs to ``timings["preprocess"]``).
        observe: called with ``(model, inputs, outputs)`` of every ``infer`` it sends.
    """

    def send(step: Step) -> Any:
        t0 = time.perf_counter()
        args = step.args
        if step.build is not None:
            args = (args[0], step.build(), args[2])
            _add(timings, "preprocess", t0)
            t0 = time.perf_counter()
        try:
            if step.method != "infer":
                return getattr(transport, step.method)(*args)
            if observe is not None:
                observe(*args)
            return transport.infer(*args, idempotent=True)
        finally:
            _add(timings, step.label, t0)

    return send


def async_sender(transport: Any, request_id: str = "") -> Callable[[Step], Awaitable[Any]]:
    """``send`` for :func:`arun` over an ``AsyncTransport`` (inputs built in a thread)."""

    async def send(step: Step) -> Any:
        args = step.args
        if step.build is not None:
            args = (args[0], await asyncio.to_thread(step.build), args[2])
        if step.method == "infer":
            return await transport.infer(*args, request_id=request_id, idempotent=True)
        return await getattr(transport, step.method)(*args)

    return send


def _add(timings: dict[str, float] | None, label: str, t0: float) -> None:
    if timings is not None and label:
        timings[label] = timings.get(label, 0.0) + (time.perf_counter() - t0) * 1e3


# -- flows -----------------------------------------------------------------------------------
def check_ready(endpoint: Endpoint, models: tuple[str, ...]) -> Flow[None]:
    """The server and ``models`` are ready.

    Raises:
        ServerUnavailableError: no ready server at the address (with a hint when the port is
            the other protocol's), or a model not ready.
    """
    address, protocol = endpoint.address, endpoint.protocol
    if not (yield Step("is_server_ready", ())):
        hint = ""
        if protocol == "grpc" and address.endswith(":8000"):
            hint = " (8000 is Triton's HTTP port: use port 8001 or protocol='http')"
        elif protocol == "http" and address.endswith(":8001"):
            hint = " (8001 is Triton's gRPC port: use port 8000 or protocol='grpc')"
        raise ServerUnavailableError(
            f"url: no ready Triton server at {address} ({protocol}){hint}; start one "
            "with `triton-sam serve` or `docker compose up -d`, or set TRITON_URL"
        )
    for model in models:
        if not (yield Step("is_model_ready", (model,))):
            raise ServerUnavailableError(
                f"model: {model!r} is not ready on {address}; export it with "
                "`triton-sam setup` and check the server log"
            )


@dataclass(frozen=True)
class ServedModels:
    """The models a client talks to, as the server offers them.

    Attributes:
        family: the family spec, resolved to the decoder layout the server has (SAM3: our
            export or the imported onnx-community pair).
        session_model: the ``<family>_session`` model name for that layout.
        uses_server_embeddings: whether clicks go through the session model.
    """

    family: FamilySpec
    session_model: str
    uses_server_embeddings: bool


def connect(
    endpoint: Endpoint,
    family: FamilySpec,
    encoder_model: str,
    decoder_model: str,
    session_model: str,
    use_server_embeddings: bool | None,
) -> Flow[ServedModels]:
    """Check the server and both models, then resolve the decoder layout and session path.

    Raises:
        ServerUnavailableError: no ready server, a model not ready, or
            ``use_server_embeddings=True`` with no session model on the server.
        UnsupportedModelError: the server's decoder matches none of the family's layouts.
    """
    yield from check_ready(endpoint, (encoder_model, decoder_model))
    if family.alternates:  # served under several contracts: ask the server which
        meta = yield Step("model_metadata", (decoder_model,))
        names = {t["name"] for t in meta.get("inputs", [])}
        family, session_model = prompts.layout_on_server(family, session_model, lambda: names)
    if use_server_embeddings is False:
        return ServedModels(family, session_model, False)
    try:
        ready = yield Step("is_model_ready", (session_model,))
    except ServerUnavailableError:  # unknown model (ModelNotReadyError)
        ready = False
    if use_server_embeddings and not ready:
        raise ServerUnavailableError(
            f"model: {session_model!r} is not ready on {endpoint.address}; "
            "rebuild the repository with `triton-sam setup` (it writes the session model) "
            "or pass use_server_embeddings=False"
        )
    return ServedModels(family, session_model, bool(ready))


def embed(image: embedding_path.CachedImage, family: FamilySpec, model: str) -> Flow[None]:
    """Make sure the server holds ``image``: a probe of a few bytes, the image on a miss.

    The probe names the id the client expects; an embed sends the image (file bytes or uint8
    pixels) and adopts the id the server computed from what it received."""
    try:
        yield infer(model, embedding_path.probe_inputs(image.image_id), _ENCODED, "probe")
    except EmbeddingNotFoundError:
        yield from _embed(image, family, model)


def _embed(image: embedding_path.CachedImage, family: FamilySpec, model: str) -> Flow[None]:
    out = yield infer(model, lambda: image.embed_inputs(family), _EMBED_OUTPUTS, "encode")
    image.adopt(out)


@dataclass(frozen=True)
class Click:
    """One validated click for the session model (:meth:`CachedImage.click_inputs`).

    Attributes:
        logits_key: where the server keeps this click's low-res logits.
        inputs: the request (may refer to kept logits instead of carrying the mask).
        fallback: the request to resend after a miss (carries the mask itself).
        outputs: the (masks, scores) outputs of the family's layout.
        multimask: three candidate masks instead of one.
    """

    logits_key: str
    inputs: dict[str, np.ndarray]
    fallback: dict[str, np.ndarray]
    outputs: tuple[str, str]
    multimask: bool


def click(
    image: embedding_path.CachedImage, family: FamilySpec, model: str, request: Click
) -> Flow[Prediction]:
    """One click: the session model; on a miss, embed again and resend the fallback once."""
    try:
        out = yield infer(model, request.inputs, request.outputs, "decode")
    except EmbeddingNotFoundError:  # evicted, or the server restarted
        yield from _embed(image, family, model)
        fallback = image.with_current_id(request.fallback)
        out = yield infer(model, fallback, request.outputs, "decode")
    masks, scores = prompts.select_outputs(out, request.multimask, family)
    prediction = make_prediction(masks, scores, image.orig_hw, family.preprocessing)
    image.remember(request.logits_key, prediction.low_res_logits)
    return prediction


def click_request(
    image: embedding_path.CachedImage,
    family: FamilySpec,
    decoder_prompts: dict[str, np.ndarray],
    mask_input: Any,
    multimask: bool,
) -> Click:
    """The :class:`Click` of validated ``decoder_prompts`` (``prompts.build_decoder_prompts``)."""
    key, inputs, fallback = image.click_inputs(decoder_prompts, mask_input)
    outputs = prompts.output_names(multimask, family)
    return Click(key, inputs, fallback, outputs, bool(multimask))


_ENCODED = (embedding_cache.ENCODED,)
_EMBED_OUTPUTS = embedding_path.EMBED_OUTPUTS  # encoded, and the id the server computed
