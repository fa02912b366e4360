"""SpeculativeSAM2Client: asynchronous decoding for interactive tools, with real cancellation.

Two ways to use it, by session (a session is one user's stream of prompts, e.g. one drag):

- The reference API: :meth:`~SpeculativeSAM2Client.predict_async` sends a request and returns
  ``(request_id, task)``; :meth:`~SpeculativeSAM2Client.cancel_session_requests` cancels the
  session's stale requests for real (the gRPC call is cancelled, so Triton drops it while it
  still waits in the decoder's dynamic-batching queue, and the python-backend runner answers
  it unrun once batched); :func:`queue_multiple_requests` and :func:`wait_for_latest_result`
  keep the reference's helpers.
- Latest-wins, for mouse moves: :meth:`~SpeculativeSAM2Client.track` one event per move,
  ``await`` :meth:`~SpeculativeSAM2Client.latest`. At most one request per session is in
  flight plus the newest event waiting; events replaced while waiting are never sent, and
  only the newest event's mask is ever returned as the latest.

Built on ``tritonclient.grpc.aio``; ``protocol="http"`` uses ``tritonclient.http.aio``, where
cancelling stops the client waiting but Triton (2.51) still runs the request: use gRPC for
server-side cancellation. Latest-wins needs no cancellation and works the same on both.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from triton_sam import transforms
from triton_sam.client import prompts, session_path
from triton_sam.client.async_transport import AsyncTransport
from triton_sam.client.prediction import Prediction, make_prediction
from triton_sam.client.retry import RetryPolicy
from triton_sam.client.sessions import LatestWins, RequestRecord, SessionBook, TrackedEvent
from triton_sam.client.transport import Endpoint, TlsOptions, Transport, resolve_endpoint
from triton_sam.errors import (
    EmbeddingNotFoundError,
    ImageNotSetError,
    InferenceTimeoutError,
    InputValidationError,
    RequestCancelledError,
    ServerUnavailableError,
)
from triton_sam.models.registry import get_family
from triton_sam.models.spec import FamilySpec

DEFAULT_SESSION = "default"
_T = TypeVar("_T")


@dataclass(eq=False)
class _Image:
    """One encoded image: what every request made for it needs (immutable once set)."""

    features: dict[str, np.ndarray]
    orig_hw: tuple[int, int]
    prepared: dict[int, list[Any]] = field(default_factory=dict)  # id(transport) -> inputs
    session: session_path.SessionImage | None = None  # features kept by the server instead


@dataclass(frozen=True)
class _Request:
    image: _Image
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, str]
    multimask: bool = False
    logits_key: str = ""  # session path: where the server keeps this click's logits
    fallback: dict[str, np.ndarray] | None = None  # session path: the request after a miss


class SpeculativeSAM2Client:
    """Asynchronous SAM client whose stale requests are really cancelled on the server.

    The image is encoded once (:meth:`set_image`, or :meth:`set_image_async` inside async
    code); decoder requests then carry the cached embeddings plus the prompts. Pre- and
    post-processing are the sync client's (same prompt builder, same upsampling).

    Args:
        url: ``host:port`` or ``https://host:port``; defaults to ``$TRITON_URL``, else
            ``localhost:8001`` (gRPC) / ``localhost:8000`` (HTTP).
        model_type: model family (``"sam2"``; every registered family works).
        protocol: ``"grpc"`` (default; server-side cancellation) or ``"http"`` (fallback:
            cancelling stops the wait, the server still runs the request).
        encoder_model / decoder_model: Triton model names; default to the family's.
        timeout_s: per-request timeout in seconds.
        retry: backoff for idempotent calls (health, encoder, stateless decoder); None uses
            ``DEFAULT_RETRY``, ``NO_RETRY`` disables it.
        tls: certificates for a ``grpcs://`` / ``https://`` server.
        use_server_embeddings: keep each image's features on the server (the
            ``<family>_session`` model): ``set_image`` sends the image once, a click sends
            the image id and its prompts (a few hundred bytes instead of 4-21 MiB). None
            (default) uses it when the server offers it; False forces the stateless decoder.
            A click on an image the server lost (evicted, restarted) re-embeds it and retries
            once, transparently.
        session_model: Triton name of the session model (default ``<family>_session``).

    Raises:
        UnsupportedModelError: unknown ``model_type``.
        ServerUnavailableError: server not reachable, or a model not ready (the client
            closes itself before raising).

    Example:
        >>> async with SpeculativeSAM2Client("localhost:8001") as client:
        ...     client.set_image("image.jpg")
        ...     for x, y in mouse_positions:
        ...         client.track("drag", [[x, y]], [1])
        ...     prediction = await client.latest("drag")   # mask of the last position
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
        self._sync = Transport(self.endpoint, timeout_s=timeout_s, retry=retry, tls=tls)
        self._aio: AsyncTransport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._image: _Image | None = None
        self._book = SessionBook()
        self._tracks: dict[str, LatestWins] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._closed = False
        try:
            self._check_ready()
            self.family, self.session_model = prompts.layout_on_server(
                self.family, self.session_model, self._decoder_input_names
            )
            self.uses_server_embeddings = session_path.session_offered(
                self._sync, self.session_model, use_server_embeddings
            )
        except BaseException:
            self.close()
            raise

    # -- lifecycle -----------------------------------------------------------------------
    def _check_ready(self) -> None:
        address, protocol = self.endpoint.address, self.endpoint.protocol
        if not self._sync.is_server_ready():
            hint = ""
            if protocol == "grpc" and address.endswith(":8000"):
                hint = " (8000 is Triton's HTTP port: use port 8001 or protocol='http')"
            raise ServerUnavailableError(
                f"url: no ready Triton server at {address} ({protocol}){hint}; start one "
                "with `triton-sam serve` or `docker compose up -d`, or set TRITON_URL"
            )
        for model in (self.encoder_model, self.decoder_model):
            if not self._sync.is_model_ready(model):
                raise ServerUnavailableError(
                    f"model: {model!r} is not ready on {address}; export it with "
                    "`triton-sam setup` and check the server log"
                )

    def _decoder_input_names(self) -> set[str]:
        meta = self._sync.model_metadata(self.decoder_model)
        return {t["name"] for t in meta.get("inputs", [])}

    async def __aenter__(self) -> SpeculativeSAM2Client:
        try:
            self._transport()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> SpeculativeSAM2Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def aclose(self) -> None:
        """Cancel every outstanding request, then close both connections (idempotent)."""
        tasks = self._cancel_everything()
        if tasks:
            await asyncio.wait(tasks)
        if self._aio is not None:
            await self._aio.close()
            self._aio = None
        self._sync.close()
        self._closed = True

    def close(self) -> None:
        """Synchronous close: cancel outstanding requests and close the connections.

        Inside async code prefer ``await aclose()`` (or ``async with``), which also waits for
        the cancelled tasks and closes the gRPC channel cleanly.
        """
        self._cancel_everything()
        if self._aio is not None:
            aio, self._aio = self._aio, None
            if self._loop is not None and self._loop.is_running() and self._in_loop_thread():
                self._loop.create_task(aio.close())
        self._sync.close()
        self._closed = True

    def _cancel_everything(self) -> list[asyncio.Task[Any]]:
        for session_id in list(self._tracks):
            self._cancel_tracked(session_id, keep_latest=False)
        tasks = []
        for record in self._book.records():
            self._book.finish(record, "cancelled")
            if isinstance(record.handle, asyncio.Task) and not record.handle.done():
                record.handle.cancel()
                tasks.append(record.handle)
        return tasks

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
        rgb = transforms.load_image(image)
        if self.uses_server_embeddings:
            session = self._session_image(rgb)
            try:  # a probe of a few bytes saves sending the image when the server has it
                self._sync.infer(self.session_model, *self._probe(session), idempotent=True)
            except EmbeddingNotFoundError:
                self._sync.infer(self.session_model, *self._embed(session), idempotent=True)
            self._image = _Image({}, session.orig_hw, session=session)
            return {}
        tensor = transforms.preprocess(rgb, self.family.preprocessing)
        name = self.family.encoder_inputs[0].name
        features = self._sync.infer(
            self.encoder_model, {name: tensor}, self.family.embedding_names, idempotent=True
        )
        self._image = _Image(features, (int(rgb.shape[0]), int(rgb.shape[1])))
        return dict(features)

    async def set_image_async(self, image: Any) -> dict[str, np.ndarray]:
        """:meth:`set_image` without blocking the event loop (same arguments and result)."""
        rgb = await asyncio.to_thread(transforms.load_image, image)
        if self.uses_server_embeddings:
            session = await asyncio.to_thread(self._session_image, rgb)
            transport = self._transport()
            try:
                await transport.infer(self.session_model, *self._probe(session), idempotent=True)
            except EmbeddingNotFoundError:
                inputs, outputs = await asyncio.to_thread(self._embed, session)
                await transport.infer(self.session_model, inputs, outputs, idempotent=True)
            self._image = _Image({}, session.orig_hw, session=session)
            return {}
        tensor = await asyncio.to_thread(transforms.preprocess, rgb, self.family.preprocessing)
        name = self.family.encoder_inputs[0].name
        features = await self._transport().infer(
            self.encoder_model, {name: tensor}, self.family.embedding_names, idempotent=True
        )
        self._image = _Image(features, (int(rgb.shape[0]), int(rgb.shape[1])))
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
        """
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
        self._image = _Image(features, (int(size[0]), int(size[1])))

    @property
    def is_image_set(self) -> bool:
        """True once an image has been encoded."""
        return self._image is not None

    @property
    def original_size(self) -> tuple[int, int]:
        """(H, W) of the current image."""
        return self._require_image().orig_hw

    def _require_image(self) -> _Image:
        if self._image is None:
            raise ImageNotSetError("an image must be set with set_image(...) before predicting")
        return self._image

    def _request(
        self, point_coords: Any, point_labels: Any, box: Any, mask_input: Any, multimask: bool
    ) -> _Request:
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
            key, click, fallback = image.session.click_inputs(inputs, mask_input)
            return _Request(image, click, outputs, multimask, logits_key=key, fallback=fallback)
        return _Request(image, inputs, outputs, multimask)

    # -- server-side embeddings (the <family>_session model) ------------------------------
    def _session_image(self, rgb: np.ndarray) -> session_path.SessionImage:
        image_id = session_path.image_id(rgb, self.family, self.encoder_model)
        return session_path.SessionImage(image_id, (int(rgb.shape[0]), int(rgb.shape[1])), rgb)

    def _probe(self, session: session_path.SessionImage) -> tuple[dict, tuple[str]]:
        return session_path.probe_inputs(session.image_id), (session_path.ENCODED,)

    def _embed(self, session: session_path.SessionImage) -> tuple[dict, tuple[str]]:
        return session.embed_inputs(self.family), (session_path.ENCODED,)

    def _session_prediction(self, request: _Request, out: dict[str, np.ndarray]) -> Prediction:
        image = request.image
        masks, scores = prompts.select_outputs(out, request.multimask, self.family)
        prediction = make_prediction(masks, scores, image.orig_hw, self.family.preprocessing)
        assert image.session is not None
        image.session.remember(request.logits_key, prediction.low_res_logits)
        return prediction

    async def _decode_on_server(self, request: _Request, request_id: str) -> Prediction:
        """One click through the session model; re-embeds once if the server lost the image.

        Idempotent (retried when the server is unreachable): a click only (re)writes its own
        logits key."""
        transport = self._transport()
        call = functools.partial(transport.infer, self.session_model, request_id=request_id)
        try:
            out = await call(request.inputs, request.outputs, idempotent=True)
        except EmbeddingNotFoundError:  # evicted, or the server restarted: embed, retry once
            assert request.image.session is not None and request.fallback is not None
            inputs, outputs = await asyncio.to_thread(self._embed, request.image.session)
            await call(inputs, outputs, idempotent=True)
            out = await call(request.fallback, request.outputs, idempotent=True)
        return self._session_prediction(request, out)

    def _decode_on_server_sync(self, request: _Request) -> Prediction:
        try:
            out = self._sync.infer(
                self.session_model, request.inputs, request.outputs, idempotent=True
            )
        except EmbeddingNotFoundError:
            assert request.image.session is not None and request.fallback is not None
            self._sync.infer(self.session_model, *self._embed(request.image.session))
            out = self._sync.infer(
                self.session_model, request.fallback, request.outputs, idempotent=True
            )
        return self._session_prediction(request, out)

    async def _decode(self, request: _Request, request_id: str) -> Prediction:
        if request.image.session is not None:
            return await self._decode_on_server(request, request_id)
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

    # -- the reference API -----------------------------------------------------------------
    async def predict_async(
        self,
        point_coords: Any = None,
        point_labels: Any = None,
        session_id: str | None = None,
        request_id: str | None = None,
        *,
        box: Any = None,
        mask_input: Any = None,
        multimask_output: bool = False,
    ) -> tuple[str, asyncio.Task[tuple[np.ndarray, np.ndarray]]]:
        """Send a decoder request now; return its id and the task that will hold its masks.

        Args:
            point_coords: Nx2 clicks as (X, Y) pixels of the original image.
            point_labels: N labels, 1 = foreground, 0 = background.
            session_id: groups requests for :meth:`cancel_session_requests` and
                :meth:`get_session_status` (``"default"`` when None).
            request_id: unique within the session; a uuid4 when None. Also sent to Triton.
            box: [x0, y0, x1, y1] pixels of the original image.
            mask_input: 256x256 low-res logits of a previous prediction.
            multimask_output: three candidate masks instead of one.

        Returns:
            ``(request_id, task)``; the task's result is ``(masks, iou_predictions)`` as in
            :meth:`SAM2TritonClient.predict`: float32 logits [1, M, H, W] at the original
            size and scores [1, M]. A cancelled request's task ends cancelled.

        Raises:
            ImageNotSetError / InputValidationError: before anything is sent.
        """
        session_id = DEFAULT_SESSION if session_id is None else str(session_id)
        self._refuse_tracked(session_id, "predict_async")
        request = self._request(point_coords, point_labels, box, mask_input, multimask_output)
        self._transport()  # fails early outside a loop or after close
        record = self._book.add(session_id, request_id)
        task = asyncio.create_task(
            self._run(record, request), name=f"triton-sam {session_id}/{record.request_id}"
        )
        record.handle = task
        task.add_done_callback(lambda t: self._on_done(t, record))
        return record.request_id, task

    def _refuse_tracked(self, session_id: str, what: str) -> None:
        if session_id in self._tracks:
            raise InputValidationError(
                "session_id", f"{session_id!r} is a track() session; use another one for {what}"
            )

    def _on_done(
        self, task: asyncio.Task[Any], record: RequestRecord, *, event: TrackedEvent | None = None
    ) -> None:
        # A task cancelled before it ever ran never entered its own handlers: settle it here.
        # (Both steps are no-ops when the canceller or the task already did them.)
        if task.cancelled():
            self._book.finish(record, "cancelled")
            if event is not None:
                error = _cancelled(record.session_id, event.seq)
                self._settle(record.session_id, event, error=error)

    async def _run(self, record: RequestRecord, request: _Request) -> tuple[np.ndarray, np.ndarray]:
        try:
            prediction = await self._decode(request, record.request_id)
        except asyncio.CancelledError:
            self._book.finish(record, "cancelled")
            raise
        except Exception as e:
            self._book.finish(record, "failed", e)
            raise
        if not self._book.finish(record, "completed"):
            # cancelled (maybe from another thread) after the answer arrived: never hand out
            raise asyncio.CancelledError
        return prediction.masks, prediction.iou_predictions

    def predict_sync(
        self,
        point_coords: Any = None,
        point_labels: Any = None,
        *,
        box: Any = None,
        mask_input: Any = None,
        multimask_output: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Blocking prediction (for comparison and plain scripts); same result as the task
        of :meth:`predict_async`. Not tracked in any session."""
        prediction = self.predict_full_sync(
            point_coords,
            point_labels,
            box=box,
            mask_input=mask_input,
            multimask_output=multimask_output,
        )
        return prediction.masks, prediction.iou_predictions

    def predict_full_sync(
        self,
        point_coords: Any = None,
        point_labels: Any = None,
        *,
        box: Any = None,
        mask_input: Any = None,
        multimask_output: bool = False,
    ) -> Prediction:
        """Like :meth:`predict_sync`, returning the :class:`Prediction` (with low-res logits)."""
        request = self._request(point_coords, point_labels, box, mask_input, multimask_output)
        if request.image.session is not None:
            return self._decode_on_server_sync(request)
        inputs = {**request.image.features, **request.inputs}
        out = self._sync.infer(self.decoder_model, inputs, request.outputs, idempotent=True)
        masks, scores = prompts.select_outputs(out, request.multimask, self.family)
        return make_prediction(masks, scores, request.image.orig_hw, self.family.preprocessing)

    def cancel_session_requests(self, session_id: str, *, keep_latest: bool = True) -> int:
        """Cancel the session's stale requests for real.

        Each cancelled request's task is cancelled, which cancels its gRPC call: Triton drops
        it if it still waits in the decoder's queue, and the python-backend runner answers it
        unrun if it was already batched. A request already executing runs to its end, but its
        answer is discarded. Over HTTP only the client side is cancelled.

        Args:
            session_id: the session.
            keep_latest: keep the session's newest request (or tracked event), whose answer
                the user is waiting for: the reference README's "cancel intermediate
                requests when user stops", then :func:`wait_for_latest_result`. False
                cancels everything of the session.

        Returns:
            Number of requests cancelled (pending ones only; finished ones are left as they are).

        Safe to call from any thread; from outside the event loop's thread it waits until the
        loop has done it.
        """
        return self._on_loop(self._cancel_now, str(session_id), keep_latest)

    def _on_loop(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run ``fn`` in the event loop's thread (tasks and asyncio events live there); from
        another thread, wait for the loop to have run it."""
        loop = self._loop
        if loop is None or not loop.is_running() or self._in_loop_thread():
            return fn(*args)
        done: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn(*args))
            except BaseException as e:  # hand any failure back to the calling thread
                done.set_exception(e)

        loop.call_soon_threadsafe(run)
        return done.result(timeout=self.timeout_s)

    def _cancel_now(self, session_id: str, keep_latest: bool) -> int:
        if session_id in self._tracks:
            return self._cancel_tracked(session_id, keep_latest=keep_latest)
        keep = self._book.newest(session_id) if keep_latest else None
        marked = self._book.cancel(session_id, keep=keep)
        for record in marked:
            _cancel_task(record.handle)
        return len(marked)

    def get_session_status(self, session_id: str) -> dict[str, int]:
        """Counts of the session's requests by status.

        Returns:
            ``{"pending", "completed", "cancelled", "failed"}`` counts of requests sent, plus
            ``"superseded"``: tracked events never sent (replaced by a newer event while
            waiting, or dropped by a cancel). Every key is always present. Thread-safe.
        """
        counts = self._book.counts(str(session_id))
        track = self._tracks.get(str(session_id))
        counts["superseded"] = track.superseded if track is not None else 0
        return counts

    def get_request_status(self, session_id: str, request_id: str) -> str | None:
        """``"pending"``, ``"completed"``, ``"cancelled"``, ``"failed"``, or None if unknown."""
        return self._book.status(str(session_id), str(request_id))

    def cleanup_session(self, session_id: str) -> None:
        """Cancel everything the session still has outstanding and forget it (any thread)."""
        self._on_loop(self._cleanup_now, str(session_id))

    def _cleanup_now(self, session_id: str) -> None:
        self._cancel_now(session_id, keep_latest=False)
        self._book.forget(session_id)
        self._tracks.pop(session_id, None)
        changed = self._changed.pop(session_id, None)
        if changed is not None:
            changed.set()

    # -- latest-wins -----------------------------------------------------------------------
    def track(
        self,
        session_id: str,
        point_coords: Any = None,
        point_labels: Any = None,
        *,
        box: Any = None,
        mask_input: Any = None,
        multimask_output: bool = False,
    ) -> int:
        """Submit the session's newest prompt (e.g. the mouse position); returns its seq.

        Sent at once when the session has nothing in flight; otherwise it waits, replacing
        (superseding, never sending) any event that was waiting, and is sent when the
        in-flight request ends. Call it from the event loop's thread (inside async code);
        it never blocks. Prompts are validated here (errors raise at once).

        Args:
            session_id: one stream of events (a session used with :meth:`predict_async`
                cannot be tracked, and the other way round).
            point_coords, point_labels, box, mask_input, multimask_output: as
                :meth:`predict_async`.

        Returns:
            The event's number in its session (0, 1, ...).
        """
        session_id = str(session_id)
        self._transport()
        if session_id not in self._tracks and self._book.newest(session_id) is not None:
            raise InputValidationError(
                "session_id",
                f"{session_id!r} already has predict_async requests; track another session",
            )
        request = self._request(point_coords, point_labels, box, mask_input, multimask_output)
        slot = self._tracks.setdefault(session_id, LatestWins())
        event = slot.new_event(request)
        to_send = slot.offer(event)
        if to_send is not None:
            self._send_tracked(session_id, to_send)
        self._notify(session_id)
        return event.seq

    async def latest(self, session_id: str, *, timeout_s: float | None = None) -> Prediction:
        """Wait for the mask of the session's newest tracked event.

        If newer events are tracked while waiting, waits for the newest of them: a mask of a
        superseded or cancelled event is never returned.

        Args:
            session_id: a tracked session.
            timeout_s: give up after this many seconds (None: wait as long as it takes).

        Returns:
            The :class:`Prediction` of the newest event.

        Raises:
            InputValidationError: nothing was ever tracked in ``session_id``.
            RequestCancelledError: the newest event was cancelled (``keep_latest=False``,
                :meth:`cleanup_session`, :meth:`aclose`).
            InferenceTimeoutError: ``timeout_s`` passed.
            ServerError: the newest event's request failed.
        """
        session_id = str(session_id)
        slot = self._tracks.get(session_id)
        if slot is None or slot.events == 0:
            raise InputValidationError("session_id", f"nothing tracked in {session_id!r}")

        async def settled() -> None:
            while not slot.settled:
                await self._changed_event(session_id).wait()

        try:
            await asyncio.wait_for(settled(), timeout_s)
        except asyncio.TimeoutError:
            raise InferenceTimeoutError(
                f"latest({session_id!r}): no mask within {timeout_s} s"
            ) from None
        assert slot.outcome is not None
        if slot.outcome.error is not None:
            raise slot.outcome.error
        return slot.outcome.value

    def preview(self, session_id: str) -> tuple[int, Prediction] | None:
        """The most recent mask the session received, possibly of a superseded event (to
        show something while the user is still moving); ``(seq, prediction)`` or None."""
        slot = self._tracks.get(str(session_id))
        if slot is None or slot.last_value is None:
            return None
        return slot.last_value.seq, slot.last_value.value

    def _send_tracked(self, session_id: str, event: TrackedEvent) -> None:
        record = self._book.add(session_id)
        event.record = record
        task = asyncio.create_task(
            self._run_tracked(session_id, event, record),
            name=f"triton-sam {session_id}/event {event.seq}",
        )
        record.handle = task
        task.add_done_callback(lambda t: self._on_done(t, record, event=event))

    async def _run_tracked(
        self, session_id: str, event: TrackedEvent, record: RequestRecord
    ) -> None:
        try:
            prediction = await self._decode(event.payload, record.request_id)
        except asyncio.CancelledError:
            self._book.finish(record, "cancelled")
            raise  # _on_done settles the session's queue (if the canceller has not)
        except Exception as e:  # delivered through latest(), not through the task
            self._book.finish(record, "failed", e)
            self._settle(session_id, event, error=e)
            return
        if self._book.finish(record, "completed"):
            self._settle(session_id, event, value=prediction)
        else:  # cancelled from another thread after the answer arrived
            self._settle(session_id, event, error=_cancelled(session_id, event.seq))

    def _settle(
        self, session_id: str, event: TrackedEvent, *, value: Any = None, error: Any = None
    ) -> None:
        slot = self._tracks.get(session_id)
        if slot is None:
            return
        to_send = slot.settle(event, value, error)
        if to_send is not None:
            self._send_tracked(session_id, to_send)
        self._notify(session_id)

    def _cancel_tracked(self, session_id: str, *, keep_latest: bool) -> int:
        slot = self._tracks[session_id]
        newest = slot.newest_seq
        cancelled, to_send = slot.cancel(
            keep_latest=keep_latest, error=_cancelled(session_id, newest)
        )
        count = 0
        if cancelled is not None and cancelled.record is not None:
            if self._book.finish(cancelled.record, "cancelled"):
                count += 1
            _cancel_task(cancelled.record.handle)
        if to_send is not None:
            self._send_tracked(session_id, to_send)
        self._notify(session_id)
        return count

    def _changed_event(self, session_id: str) -> asyncio.Event:
        event = self._changed.get(session_id)
        if event is None:
            event = self._changed[session_id] = asyncio.Event()
        return event

    def _notify(self, session_id: str) -> None:
        # Wake every waiter; they re-check and wait on a fresh event.
        event = self._changed.pop(session_id, None)
        if event is not None:
            event.set()


def _cancel_task(handle: Any) -> None:
    if isinstance(handle, asyncio.Task) and not handle.done():
        handle.cancel()


def _cancelled(session_id: str, seq: int) -> RequestCancelledError:
    return RequestCancelledError(f"session {session_id!r}: event {seq} was cancelled")


# -- the reference's module functions ---------------------------------------------------------
async def queue_multiple_requests(
    client: SpeculativeSAM2Client,
    point_coords_list: Sequence[Any],
    point_labels_list: Sequence[Any],
    session_id: str,
) -> list[tuple[str, asyncio.Task[tuple[np.ndarray, np.ndarray]]]]:
    """Send one request per prompt (as the reference): a list of ``(request_id, task)``.

    Raises:
        InputValidationError: the two lists differ in length, or a prompt is invalid (the
            requests sent before it stay in flight, in the session).
    """
    if len(point_coords_list) != len(point_labels_list):
        raise InputValidationError(
            "point_labels_list",
            f"{len(point_labels_list)} entries for {len(point_coords_list)} point_coords",
        )
    tasks = []
    for coords, labels in zip(point_coords_list, point_labels_list, strict=True):
        tasks.append(await client.predict_async(coords, labels, session_id=session_id))
    return tasks


async def wait_for_latest_result(
    tasks: Sequence[tuple[str, asyncio.Task[tuple[np.ndarray, np.ndarray]]]],
    client: SpeculativeSAM2Client,
    session_id: str,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Wait for the last request of ``tasks``; its ``(masks, iou)``, or None if cancelled.

    Unlike the reference, which printed failures and returned None, a failed request raises
    its error (``ServerError``, ``InferenceTimeoutError``...).
    """
    if not tasks:
        return None
    request_id, task = tasks[-1]
    await asyncio.wait([task])  # does not raise when the task was cancelled; we may be
    if task.cancelled() or client.get_request_status(session_id, request_id) == "cancelled":
        return None
    return task.result()


__all__ = [
    "SpeculativeSAM2Client",
    "queue_multiple_requests",
    "wait_for_latest_result",
]
