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
  (the mask itself instead of a reference to kept logits);
- :func:`encode`: the stateless encoder; :func:`set_image`: either path for a new image;
- :func:`predict`: one prompt, on the session model (:func:`click`) or the stateless decoder.

Every call is idempotent (an embed and a probe are, a click only adds logits under a fresh key
the server issues, of which it keeps a few per image, and the stateless models keep no state),
so both runners retry all of them on transport errors.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from triton_sam.client import embedding_path, model_frame, prompts
from triton_sam.client.decode_request import Click, DecodeRequest, EncodedImage
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
        image: for ``infer`` on the stateless decoder: the image whose features go with the
            inputs (the async runner sends them as prepared once per transport).
    """

    method: str
    args: tuple[Any, ...]
    build: Callable[[], Inputs] | None = field(default=None, compare=False)
    label: str = ""
    image: EncodedImage | None = field(default=None, compare=False)


Flow = Generator[Step, Any, T]


def infer(
    model: str,
    inputs: Inputs | Callable[[], Inputs],
    outputs: tuple[str, ...],
    label: str,
    image: EncodedImage | None = None,
) -> Step:
    """An ``infer`` step; ``inputs`` may be a function making them (see :attr:`Step.build`),
    ``image`` the features sent with them (see :attr:`Step.image`)."""
    if callable(inputs):
        return Step("infer", (model, None, outputs), build=inputs, label=label, image=image)
    return Step("infer", (model, inputs, outputs), label=label, image=image)


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
            if step.image is not None:
                args = (args[0], {**step.image.features, **args[1]}, args[2])
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
        if step.method != "infer":
            return await getattr(transport, step.method)(*args)
        options: dict[str, Any] = {"request_id": request_id, "idempotent": True}
        if step.image is not None:
            options["prepared"] = step.image.prepared_for(transport)
        return await transport.infer(*args, **options)

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
    yield from check_ready_models(endpoint, models)


def check_ready_models(endpoint: Endpoint, models: tuple[str, ...]) -> Flow[None]:
    """``models`` are ready.

    Raises:
        ServerUnavailableError: one is not.
    """
    for model in models:
        if not (yield Step("is_model_ready", (model,))):
            raise _not_ready(model, endpoint.address)


def _not_ready(model: str, address: str) -> ServerUnavailableError:
    return ServerUnavailableError(
        f"model: {model!r} is not ready on {address}; export it with "
        "`triton-sam setup` and check the server log"
    )


def own_encoder(endpoint: Endpoint, encoder_model: str) -> Flow[str]:
    """The encoder this client encodes with: ``encoder_model``, or, when that name is an entry
    model for another client's pixel contract (a Triton ensemble, as ``triton-sam setup
    paintera`` writes ``sam1_encoder``), our normalised encoder beside it
    (:func:`~triton_sam.repository.entry.normalized_name`). One metadata call in place of
    the encoder's readiness check (Triton answers metadata for ready models only).

    Raises:
        ServerUnavailableError: the encoder is not ready, or it is an entry model and its
            normalised encoder is not on the server.
    """
    from triton_sam.models.naming import ENSEMBLE_PLATFORM, normalized_name

    try:
        meta = yield Step("model_metadata", (encoder_model,))
    except ServerUnavailableError as e:  # unknown or unloaded model
        raise _not_ready(encoder_model, endpoint.address) from e
    if meta.get("platform") != ENSEMBLE_PLATFORM:
        return encoder_model
    own = normalized_name(encoder_model)
    try:
        ready = yield Step("is_model_ready", (own,))
    except ServerUnavailableError:
        ready = False
    if not ready:
        raise ServerUnavailableError(
            f"model: {encoder_model!r} on {endpoint.address} is an entry model for another "
            f"client's pixel contract (a Triton ensemble) and {own!r}, the encoder it runs, "
            "is not ready; rebuild with `triton-sam setup paintera` (it writes both), or "
            "pass encoder_model= naming an encoder of this family"
        )
    return own


@dataclass(frozen=True)
class ServedModels:
    """The models a client talks to, as the server offers them.

    Attributes:
        family: the family spec, resolved to the decoder layout the server has (SAM3: our
            export or the imported onnx-community pair).
        session_model: the ``<family>_session`` model name for that layout.
        uses_server_embeddings: whether clicks go through the session model.
        encoder_model: the encoder for the client's own stateless encodes (see
            :func:`own_encoder`).
    """

    family: FamilySpec
    session_model: str
    uses_server_embeddings: bool
    encoder_model: str = ""


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
    yield from check_ready(endpoint, ())
    encoder_model = yield from own_encoder(endpoint, encoder_model)
    yield from check_ready_models(endpoint, (decoder_model,))
    if family.alternates:  # served under several contracts: ask the server which
        meta = yield Step("model_metadata", (decoder_model,))
        names = {t["name"] for t in meta.get("inputs", [])}
        family, session_model = prompts.layout_on_server(family, session_model, lambda: names)
    if use_server_embeddings is False:
        return ServedModels(family, session_model, False, encoder_model)
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
    return ServedModels(family, session_model, bool(ready), encoder_model)


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


def click(
    image: embedding_path.CachedImage, family: FamilySpec, model: str, request: Click
) -> Flow[Prediction]:
    """One click: the session model; on a miss (the image, or the kept logits it refers to),
    embed again and resend the fallback (the mask itself) once."""
    try:
        out = yield infer(model, request.inputs, request.outputs, "decode")
    except EmbeddingNotFoundError:  # evicted, or the server restarted
        yield from _embed(image, family, model)
        fallback = image.with_current_id(request.fallback)
        out = yield infer(model, fallback, request.outputs, "decode")
    masks, scores = prompts.select_outputs(out, request.multimask, family)
    prediction = make_prediction(masks, scores, image.orig_hw, family.preprocessing)
    key = embedding_path.issued_key(out)
    if key is not None:
        image.remember(key, prediction.low_res_logits)
    return prediction


def encode(rgb: np.ndarray, family: FamilySpec, model: str) -> Flow[EncodedImage]:
    """The stateless encoder on ``rgb`` (HxWx3 uint8): the image with its features here."""
    name = family.encoder_inputs[0].name

    def inputs() -> Inputs:
        return {name: model_frame.preprocess(rgb, family.preprocessing)}

    features = yield infer(model, inputs, family.embedding_names, "encode")
    return EncodedImage(features, (int(rgb.shape[0]), int(rgb.shape[1])))


def set_image(
    source: np.ndarray | embedding_path.CachedImage,
    family: FamilySpec,
    encoder_model: str,
    session_model: str,
) -> Flow[EncodedImage]:
    """A new image: kept by the server when ``source`` is a ``CachedImage`` (:func:`embed`),
    else encoded by the stateless encoder (:func:`encode`; ``source`` is the RGB array)."""
    if isinstance(source, embedding_path.CachedImage):
        yield from embed(source, family, session_model)
        return EncodedImage({}, source.orig_hw, cached=source)
    return (yield from encode(source, family, encoder_model))


def predict(
    request: DecodeRequest, family: FamilySpec, decoder_model: str, session_model: str
) -> Flow[Prediction]:
    """One prompt: a :func:`click` on the session model when the server keeps the image,
    else the stateless decoder with the image's features."""
    image = request.image
    if request.click is not None:
        assert image.cached is not None
        return (yield from click(image.cached, family, session_model, request.click))
    out = yield infer(decoder_model, request.inputs, request.outputs, "decode", image=image)
    masks, scores = prompts.select_outputs(out, request.multimask, family)
    return make_prediction(masks, scores, image.orig_hw, family.preprocessing)


_ENCODED = (embedding_cache.ENCODED,)
_EMBED_OUTPUTS = embedding_path.EMBED_OUTPUTS  # encoded, and the id the server computed
