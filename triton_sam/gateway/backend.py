"""The gateway's link to Triton: our async client's connection and its image-session core,
nothing new.

Every request is a flow of the core the clients share
(:class:`triton_sam.client.image_session.ImageSession`): encodes on the encoder the connection
resolved (the preprocessing is the client's, equal to ``SamPredictor.set_image``'s), images
kept by the session model, prompts. The connection is
:class:`triton_sam.client.connection.Connection`, checked on first use. Each tenant gets its own
connection: the tenant travels as a header on every request (the session model keeps its
cached features per tenant), and a transport carries one set of headers.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_sam.client import flow
from triton_sam.client.connection import Connection
from triton_sam.client.decode_request import EncodedImage, check_embedding
from triton_sam.serving.protocol.tenancy import DEFAULT_TENANT, TENANT_HEADER

# Tenants with an open connection at most (the least recently used one is closed past it).
MAX_TENANT_CONNECTIONS = 64


@dataclass(frozen=True)
class BackendOptions:
    """Where the models are.

    Attributes:
        url: Triton's address (``host:port``; gRPC by default, so cancelled work in flight
            is cancelled on the server too).
        protocol: ``"grpc"`` or ``"http"`` (HTTP cannot cancel a request Triton holds).
        model_type: the family the gateway serves (SAM_service serves SAM1's ViT-H).
        encoder_model / decoder_model / session_model: Triton model names; None = the
            family's (``sam1_encoder``...), resolved by the connection as our clients do.
        timeout_s: per-request timeout towards Triton.
    """

    url: str = "localhost:8001"
    protocol: str = "grpc"
    model_type: str = "sam1"
    encoder_model: str | None = None
    decoder_model: str | None = None
    session_model: str | None = None
    timeout_s: float = 120.0


class TritonBackend:
    """Embeddings and masks from Triton for the gateway's routes (one event loop)."""

    def __init__(self, options: BackendOptions) -> None:
        self.options = options
        self._connections: OrderedDict[str, Connection] = OrderedDict()

    def connection(self, tenant: str = DEFAULT_TENANT) -> Connection:
        """The tenant's connection (made on first use; not yet checked)."""
        conn = self._connections.get(tenant)
        if conn is None:
            o = self.options
            conn = Connection(
                o.url,
                o.model_type,
                o.protocol,
                encoder_model=o.encoder_model,
                decoder_model=o.decoder_model,
                session_model=o.session_model,
                timeout_s=o.timeout_s,
                headers={TENANT_HEADER: tenant} if tenant != DEFAULT_TENANT else None,
            )
            self._connections[tenant] = conn
            if len(self._connections) > MAX_TENANT_CONNECTIONS:
                _, old = self._connections.popitem(last=False)
                asyncio.ensure_future(old.aclose())
        self._connections.move_to_end(tenant)
        return conn

    async def embed(self, rgb: np.ndarray, *, tenant: str, request_id: str) -> np.ndarray:
        """The image embedding of ``rgb`` (HxWx3 uint8): float32 [1, 256, 64, 64] for SAM1,
        as ``SamPredictor.get_image_embedding()``."""
        conn = self.connection(tenant)
        send = flow.async_sender(await conn.aconnected(), request_id)
        image = await flow.arun(conn.core.encode(rgb), send)
        return np.asarray(image.features[conn.family.embedding_names[0]], dtype=np.float32)

    async def mask_from_embedding(
        self,
        embedding: np.ndarray,
        point: tuple[float, float],
        hw: tuple[int, int],
        *,
        tenant: str,
        request_id: str,
    ) -> np.ndarray:
        """SAM_service's ``/from_model`` mask: one foreground click at ``point`` (x, y pixels
        of the original image of size ``hw`` = (H, W)) on the stateless decoder.

        SAM_service runs ``SamOnnxModel(return_single_mask=True)``, which for one click
        picks the multimask output (tokens 1-3) with the best predicted IoU: the same as
        ``SamPredictor.predict(multimask_output=True)`` and its highest score.

        Returns:
            bool [H, W] (logits > 0).

        Raises:
            InputValidationError: naming ``model`` (the embedding) or the click.
        """
        conn = self.connection(tenant)
        send = flow.async_sender(await conn.aconnected(), request_id)
        family = conn.family
        image = check_embedding({family.embedding_names[0]: embedding}, hw, family)
        return await _click(conn, image, point, send)

    async def mask_from_image(
        self,
        rgb: np.ndarray,
        encoded: bytes,
        point: tuple[float, float],
        *,
        tenant: str,
        request_id: str,
    ) -> np.ndarray:
        """SAM_service's ``/prediction`` mask: ``rgb`` (decoded from ``encoded``) kept by the
        session model, so the same image again costs no encode; one click as in
        :meth:`mask_from_embedding`. Without a session model, encodes with the encoder."""
        conn = self.connection(tenant)
        send = flow.async_sender(await conn.aconnected(), request_id)
        image = await flow.arun(conn.core.new_image(conn.core.source(rgb, encoded)), send)
        return await _click(conn, image, point, send)

    async def ready(self) -> dict[str, bool]:
        """Readiness of the server and of the encoder and decoder (the session model is
        optional: without it ``/prediction`` encodes with the encoder)."""
        conn = self.connection()
        transport = conn.transport()
        state = {"server": await transport.is_server_ready()}
        for name in (conn.encoder_model, conn.decoder_model):
            try:
                state[name] = await transport.is_model_ready(name) if state["server"] else False
            except Exception:
                state[name] = False
        return state

    def model_names(self) -> dict[str, str]:
        """The Triton models by role (the connection's, once it resolved them)."""
        conn = self.connection()
        return {
            "encoder": conn.encoder_model,
            "decoder": conn.decoder_model,
            "session": conn.session_model,
        }

    async def aclose(self) -> None:
        """Close every connection."""
        for conn in self._connections.values():
            await conn.aclose()
        self._connections.clear()


async def _click(
    conn: Connection, image: EncodedImage, point: tuple[float, float], send: Any
) -> np.ndarray:
    """One foreground click at ``point`` on ``image``: the best of the multimask output."""
    request = conn.core.request(image, [list(point)], [1], None, None, True)
    return _best_mask(await flow.arun(conn.core.predict(request), send))


def _best_mask(prediction: Any) -> np.ndarray:
    best = int(np.argmax(prediction.iou_predictions[0]))
    return np.asarray(prediction.masks[0, best] > 0)
