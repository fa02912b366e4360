"""The clients' start-up, as flows (see :mod:`triton_sam.client.flow`): the server and the
models ready, the encoder this client encodes with, the decoder layout the server has and
whether it offers the session model.
"""

from __future__ import annotations

from dataclasses import dataclass

from triton_sam.client import prompts
from triton_sam.client.endpoint import Endpoint
from triton_sam.client.flow import Flow, Step
from triton_sam.errors import ServerUnavailableError
from triton_sam.models.spec import FamilySpec


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
