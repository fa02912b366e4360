"""What both clients do on start-up, for a blocking transport (the flows are in
:mod:`triton_sam.client.flow`; the async client runs the same flows with :func:`flow.arun`)."""

from __future__ import annotations

from triton_sam.client import flow
from triton_sam.client.flow import ServedModels
from triton_sam.client.transport import Transport
from triton_sam.models.spec import FamilySpec

__all__ = ["ServedModels", "connect", "connect_concepts"]


def connect(
    transport: Transport,
    family: FamilySpec,
    encoder_model: str,
    decoder_model: str,
    session_model: str,
    use_server_embeddings: bool | None,
) -> ServedModels:
    """:func:`flow.connect` over ``transport`` (see it for what is checked and raised)."""
    steps = flow.connect(
        transport.endpoint,
        family,
        encoder_model,
        decoder_model,
        session_model,
        use_server_embeddings,
    )
    return flow.run(steps, flow.sender(transport))


def connect_concepts(transport: Transport, serving_model: str) -> None:
    """Check the server and a concept family's serving model are ready.

    Raises:
        ServerUnavailableError: no ready server at the address, or the model not ready.
    """
    flow.run(flow.check_ready(transport.endpoint, (serving_model,)), flow.sender(transport))
