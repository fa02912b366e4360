"""What both clients do on start-up: check the server, then learn what it serves."""

from __future__ import annotations

from dataclasses import dataclass

from triton_sam.client import prompts, session_path
from triton_sam.client.transport import Transport
from triton_sam.errors import ServerUnavailableError
from triton_sam.models.spec import FamilySpec


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
    transport: Transport,
    family: FamilySpec,
    encoder_model: str,
    decoder_model: str,
    session_model: str,
    use_server_embeddings: bool | None,
) -> ServedModels:
    """Check the server and both models are ready, then resolve layout and session path.

    Raises:
        ServerUnavailableError: no ready server at the address, a model not ready, or
            ``use_server_embeddings=True`` with no session model on the server.
        UnsupportedModelError: the server's decoder matches none of the family's layouts.
    """
    _check_ready(transport, (encoder_model, decoder_model))

    def decoder_inputs() -> set[str]:
        meta = transport.model_metadata(decoder_model)
        return {t["name"] for t in meta.get("inputs", [])}

    family, session_model = prompts.layout_on_server(family, session_model, decoder_inputs)
    offered = session_path.session_offered(transport, session_model, use_server_embeddings)
    return ServedModels(family, session_model, offered)


def connect_concepts(transport: Transport, serving_model: str) -> None:
    """Check the server and a concept family's serving model are ready.

    Raises:
        ServerUnavailableError: no ready server at the address, or the model not ready.
    """
    _check_ready(transport, (serving_model,))


def _check_ready(transport: Transport, models: tuple[str, ...]) -> None:
    address, protocol = transport.endpoint.address, transport.endpoint.protocol
    if not transport.is_server_ready():
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
        if not transport.is_model_ready(model):
            raise ServerUnavailableError(
                f"model: {model!r} is not ready on {address}; export it with "
                "`triton-sam setup` and check the server log"
            )
