"""Latest-wins sessions of :class:`~triton_sam.client.speculative.SpeculativeSAM2Client`, for
mouse moves: :meth:`~LatestWinsSessions.track` one event per move, ``await``
:meth:`~LatestWinsSessions.latest`. At most one request per session is in flight plus the
newest event waiting; events replaced while waiting are never sent, and only the newest
event's mask is ever returned as the latest. The state machine of one session is
:class:`~triton_sam.client.request_book.LatestWins` (pure); this mixin sends its events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from triton_sam.client.prediction import Prediction
from triton_sam.client.request_book import LatestWins, RequestBook, RequestRecord, TrackedEvent
from triton_sam.errors import InferenceTimeoutError, InputValidationError, RequestCancelledError

if TYPE_CHECKING:
    from triton_sam.client.connection import Connection


class LatestWinsSessions:
    """The latest-wins half of the speculative client (its request streams of ``track``).

    The client provides ``_conn`` (its :class:`~triton_sam.client.connection.Connection`),
    ``_book`` (the :class:`~triton_sam.client.request_book.RequestBook` of every request
    sent), ``_tracks``, ``_changed`` and ``_on_done`` (a finished task's bookkeeping).
    """

    _conn: Connection
    _book: RequestBook
    _tracks: dict[str, LatestWins]
    _changed: dict[str, asyncio.Event]

    _on_done: Callable[..., None]

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
        self._conn.transport()
        if session_id not in self._tracks and self._book.newest(session_id) is not None:
            raise InputValidationError(
                "session_id",
                f"{session_id!r} already has predict_async requests; track another session",
            )
        request = self._conn.request(point_coords, point_labels, box, mask_input, multimask_output)
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
            prediction = await self._conn.decode(event.payload, record.request_id)
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
