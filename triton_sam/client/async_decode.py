"""The decoding half of the speculative client: one encoded image, and one request at a time.

:class:`AsyncDecoder` owns the image (its embeddings here, or its id on the server's
``<family>_session`` model) and turns one validated prompt into one :class:`Prediction`,
over the asyncio transport of the running loop or the blocking one. Which requests run and
when (sessions, cancellation, latest-wins) is :class:`~triton_sam.client.speculative.
SpeculativeSAM2Client`'s concern, built on this class.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from triton_sam.client import embedding_path, flow, image_io, model_frame, prompts
from triton_sam.client.async_transport import AsyncTransport
from triton_sam.client.prediction import Prediction, make_prediction
from triton_sam.client.retry import RetryPolicy
from triton_sam.client.transport import Endpoint, TlsOptions, Transport, resolve_endpoint
from triton_sam.errors import (
    ImageNotSetError,
    InputValidationError,
    ServerUnavailableError,
)
from triton_sam.models.registry import get_family
from triton_sam.models.spec import FamilySpec


@dataclass(eq=False)
class EncodedImage:
    """One encoded image: what every request made for it needs (immutable once set)."""

    features: dict[str, np.ndarray]
    orig_hw: tuple[int, int]
    prepared: dict[int, list[Any]] = field(default_factory=dict)  # id(transport) -> inputs
    session: embedding_path.CachedImage | None = None  # features kept by the server instead


@dataclass(frozen=True)
class DecodeRequest:
    """One validated prompt on one image, ready to send (stateless or session path)."""

    image: EncodedImage
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, str]
    multimask: bool = False
    click: flow.Click | None = None  # session path: the click on the session model


class AsyncDecoder:
    """An encoded image and the transports that decode prompts on it.

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
    ) -> None:
        self.family: FamilySpec = get_family(model_type)
        self.session_model = session_model or self.family.session_model
        self.uses_server_embeddings = False
        self.model_type = model_type
        self.encoder_model = encoder_model or self.family.encoder_model
        self.decoder_model = decoder_model or self.family.decoder_model
        self.timeout_s = timeout_s
        self.endpoint: Endpoint = resolve_endpoint(url, protocol)
        self.retry, self.tls = retry, tls
        self._use_server_embeddings = use_server_embeddings
        self._connected = False
        self._sync: Transport | None = None  # made by the first blocking call
        self._aio: AsyncTransport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._image: EncodedImage | None = None
        self._closed = False

    # -- connections -----------------------------------------------------------------------
    def _connect_flow(self) -> flow.Flow[flow.ServedModels]:
        return flow.connect(
            self.endpoint,
            self.family,
            self.encoder_model,
            self.decoder_model,
            self.session_model,
            self._use_server_embeddings,
        )

    def _served(self, served: flow.ServedModels) -> None:
        self.family, self.session_model = served.family, served.session_model
        self.uses_server_embeddings = served.uses_server_embeddings
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
                self.endpoint, timeout_s=self.timeout_s, retry=self.retry, tls=self.tls
            )
        if not self._connected:
            try:
                self._served(flow.run(self._connect_flow(), flow.sender(self._sync)))
            except BaseException:
                self._sync.close()
                self._sync = None
                raise
        return self._sync

    async def _aconnected(self) -> AsyncTransport:
        """The asyncio transport of the running loop, connected without blocking the loop."""
        transport = self._transport()
        if not self._connected:
            try:
                self._served(await flow.arun(self._connect_flow(), flow.async_sender(transport)))
            except BaseException:
                self._aio = None
                await transport.close()
                raise
        return transport

    def _transport(self) -> AsyncTransport:
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
        if self._aio is None or self._loop is not loop:
            # A transport is bound to the loop that made it (grpc.aio, aiohttp).
            self._aio = AsyncTransport(
                self.endpoint, timeout_s=self.timeout_s, retry=self.retry, tls=self.tls
            )
            self._loop = loop
        return self._aio

    def _in_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    async def _aclose_transports(self) -> None:
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
            if self._loop is not None and self._loop.is_running() and self._in_loop_thread():
                self._loop.create_task(aio.close())
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
        rgb = image_io.load_image(image)
        transport = self._blocking()
        if self.uses_server_embeddings:
            session = embedding_path.CachedImage.of(
                rgb,
                self.family,
                self.encoder_model,
                self.session_model,
                embedding_path.encoded_bytes(image),
            )
            flow.run(flow.embed(session, self.family, self.session_model), flow.sender(transport))
            self._image = EncodedImage({}, session.orig_hw, session=session)
            return {}
        tensor = model_frame.preprocess(rgb, self.family.preprocessing)
        name = self.family.encoder_inputs[0].name
        features = transport.infer(
            self.encoder_model, {name: tensor}, self.family.embedding_names, idempotent=True
        )
        self._image = EncodedImage(features, (int(rgb.shape[0]), int(rgb.shape[1])))
        return dict(features)

    async def set_image_async(self, image: Any) -> dict[str, np.ndarray]:
        """:meth:`set_image` without blocking the event loop (same arguments and result)."""
        rgb = await asyncio.to_thread(image_io.load_image, image)
        transport = await self._aconnected()
        if self.uses_server_embeddings:
            encoded = await asyncio.to_thread(embedding_path.encoded_bytes, image)
            session = await asyncio.to_thread(
                embedding_path.CachedImage.of,
                rgb,
                self.family,
                self.encoder_model,
                self.session_model,
                encoded,
            )
            steps = flow.embed(session, self.family, self.session_model)
            await flow.arun(steps, flow.async_sender(transport))
            self._image = EncodedImage({}, session.orig_hw, session=session)
            return {}
        tensor = await asyncio.to_thread(model_frame.preprocess, rgb, self.family.preprocessing)
        name = self.family.encoder_inputs[0].name
        features = await transport.infer(
            self.encoder_model, {name: tensor}, self.family.embedding_names, idempotent=True
        )
        self._image = EncodedImage(features, (int(rgb.shape[0]), int(rgb.shape[1])))
        return dict(features)

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
        features = {}
        for spec in self.family.encoder_outputs:
            if spec.name not in embedding:
                raise InputValidationError(
                    "embedding",
                    f"missing {spec.name!r}; expected {list(self.family.embedding_names)}",
                )
            array = np.asarray(embedding[spec.name], dtype=np.float32)
            if array.shape != (1, *spec.shape):
                raise InputValidationError(
                    "embedding",
                    f"{spec.name!r} has shape {array.shape}, expected {(1, *spec.shape)}",
                )
            features[spec.name] = array
        size = tuple(original_size)
        if len(size) != 2 or not all(isinstance(v, int | np.integer) and v > 0 for v in size):
            raise InputValidationError(
                "original_size", f"got {original_size!r}, expected (H, W) positive integers"
            )
        self._image = EncodedImage(features, (int(size[0]), int(size[1])))

    @property
    def is_image_set(self) -> bool:
        """True once an image has been encoded."""
        return self._image is not None

    @property
    def original_size(self) -> tuple[int, int]:
        """(H, W) of the current image."""
        return self._require_image().orig_hw

    def _require_image(self) -> EncodedImage:
        if self._image is None:
            raise ImageNotSetError("an image must be set with set_image(...) before predicting")
        return self._image

    def _request(
        self, point_coords: Any, point_labels: Any, box: Any, mask_input: Any, multimask: bool
    ) -> DecodeRequest:
        """Validate prompts and build the decoder request (raises before anything is sent)."""
        image = self._require_image()
        outputs = prompts.output_names(multimask, self.family)
        inputs = prompts.build_decoder_prompts(
            point_coords=point_coords,
            point_labels=point_labels,
            box=box,
            mask_input=mask_input,
            orig_hw=image.orig_hw,
            family=self.family,
        )
        if image.session is not None:
            click = flow.click_request(image.session, self.family, inputs, mask_input, multimask)
            return DecodeRequest(image, click.inputs, outputs, multimask, click=click)
        return DecodeRequest(image, inputs, outputs, multimask)

    # -- server-side embeddings (the <family>_session model) ------------------------------
    def _click_flow(self, request: DecodeRequest) -> flow.Flow[Prediction]:
        assert request.image.session is not None and request.click is not None
        return flow.click(request.image.session, self.family, self.session_model, request.click)

    def _decode_on_server_sync(self, request: DecodeRequest) -> Prediction:
        """One click through the session model; re-embeds once if the server lost the image."""
        return flow.run(self._click_flow(request), flow.sender(self._blocking()))

    async def _decode(self, request: DecodeRequest, request_id: str) -> Prediction:
        if request.image.session is not None:
            send = flow.async_sender(self._transport(), request_id)
            return await flow.arun(self._click_flow(request), send)
        transport = self._transport()
        image = request.image
        prepared = image.prepared.get(id(transport))
        if prepared is None:
            prepared = image.prepared.setdefault(
                id(transport), transport.prepare_inputs(image.features)
            )
        out = await transport.infer(
            self.decoder_model,
            request.inputs,
            request.outputs,
            prepared=prepared,
            request_id=request_id,
            idempotent=True,
        )
        masks, scores = prompts.select_outputs(out, request.multimask, self.family)
        return make_prediction(masks, scores, image.orig_hw, self.family.preprocessing)
