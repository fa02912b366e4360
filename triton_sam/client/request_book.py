"""Request bookkeeping of the speculative client, without I/O (unit-testable without a server).

A "session" here is the reference API's: one user's stream of prompts (``session_id=``), not
the server's embedding cache (``client/embedding_path.py``).

- :class:`RequestBook`: every request sent, by session, with its status. Safe from any thread.
  A status changes once, from ``pending`` to ``completed``, ``cancelled`` or ``failed``; the
  first change wins, so a request cancelled while its answer was arriving stays cancelled
  (the reference client let "completed" overwrite "cancelled").
- :class:`LatestWins`: one session's latest-wins queue for interactive tools: at most one
  request in flight plus the newest event waiting; an event replaced while waiting is never
  sent, and only the newest event's outcome is ever reported as the latest.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from triton_sam.errors import InputValidationError

RequestStatus = Literal["pending", "completed", "cancelled", "failed"]
STATUSES: tuple[str, ...] = ("pending", "completed", "cancelled", "failed")
_FINAL = frozenset(STATUSES[1:])


@dataclass(eq=False)
class RequestRecord:
    """One request of a session.

    Attributes:
        session_id / request_id: its keys.
        seq: creation order across the client (higher = newer).
        status: ``pending`` until it completes, is cancelled or fails.
        handle: what runs it (the client stores its ``asyncio.Task`` here).
        error: the exception of a failed request.
    """

    session_id: str
    request_id: str
    seq: int
    status: str = "pending"
    handle: Any = None
    error: BaseException | None = None


class RequestBook:
    """Requests by session with their statuses; every method is atomic (one lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, dict[str, RequestRecord]] = {}
        self._seq = itertools.count()

    def add(self, session_id: str, request_id: str | None = None) -> RequestRecord:
        """Register a new pending request (a fresh uuid4 id when ``request_id`` is None).

        Raises:
            InputValidationError: ``request_id`` already names a request of this session.
        """
        with self._lock:
            records = self._sessions.setdefault(session_id, {})
            request_id = str(uuid.uuid4()) if request_id is None else str(request_id)
            if request_id in records:
                raise InputValidationError(
                    "request_id", f"{request_id!r} is already used in session {session_id!r}"
                )
            record = RequestRecord(session_id, request_id, next(self._seq))
            records[request_id] = record
            return record

    def finish(
        self, record: RequestRecord, status: str, error: BaseException | None = None
    ) -> bool:
        """Move ``record`` from pending to ``status``; False (and no change) when it had
        already left pending, e.g. cancelled before its answer was handed out."""
        if status not in _FINAL:
            raise InputValidationError(
                "status", f"got {status!r}, expected one of {sorted(_FINAL)}"
            )
        with self._lock:
            if record.status != "pending":
                return False
            record.status = status
            record.error = error
            return True

    def cancel(self, session_id: str, *, keep: RequestRecord | None = None) -> list[RequestRecord]:
        """Mark every pending request of the session cancelled, except ``keep``.

        Returns:
            The records marked (oldest first); the caller cancels their handles.
        """
        with self._lock:
            marked = [
                r
                for r in self._sessions.get(session_id, {}).values()
                if r.status == "pending" and r is not keep
            ]
            for r in marked:
                r.status = "cancelled"
        return marked

    def newest(self, session_id: str) -> RequestRecord | None:
        """The session's most recently added request, or None."""
        with self._lock:
            records = self._sessions.get(session_id, {})
            return max(records.values(), key=lambda r: r.seq, default=None)

    def status(self, session_id: str, request_id: str) -> str | None:
        """Status of one request, or None when unknown."""
        with self._lock:
            record = self._sessions.get(session_id, {}).get(request_id)
            return None if record is None else record.status

    def counts(self, session_id: str) -> dict[str, int]:
        """Number of the session's requests in each status (every status is a key)."""
        with self._lock:
            counts = dict.fromkeys(STATUSES, 0)
            for r in self._sessions.get(session_id, {}).values():
                counts[r.status] += 1
            return counts

    def records(self, session_id: str | None = None) -> list[RequestRecord]:
        """The requests of one session, or of all sessions, oldest first."""
        with self._lock:
            sessions = (
                self._sessions.values()
                if session_id is None
                else [self._sessions.get(session_id, {})]
            )
            return sorted((r for s in sessions for r in s.values()), key=lambda r: r.seq)

    def forget(self, session_id: str) -> list[RequestRecord]:
        """Drop a session's records; returns them."""
        with self._lock:
            return list(self._sessions.pop(session_id, {}).values())

    def session_ids(self) -> list[str]:
        """Sessions with at least one request."""
        with self._lock:
            return list(self._sessions)


@dataclass(eq=False)
class TrackedEvent:
    """One input event of a latest-wins session (e.g. a mouse position).

    Attributes:
        seq: order of the event in its session (0, 1, ...).
        payload: what the client sends for it (prompt tensors, image snapshot).
        record: its request, once sent.
    """

    seq: int
    payload: Any = None
    record: RequestRecord | None = None


@dataclass(frozen=True)
class Outcome:
    """How an event's request ended: a value, or an error (cancelled / failed)."""

    seq: int
    value: Any = None
    error: BaseException | None = None


@dataclass
class LatestWins:
    """Latest-wins queue of one session. Not thread-safe: drive it from one event loop.

    Invariants: at most one event in flight and one waiting; :attr:`outcome` is only ever
    the outcome of the newest event offered, so a superseded or cancelled request's answer
    can never be taken for the latest.
    """

    in_flight: TrackedEvent | None = None
    waiting: TrackedEvent | None = None
    events: int = 0
    sent: int = 0
    superseded: int = 0
    outcome: Outcome | None = None
    last_value: Outcome | None = field(default=None, repr=False)

    @property
    def newest_seq(self) -> int:
        """Seq of the newest event offered (-1 before the first)."""
        return self.events - 1

    @property
    def settled(self) -> bool:
        """True when the newest event has an outcome (its value, or why it has none)."""
        return self.outcome is not None and self.outcome.seq == self.newest_seq

    def new_event(self, payload: Any = None) -> TrackedEvent:
        """An event numbered after every earlier one (not yet offered)."""
        event = TrackedEvent(self.events, payload)
        self.events += 1
        return event

    def offer(self, event: TrackedEvent) -> TrackedEvent | None:
        """Take the newest event.

        Returns:
            The event to send now when nothing is in flight, else None: the event waits,
            replacing (superseding, never sending) the one that was waiting.
        """
        if event.seq != self.newest_seq:
            raise InputValidationError("event", "offer events in the order new_event made them")
        if self.in_flight is None:
            return self._launch(event)
        if self.waiting is not None:
            self.superseded += 1
        self.waiting = event
        return None

    def settle(
        self, event: TrackedEvent, value: Any = None, error: BaseException | None = None
    ) -> TrackedEvent | None:
        """The request of ``event`` ended. Keep its outcome only while it is the newest event.

        Returns:
            The waiting event to send next, or None. Ignores events no longer in flight
            (cancelled by :meth:`cancel`, whose bookkeeping is already done).
        """
        if event is not self.in_flight:
            return None
        self.in_flight = None
        if error is None:
            self.last_value = Outcome(event.seq, value)
        if event.seq == self.newest_seq:
            self.outcome = Outcome(event.seq, value, error)
        if self.waiting is not None:
            return self._launch(self.waiting)
        return None

    def cancel(
        self, *, keep_latest: bool, error: BaseException
    ) -> tuple[TrackedEvent | None, TrackedEvent | None]:
        """Cancel the stale work of the session.

        ``keep_latest=True`` cancels the in-flight request only when a newer event waits
        (which is then sent at once); the newest event is never cancelled. With
        ``keep_latest=False`` the in-flight request is cancelled, the waiting event dropped,
        and the newest event's outcome is ``error``.

        Returns:
            ``(cancelled, to_send)``: the in-flight event whose request to cancel, and the
            event to send now; either may be None.
        """
        if keep_latest and self.waiting is None:
            return None, None
        cancelled, self.in_flight = self.in_flight, None
        if keep_latest:
            assert self.waiting is not None
            return cancelled, self._launch(self.waiting)
        if self.waiting is not None:
            self.superseded += 1
            self.waiting = None
        if self.events and not self.settled:
            self.outcome = Outcome(self.newest_seq, None, error)
        return cancelled, None

    def _launch(self, event: TrackedEvent) -> TrackedEvent:
        self.in_flight, self.waiting = event, None
        self.sent += 1
        return event
