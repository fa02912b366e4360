"""The speculative client's link to the server: its connections and the image it decodes on.

:class:`Connection` holds the blocking transport (made by the first blocking call) and one
asyncio transport per event loop, checks the server on first use (without blocking a loop),
and its :class:`~triton_sam.client.image_session.ImageSession` (the models and the current
image, shared with the sync client and the gateway), whose flows it runs: images
(:meth:`Connection.set_image`) and prompts (:meth:`Connection.decode`). Which requests run
and when (request streams, cancellation, latest-wins) is :class:`~triton_sam.client.speculative.
SpeculativeSAM2Client`'s concern, which holds one ``Connection``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np

from triton_sam.client import flow
from triton_sam.client.async_transport import AsyncTransport
from triton_sam.client.decode_request import DecodeRequest, EncodedImage, check_embedding
from triton_sam.client.endpoint import Endpoint, TlsOptions, bearer_headers, resolve_endpoint
from triton_sam.client.image_session import ImageSession, model_properties
from triton_sam.client.prediction import Prediction
from triton_sam.client.retry import RetryPolicy
from triton_sam.client.transport import Transport
from triton_sam.errors import ImageNotSetError, ServerUnavailableError


class Connection:
    """The transports to one server, and the image encoded on it.

    Arguments are :class:`~triton_sam.client.speculative.SpeculativeSAM2Client`'s (which
    documents them). The constructor does no I/O: the server is checked (models ready,
    decoder layout, session model offered) on first use, by ``async with`` /
    :meth:`set_image_async` over the asyncio transport without blocking the loop, or by the
    blocking :meth:`set_image` / :meth:`set_image_embedding`. The blocking transport exists
    only once a blocking method was called.
    """

    def __init__(
        self,
        url: str | None = None,
        model_type: str = "sam2",
        protocol: str = "grpc",
        *,
        encoder_model: str | None = None,
        decoder_model: str | None = None,
        timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
        tls: TlsOptions | None = None,
        session_model: str | None = None,
        use_server_embeddings: bool | None = None,
        headers: Mapping[str, str] | None = None,
        token: str | None = None,
    ) -> None:
        # on every request, blocking or asyncio: a gateway's tenant, a proxy's bearer token
        self.headers = {**bearer_headers(token), **(headers or {})}
        self.core = ImageSession(
            model_type,
            encoder_model=encoder_model,
            decoder_model=decoder_model,
            session_model=session_model,
        )
        self.timeout_s = timeout_s
        self.endpoint: Endpoint = resolve_endpoint(url, protocol)
        self.retry, self.tls = retry, tls
        self._use_server_embeddings = use_server_embeddings
        self._connected = False
        self._sync: Transport | None = None  # made by the first blocking call
        self._aio: AsyncTransport | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the asyncio transport's
        self._closed = False

    # The models, as the core resolved them against the server (once connected).
    family, model_type, encoder_model, decoder_model, session_model, uses_server_embeddings = (
        model_properties("core")
    )

    # -- connections -----------------------------------------------------------------------
    def _connect_flow(self) -> flow.Flow[None]:
        yield from self.core.connect(self.endpoint, self._use_server_embeddings)
        self._connected = True

    def _blocking(self) -> Transport:
        """The blocking transport, connected (checks the server on first use).

        Raises:
            ServerUnavailableError: no ready server or models (the transport is closed; a
                later call tries again).
        """
        if self._closed:
            raise ServerUnavailableError("client: closed; create a new SpeculativeSAM2Client")
        if self._sync is None:
            self._sync = Transport(
                self.endpoint,
                timeout_s=self.timeout_s,
                retry=self.retry,
                tls=self.tls,
                headers=self.headers,
            )
        if not self._connected:
            try:
                flow.run(self._connect_flow(), flow.sender(self._sync))
            except BaseException:
                self._sync.close()
                self._sync = None
                raise
        return self._sync

    async def aconnected(self) -> AsyncTransport:
        """The asyncio transport of the running loop, connected without blocking the loop."""
        transport = self.transport()
        if not self._connected:
            try:
                await flow.arun(self._connect_flow(), flow.async_sender(transport))
            except BaseException:
                self._aio = None
                await transport.close()
                raise
        return transport

    def transport(self) -> AsyncTransport:
        """The asyncio transport of the running loop (created on first use in that loop)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "SpeculativeSAM2Client: async methods and track() run inside an event loop "
                "(async def / Jupyter); use predict_sync() from plain code"
            ) from None
        if self._closed:
            raise ServerUnavailableError("client: closed; create a new SpeculativeSAM2Client")
        if self._aio is None or self.loop is not loop:
            # A transport is bound to the loop that made it (grpc.aio, aiohttp).
            self._aio = AsyncTransport(
                self.endpoint,
                timeout_s=self.timeout_s,
                retry=self.retry,
                tls=self.tls,
                headers=self.headers,
            )
            self.loop = loop
        return self._aio

    def in_loop_thread(self) -> bool:
        """True when called from the thread of the loop the asyncio transport belongs to."""
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    async def aclose(self) -> None:
        """Close the connections on the running loop (idempotent)."""
        if self._aio is not None:
            await self._aio.close()
            self._aio = None
        if self._sync is not None:
            self._sync.close()
        self._closed = True

    def close(self) -> None:
        """Close the connections (the asyncio one is closed on its loop when that runs)."""
        if self._aio is not None:
            aio, self._aio = self._aio, None
            if self.loop is not None and self.loop.is_running() and self.in_loop_thread():
                self.loop.create_task(aio.close())
        if self._sync is not None:
            self._sync.close()
        self._closed = True

    # -- image -----------------------------------------------------------------------------
    def set_image(self, image: Any) -> dict[str, np.ndarray]:
        """Encode an image (synchronously, as the reference) and cache its embeddings.

        Requests already sent keep the image they were made for.

        Args:
            image: a path, a PIL image, or an HxWx3 uint8 RGB array.

        Returns:
            The encoder outputs by name (e.g. ``image_embed`` [1, 256, 64, 64]); an empty
            dict with server-side embeddings, where the features stay on the server (pass
            ``use_server_embeddings=False`` to get them here).

        Raises:
            InputValidationError: the image cannot be read or has the wrong shape/dtype.
            ServerError: the encoder failed.
        """
        transport = self._blocking()
        self.core.image = encoded = flow.run(self.core.load(image), flow.sender(transport))
        return dict(encoded.features)

    async def set_image_async(self, image: Any) -> dict[str, np.ndarray]:
        """:meth:`set_image` without blocking the event loop (same arguments and result)."""
        transport = await self.aconnected()
        encoded = await flow.arun(self.core.load(image), flow.async_sender(transport))
        self.core.image = encoded
        return dict(encoded.features)

    def set_image_embedding(
        self, embedding: Mapping[str, np.ndarray], original_size: tuple[int, int]
    ) -> None:
        """Use an image's embeddings encoded earlier instead of encoding it again (e.g. an
        annotation tool's per-image cache).

        Args:
            embedding: the encoder outputs by name, as :meth:`set_image` returns them or
                ``SAM2TritonClient.get_image_embedding()``: every output of the family's
                encoder, float32 with batch dimension 1 (``image_embed`` [1, 256, 64, 64]...).
            original_size: (H, W) of the image they were computed from.

        Raises:
            InputValidationError: naming ``embedding`` or ``original_size``.
            ServerUnavailableError: the client was never connected and the server is not
                ready (the decoder's layout is read from it).
        """
        if not self._connected:
            self._blocking()
        self.core.image = check_embedding(embedding, original_size, self.family)

    @property
    def is_image_set(self) -> bool:
        """True once an image has been encoded."""
        return self.core.image is not None

    @property
    def original_size(self) -> tuple[int, int]:
        """(H, W) of the current image."""
        return self._require_image().orig_hw

    def _require_image(self) -> EncodedImage:
        if self.core.image is None:
            raise ImageNotSetError("an image must be set with set_image(...) before predicting")
        return self.core.image

    # -- prompts ---------------------------------------------------------------------------
    def request(
        self, point_coords: Any, point_labels: Any, box: Any, mask_input: Any, multimask: bool
    ) -> DecodeRequest:
        """Validate prompts on the current image and build their request (raises before
        anything is sent)."""
        image = self._require_image()
        return self.core.request(image, point_coords, point_labels, box, mask_input, multimask)

    def decode_sync(self, request: DecodeRequest) -> Prediction:
        """``request`` over the blocking transport (a lost image is re-embedded once)."""
        return flow.run(self.core.predict(request), flow.sender(self._blocking()))

    async def decode(self, request: DecodeRequest, request_id: str) -> Prediction:
        """``request`` over the loop's asyncio transport, sent to Triton as ``request_id``."""
        send = flow.async_sender(self.transport(), request_id)
        return await flow.arun(self.core.predict(request), send)
