"""SpeculativeSAM2Client: asynchronous decoding for interactive tools, with real cancellation.

Two ways to use it, by session (a session is one user's stream of prompts, e.g. one drag):

- The reference API: :meth:`~SpeculativeSAM2Client.predict_async` sends a request and returns
  ``(request_id, task)``; :meth:`~SpeculativeSAM2Client.cancel_session_requests` cancels the
  session's stale requests for real (the gRPC call is cancelled, so Triton drops it while it
  still waits in the decoder's dynamic-batching queue; the python-runner fallback also answers
  it unrun once batched); :func:`queue_multiple_requests` and :func:`wait_for_latest_result`
  keep the reference's helpers.
- Latest-wins, for mouse moves: :meth:`~SpeculativeSAM2Client.track` one event per move,
  ``await`` :meth:`~SpeculativeSAM2Client.latest` (:mod:`triton_sam.client.latest_wins`).

Built on ``tritonclient.grpc.aio``; ``protocol="http"`` uses ``tritonclient.http.aio``, where
cancelling stops the client waiting but Triton (2.51) still runs the request: use gRPC for
server-side cancellation. Latest-wins needs no cancellation and works the same on both.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from triton_sam.client import everything as everything_client
from triton_sam.client.closing import ClosesOnExit
from triton_sam.client.connection import Connection
from triton_sam.client.decode_request import DecodeRequest
from triton_sam.client.everything import EverythingResult
from triton_sam.client.image_session import model_properties
from triton_sam.client.latest_wins import LatestWinsSessions, _cancel_task, _cancelled
from triton_sam.client.prediction import Prediction
from triton_sam.client.reference_helpers import queue_multiple_requests, wait_for_latest_result
from triton_sam.client.request_book import LatestWins, RequestBook, RequestRecord, TrackedEvent
from triton_sam.errors import InputValidationError

DEFAULT_SESSION = "default"
_T = TypeVar("_T")


class SpeculativeSAM2Client(LatestWinsSessions, ClosesOnExit):
    """Asynchronous SAM client whose stale requests are really cancelled on the server.

    The image is encoded once (:meth:`set_image`, or :meth:`set_image_async` inside async
    code); decoder requests then carry the cached embeddings plus the prompts. Pre- and
    post-processing are the sync client's (same prompt builder, same upsampling).

    Args:
        url: ``host:port``, ``https://host:port`` or ``grpc(s)://host:port`` (gRPC whatever
            ``protocol`` says); defaults to ``$TRITON_URL``, else ``localhost:8001`` (gRPC) /
            ``localhost:8000`` (HTTP).
        model_type: model family (``"sam2"``; every registered family works).
        protocol: ``"grpc"`` (default; server-side cancellation) or ``"http"`` (fallback:
            cancelling stops the wait, the server still runs the request).
        encoder_model / decoder_model: Triton model names; default to the family's.
        timeout_s: per-request timeout in seconds.
        retry: backoff for idempotent calls (health, encoder, stateless decoder); None uses
            ``DEFAULT_RETRY``, ``NO_RETRY`` disables it.
        tls: certificates for a ``grpcs://`` / ``https://`` server.
        token: a bearer token for a server behind the token proxy (``triton-sam proxy
            --tokens-file``), sent with every request; never logged.
        use_server_embeddings / session_model: as :class:`SAM2TritonClient` (features kept
            by the ``<family>_session`` model when the server offers it; a click the server
            cannot serve re-embeds the image and retries once).

    Raises:
        UnsupportedModelError: unknown ``model_type``.
        ServerUnavailableError: server not reachable, or a model not ready: raised by
            ``async with`` (which then closes the client) or by the first blocking call
            (:meth:`set_image`); the constructor does no I/O.

    Example:
        >>> async with SpeculativeSAM2Client("localhost:8001") as client:
        ...     client.set_image("image.jpg")
        ...     for x, y in mouse_positions:
        ...         client.track("drag", [[x, y]], [1])
        ...     prediction = await client.latest("drag")   # mask of the last position
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The connections and the current image are the Connection's, whose constructor does
        # no I/O, so nothing here can be half-made; this class keeps the request streams.
        self._conn = Connection(*args, **kwargs)
        self._book = RequestBook()
        self._tracks: dict[str, LatestWins] = {}
        self._changed: dict[str, asyncio.Event] = {}

    # -- the connection's state, read-only ---------------------------------------------------
    family, model_type, encoder_model, decoder_model, session_model, uses_server_embeddings = (
        model_properties("_conn.core")
    )
    endpoint = property(lambda self: self._conn.endpoint, doc="The server's address.")
    timeout_s = property(lambda self: self._conn.timeout_s, doc="Per-request timeout (s).")
    retry = property(lambda self: self._conn.retry, doc="Backoff of idempotent calls.")
    tls = property(lambda self: self._conn.tls, doc="Certificates for a TLS server.")
    is_image_set = property(lambda self: self._conn.is_image_set, doc="An image is encoded.")
    original_size = property(lambda self: self._conn.original_size, doc="(H, W) of the image.")

    # -- image -------------------------------------------------------------------------------
    def set_image(self, image: Any) -> dict[str, np.ndarray]:
        """Encode an image, blocking (as the reference): :meth:`Connection.set_image`."""
        return self._conn.set_image(image)

    async def set_image_async(self, image: Any) -> dict[str, np.ndarray]:
        """:meth:`set_image` without blocking the event loop (same arguments and result)."""
        return await self._conn.set_image_async(image)

    def set_image_embedding(
        self, embedding: Mapping[str, np.ndarray], original_size: tuple[int, int]
    ) -> None:
        """Use embeddings encoded earlier: :meth:`Connection.set_image_embedding`."""
        self._conn.set_image_embedding(embedding, original_size)

    # -- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> SpeculativeSAM2Client:
        try:
            await self._conn.aconnected()  # checks the server without blocking the loop
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Cancel every outstanding request, then close both connections (idempotent)."""
        tasks = self._cancel_everything()
        if tasks:
            await asyncio.wait(tasks)
        await self._conn.aclose()

    def close(self) -> None:
        """Synchronous close: cancel outstanding requests and close the connections.

        Inside async code prefer ``await aclose()`` (or ``async with``), which also waits for
        the cancelled tasks and closes the gRPC channel cleanly.
        """
        self._cancel_everything()
        self._conn.close()

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
        request = self._conn.request(point_coords, point_labels, box, mask_input, multimask_output)
        self._conn.transport()  # fails early outside a loop or after close
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
        # The book keeps a session's records until cleanup_session(); it must not keep the
        # finished task, whose result holds the masks (megabytes per request).
        record.handle = None

    async def _run(
        self, record: RequestRecord, request: DecodeRequest
    ) -> tuple[np.ndarray, np.ndarray]:
        try:
            prediction = await self._conn.decode(request, record.request_id)
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
        request = self._conn.request(point_coords, point_labels, box, mask_input, multimask_output)
        return self._conn.decode_sync(request)

    async def generate_masks(
        self,
        image: Any = None,
        *,
        progress: Callable[[int, int], Any] | None = None,
        grpc_url: str | None = None,
        job_timeout_s: float | None = None,
        **params: Any,
    ) -> EverythingResult:
        """Every instance in an image (the official automatic mask generator's
        ``coco_rle`` records), computed by the server's ``<family>_everything`` model.

        Same arguments and result as :meth:`SAM2TritonClient.generate_masks`. Cancelling
        the task that awaits it cancels the job on the server (its gRPC stream is closed;
        the model stops before its next decoder batch).
        """
        conn = self._conn
        await conn.aconnected()
        model, params_json, endpoint = everything_client.job_target(
            conn.family, conn.model_type, conn.session_model, params, conn.endpoint, grpc_url
        )
        cached = None if image is not None else conn._require_image().cached
        first, fallback = await asyncio.to_thread(
            everything_client.job_requests, image, cached, params_json
        )
        options: dict[str, Any] = {
            "progress": progress,
            "timeout_s": job_timeout_s,
            "tls": conn.tls,
            "headers": conn.headers,
        }

        def run(inputs: dict[str, np.ndarray]) -> Awaitable[EverythingResult]:
            return everything_client.agenerate(endpoint, model, inputs, **options)

        return await everything_client.awith_fallback(run, first, fallback)

    def cancel_session_requests(self, session_id: str, *, keep_latest: bool = True) -> int:
        """Cancel the session's stale requests for real.

        Each cancelled request's task is cancelled, which cancels its gRPC call: Triton drops
        it if it still waits in the decoder's queue (the python-runner fallback also answers
        it unrun if it was already batched). A request handed to the model runs to its end,
        but its answer is discarded. Over HTTP only the client side is cancelled.

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
        loop = self._conn.loop
        if loop is None or not loop.is_running() or self._conn.in_loop_thread():
            return fn(*args)
        done: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn(*args))
            except BaseException as e:  # hand any failure back to the calling thread
                done.set_exception(e)

        loop.call_soon_threadsafe(run)
        return done.result(timeout=self._conn.timeout_s)

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


# The constructor takes the Connection's arguments: say so to help(), IDEs and inspect.
SpeculativeSAM2Client.__init__.__signature__ = inspect.signature(Connection.__init__)  # type: ignore[attr-defined]


__all__ = [
    "SpeculativeSAM2Client",
    "queue_multiple_requests",
    "wait_for_latest_result",
]
