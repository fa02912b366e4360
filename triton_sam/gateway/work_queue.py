"""The gateway's sessions and its work queue, with cancellation that drops queued work.

SAM_service (``sam_service/sam_queue.py``) puts every embedding on one work queue drained by
one worker per GPU, and keeps each session's unanswered work items in ``session_dict``; a
request with ``cancel_pending`` (or ``POST /cancel_pending``) marks every one of them
cancelled and answers each waiting request at once with 499, whether the worker had taken it
or not; a worker skips items marked cancelled. :class:`WorkQueue` is the same contract on
asyncio: at most ``workers`` items run at once (each one Triton request), the rest wait
here, so a cancelled item that had not started never reaches Triton. An item already sent to
Triton has its asyncio task cancelled: over gRPC that cancels the RPC (Triton drops it while
it still waits in the model's dynamic-batching queue; once the model runs it, it runs to the
end and the answer is discarded); over HTTP Triton has no cancellation and the request runs.

Unlike SAM_service, the queue is bounded (per session and overall: the next request is
refused at once with :class:`QueueFullError`), and session ids are only those this gateway
issued (:class:`SessionRegistry`), bound to the tenant that asked for them.

Pure asyncio, no I/O: the unit tests drive it with fake work.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

#: Sessions kept at most; past it the least recently used one with no work is forgotten.
DEFAULT_MAX_SESSIONS = 10_000


class CancelledByClientError(Exception):
    """The work was cancelled by its session (``cancel_pending``): answered 499."""


class QueueFullError(Exception):
    """The queue refused new work; ``scope`` is ``"session"`` or ``"gateway"``."""

    def __init__(self, scope: str, limit: int) -> None:
        super().__init__(f"{scope}: {limit} requests already wait")
        self.scope, self.limit = scope, limit


class UnknownSessionError(Exception):
    """A session id this gateway did not issue (or issued to another tenant, or forgot)."""


@dataclass(frozen=True)
class QueueStats:
    """Counters since start: work ``started`` (sent on), ``finished`` (answered by the work),
    cancelled while ``queued`` (never started) and while ``running``."""

    started: int = 0
    finished: int = 0
    cancelled_queued: int = 0
    cancelled_running: int = 0


@dataclass(eq=False)
class _Item:
    session: str | None
    work: Callable[[], Awaitable[Any]]
    future: asyncio.Future
    task: asyncio.Task | None = None
    cancelled: bool = False


@dataclass
class _Counters:
    started: int = 0
    finished: int = 0
    cancelled_queued: int = 0
    cancelled_running: int = 0


class WorkQueue:
    """FIFO of work run at most ``workers`` at a time, cancellable per session.

    Args:
        workers: items running at once (SAM_service: one per GPU).
        max_queued: items waiting at most, all sessions together.
        max_queued_per_session: items one session may have waiting.
    """

    def __init__(self, *, workers: int, max_queued: int, max_queued_per_session: int) -> None:
        if workers < 1 or max_queued < 0 or max_queued_per_session < 0:
            raise ValueError("workers >= 1 and queue limits >= 0 expected")
        self.workers = workers
        self.max_queued = max_queued
        self.max_queued_per_session = max_queued_per_session
        self._queued: deque[_Item] = deque()
        self._running: set[_Item] = set()
        self._counters = _Counters()

    # -- state -----------------------------------------------------------------------------
    def queued(self, session: str | None = None) -> int:
        """Items waiting (of ``session`` when given)."""
        if session is None:
            return len(self._queued)
        return sum(1 for item in self._queued if item.session == session)

    def running(self, session: str | None = None) -> int:
        """Items running (of ``session`` when given)."""
        if session is None:
            return len(self._running)
        return sum(1 for item in self._running if item.session == session)

    def has_work(self, session: str) -> bool:
        """True while ``session`` has an item waiting or running."""
        return self.queued(session) > 0 or self.running(session) > 0

    @property
    def stats(self) -> QueueStats:
        """The counters (a copy)."""
        c = self._counters
        return QueueStats(c.started, c.finished, c.cancelled_queued, c.cancelled_running)

    # -- work ------------------------------------------------------------------------------
    async def submit(self, work: Callable[[], Awaitable[T]], session: str | None = None) -> T:
        """Run ``work()`` when a worker is free and return its result.

        Raises:
            QueueFullError: no worker free and the session's or the gateway's queue is full
                (nothing was queued).
            CancelledByClientError: the session cancelled it (queued: it never ran).
            Exception: what ``work()`` raised.
        """
        loop = asyncio.get_running_loop()
        item = _Item(session, work, loop.create_future())
        if len(self._running) >= self.workers:
            if len(self._queued) >= self.max_queued:
                raise QueueFullError("gateway", self.max_queued)
            if session is not None and self.queued(session) >= self.max_queued_per_session:
                raise QueueFullError("session", self.max_queued_per_session)
        self._queued.append(item)
        self._dispatch()
        try:
            return await asyncio.shield(item.future)
        except asyncio.CancelledError:
            # The waiting request itself went away (server shutdown): drop its work too.
            self._cancel(item)
            raise

    def cancel_session(self, session: str) -> int:
        """Cancel every unanswered item of ``session``: the waiting ones are dropped (never
        run), the running ones have their task cancelled; all answer
        :class:`CancelledByClientError` at once. Returns how many were cancelled."""
        items = [i for i in (*self._queued, *self._running) if i.session == session]
        for item in items:
            self._cancel(item)
        return len(items)

    def _cancel(self, item: _Item) -> None:
        if item.cancelled or item.future.done():
            return
        item.cancelled = True
        if item.task is None:
            self._queued.remove(item)
            self._counters.cancelled_queued += 1
        else:
            item.task.cancel()  # the slot frees when the task has ended (its RPC cancelled)
            self._counters.cancelled_running += 1
        item.future.set_exception(CancelledByClientError())
        item.future.exception()  # retrieved: no "never retrieved" warning if nobody awaits

    def _dispatch(self) -> None:
        while self._queued and len(self._running) < self.workers:
            item = self._queued.popleft()
            self._running.add(item)
            self._counters.started += 1
            item.task = asyncio.ensure_future(item.work())
            item.task.add_done_callback(lambda task, item=item: self._done(item, task))

    def _done(self, item: _Item, task: asyncio.Task) -> None:
        self._running.discard(item)
        if not item.future.done():
            if task.cancelled():
                item.future.set_exception(CancelledByClientError())
            elif task.exception() is not None:
                item.future.set_exception(task.exception())
            else:
                self._counters.finished += 1
                item.future.set_result(task.result())
        elif not task.cancelled():
            task.exception()  # a cancelled item's late error is nobody's: retrieve it
        self._dispatch()


@dataclass
class SessionRegistry:
    """Session ids the gateway issued, each bound to the tenant that asked for it.

    SAM_service issues ``uuid4`` ids but accepts any string as a session; here an id is a
    bearer capability (it can cancel the session's work), so only issued ids are accepted,
    and only from their tenant: any other id, or one of another tenant, is
    :class:`UnknownSessionError` (the two are indistinguishable to the caller).

    Attributes:
        max_sessions: ids kept at most; past it the least recently used id whose session
            has no work is forgotten (its next use is refused: fetch a new id).
    """

    max_sessions: int = DEFAULT_MAX_SESSIONS
    _tenants: OrderedDict[str, str] = field(default_factory=OrderedDict)

    def issue(self, tenant: str, busy: Callable[[str], bool] = lambda _: False) -> str:
        """A new id (122 random bits in uuid4 text, as SAM_service answers) for ``tenant``;
        ``busy(id)`` says which ids still have work and may not be forgotten."""
        session = str(uuid.uuid4())
        self._tenants[session] = tenant
        if len(self._tenants) > self.max_sessions:
            for old in list(self._tenants):
                if old != session and not busy(old):
                    del self._tenants[old]
                    break
        return session

    def check(self, session: str, tenant: str) -> str:
        """``session`` when it was issued to ``tenant`` (and mark it recently used).

        Raises:
            UnknownSessionError: not issued here, forgotten, or another tenant's.
        """
        if self._tenants.get(session) != tenant:
            raise UnknownSessionError(session)
        self._tenants.move_to_end(session)
        return session

    def __len__(self) -> int:
        return len(self._tenants)
