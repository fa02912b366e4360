"""The client's conversations with the server, written once and run by a sync or async shell.

A flow is a generator that yields :class:`Step` values (one transport call each) and receives
each call's result; when a call raises, the exception is thrown into the flow at its
``yield``, so the flow's own ``try``/``except`` decides (an embedding miss: embed again and
resend). :func:`run` drives a flow with a blocking transport, :func:`arun` with an asyncio
one: the clients differ only in which runner they use, as tritonclient's ``grpc`` and
``grpc.aio`` share ``grpc/_utils`` for their requests.

Flows here (those of start-up, server and models ready, are in
:mod:`triton_sam.client.startup`):

- :func:`embed`: probe → embed on a miss (server-side embeddings);
- :func:`click`: one click on the session model → re-embed on a miss → resend the fallback
  (the mask itself instead of a reference to kept logits);
- :func:`encode`: the stateless encoder; :func:`set_image`: either path for a new image;
  :func:`load_image`: the user's image read once (a ``local`` step), then :func:`set_image`;
- :func:`predict`: one prompt, on the session model (:func:`click`) or the stateless decoder.

Every call is idempotent (an embed and a probe are, a click only adds logits under a fresh key
the server issues, of which it keeps a few per image, and the stateless models keep no state),
so both runners retry all of them on transport errors.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from triton_sam.client import embedding_path, image_io, model_frame, prompts
from triton_sam.client.decode_request import Click, DecodeRequest, EncodedImage
from triton_sam.client.prediction import Prediction, make_prediction
from triton_sam.errors import EmbeddingNotFoundError
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
            ``"model_metadata"`` (methods both transports have); ``"local"``: no call, the
            step's result is ``build()`` (work on this side, such as reading a file, that the
            async runner runs off the event loop).
        args: the call's arguments.
        build: for ``infer``: makes the inputs when they are costly (an image to
            preprocess); the async runner calls it off the event loop. ``args[1]`` is None.
            For ``local``: the work itself.
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


def local(work: Callable[[], T]) -> Step:
    """A ``local`` step: ``work()`` on this side (the async runner runs it in a thread)."""
    return Step(LOCAL, (), build=work)


LOCAL = "local"


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


def sender(transport: Any, timings: dict[str, float] | None = None) -> Callable[[Step], Any]:
    """``send`` for :func:`run` over a blocking ``Transport`` (bytes sent are the transport's
    to observe: its ``on_request`` hook).

    Args:
        transport: the blocking transport.
        timings: each step's milliseconds are added to ``timings[label]`` (failed calls
            too; building inputs to ``timings["preprocess"]``).
    """

    def send(step: Step) -> Any:
        if step.method == LOCAL:
            return step.build()  # type: ignore[misc]
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
            return transport.infer(*args, idempotent=True)
        finally:
            _add(timings, step.label, t0)

    return send


def async_sender(transport: Any, request_id: str = "") -> Callable[[Step], Awaitable[Any]]:
    """``send`` for :func:`arun` over an ``AsyncTransport`` (inputs built in a thread)."""

    async def send(step: Step) -> Any:
        if step.method == LOCAL:
            return await asyncio.to_thread(step.build)  # type: ignore[arg-type]
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


def load_image(
    image: Any, family: FamilySpec, encoder_model: str, session_model: str, on_server: bool
) -> Flow[EncodedImage]:
    """A new image as the user gave it (a path, bytes, PIL image or HxWx3 uint8 array): read
    once on this side (a ``local`` step, off the event loop for :func:`arun`), then
    :func:`set_image` (kept by the server when ``on_server``, else encoded).

    Raises:
        InputValidationError: the image cannot be read or has the wrong shape/dtype.
    """
    read = functools.partial(_read_source, image, family, encoder_model, session_model, on_server)
    source = yield local(read)
    return (yield from set_image(source, family, encoder_model, session_model))


def _read_source(
    image: Any, family: FamilySpec, encoder_model: str, session_model: str, on_server: bool
) -> np.ndarray | embedding_path.CachedImage:
    """The image read once, as :func:`set_image` sends it: the file's bytes go with its
    content id (hashing the pixels costs milliseconds) when the server keeps features."""
    rgb, encoded = image_io.read_image(image, keep_bytes=on_server)
    if not on_server:
        return rgb
    return embedding_path.CachedImage.of(rgb, family, encoder_model, session_model, encoded)


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
