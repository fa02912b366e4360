"""Which SAM models a server offers: what an application asks before it shows its tools.

The answer comes from Triton's open endpoints (statistics and model configs, which list every
model the server holds, loaded or not, without the admin-only repository API) and each
model's ``triton_sam.kind`` parameter, which the repository writer sets on every model a user
talks to. Only ready models are listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from triton_sam.client.endpoint import TlsOptions, bearer_headers, resolve_endpoint
from triton_sam.client.transport import Transport
from triton_sam.errors import ServerUnavailableError
from triton_sam.serving.protocol import (
    KIND_CONCEPT,
    KIND_EMBEDDING_CACHE,
    KIND_EVERYTHING,
    KIND_LARGE_IMAGE,
    KIND_PARAM,
    KIND_TRACKER,
)

# The kind a model is listed as, by its config's ``triton_sam.kind``.
_KINDS = {
    KIND_EMBEDDING_CACHE: "session",
    KIND_CONCEPT: "concept",
    KIND_EVERYTHING: "everything",
    KIND_LARGE_IMAGE: "large",
    KIND_TRACKER: "tracker",
}
# The suffix each kind's model name carries after its family (``sam2_session`` -> ``sam2``).
_SUFFIXES = {"session": "_session", "everything": "_everything", "large": "_large"}


@dataclass(frozen=True)
class ServedModel:
    """One model a server offers to users.

    Attributes:
        name: the Triton model name (``sam2_session``, ``sam2_everything``, ``sam3_concept``,
            ``sam2_tracker``...).
        kind: ``"session"`` (points and boxes), ``"everything"``, ``"large"`` (tiled large
            images), ``"concept"`` (text prompts) or ``"tracker"`` (videos and volumes).
        family: the client's ``model_type`` for it (``"sam2"``, ``"sam1"``, ``"sam3"``,
            ``"sam3_concept"``); for a tracker, the family it tracks with (``"sam2"`` for
            ``sam2_tracker``, ``"sam3"`` for ``sam3_tracker``).
    """

    name: str
    kind: str
    family: str


def served_models(
    url: str | None = None,
    protocol: str = "http",
    *,
    timeout_s: float = 10.0,
    tls: TlsOptions | None = None,
    token: str | None = None,
) -> list[ServedModel]:
    """The ready SAM models of the server at ``url``, sorted by name.

    Args:
        url: as :class:`~triton_sam.SAM2TritonClient` takes it.
        protocol: ``"http"`` or ``"grpc"``.
        timeout_s: per-request timeout in seconds.
        tls: certificates for an ``https://`` server.
        token: a bearer token for a server behind the token proxy; never logged.

    Returns:
        One :class:`ServedModel` per ready model whose config names a kind users talk to.

    Raises:
        ServerUnavailableError: no ready server at ``url``.
    """
    transport = Transport(
        resolve_endpoint(url, protocol),
        timeout_s=timeout_s,
        tls=tls,
        headers=bearer_headers(token),
    )
    try:
        if not transport.is_server_ready():
            raise ServerUnavailableError(
                f"url: no ready Triton server at {transport.endpoint.address} "
                f"({transport.endpoint.protocol})"
            )
        offered = []
        for name in _model_names(transport):
            kind = _KINDS.get(_kind(transport, name))
            if kind is not None and transport.is_model_ready(name):
                offered.append(ServedModel(name, kind, _family(name, kind)))
        return offered
    finally:
        transport.close()


def _as_dict(transport: Transport, message: Any) -> dict[str, Any]:
    """tritonclient's gRPC answers are protobuf messages; its HTTP answers are dicts."""
    if transport.endpoint.protocol == "grpc":
        from google.protobuf.json_format import MessageToDict

        return MessageToDict(message, preserving_proto_field_name=True)
    return message


def _model_names(transport: Transport) -> list[str]:
    stats = _as_dict(
        transport,
        transport._idempotent(
            "model statistics", "get_inference_statistics", **transport.header_kwargs()
        ),
    )
    return sorted({m["name"] for m in stats.get("model_stats", [])})


def _kind(transport: Transport, name: str) -> str | None:
    try:
        config = _as_dict(
            transport,
            transport._idempotent(
                f"config of {name}", "get_model_config", name, **transport.header_kwargs()
            ),
        )
    except Exception:  # unloaded meanwhile (or not a model we can read): not offered
        return None
    config = config.get("config", config)  # gRPC wraps the config in a response message
    return config.get("parameters", {}).get(KIND_PARAM, {}).get("string_value")


def _family(name: str, kind: str) -> str:
    if kind == "concept":
        return "sam3_concept"
    if kind == "tracker":  # sam2_tracker, sam3_tracker: the family is the name's prefix
        return name.removesuffix("_tracker")
    return name.removesuffix(_SUFFIXES[kind])
