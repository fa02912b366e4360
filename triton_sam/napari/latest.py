"""Latest-wins for hover previews (Qt-free): of a storm of requests, only the newest runs
to the screen.

One worker thread runs the jobs. A job that is no longer the newest when the worker reaches
it is skipped (never sent to the server); a job that finished after a newer one arrived is
discarded when its answer comes back (never painted). The counters let a test (and the
status line) prove both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Counts:
    """What happened to the submitted jobs.

    Attributes:
        submitted: jobs asked for.
        skipped: superseded before they ran (never sent).
        executed: jobs that ran (sent to the server).
        painted: answers delivered as the newest.
        discarded: answers that came back after a newer job was asked for.
        failed: jobs that raised (only the newest's error is delivered).
    """

    submitted: int = 0
    skipped: int = 0
    executed: int = 0
    painted: int = 0
    discarded: int = 0
    failed: int = 0


class LatestOnly:
    """Runs the newest of the submitted jobs on one daemon thread.

    Args:
        deliver: called on the worker thread with a zero-argument function that must be run
            where answers are shown (the widget hands it to the UI thread); that function
            checks, at that moment, whether its job is still the newest.
    """

    def __init__(self, deliver: Callable[[Callable[[], None]], None]) -> None:
        self._deliver = deliver
        self._lock = threading.Condition()
        self._pending: tuple[int, Callable[[], Any], Callable[..., None]] | None = None
        self._latest = 0
        self._undelivered = 0  # jobs taken by the worker whose answer is not yet shown
        self._closed = False
        self.counts = Counts()
        self._thread = threading.Thread(target=self._work, name="hover-latest-wins", daemon=True)
        self._thread.start()

    def submit(
        self, job: Callable[[], Any], show: Callable[[Any, BaseException | None], None]
    ) -> int:
        """Queue ``job`` as the newest; ``show(answer, error)`` runs on delivery if it still
        is the newest then. Returns its ticket."""
        with self._lock:
            self._latest += 1
            self.counts.submitted += 1
            if self._pending is not None:
                self.counts.skipped += 1  # replaced before the worker reached it
            self._pending = (self._latest, job, show)
            self._lock.notify()
            return self._latest

    def is_latest(self, ticket: int) -> bool:
        """True when no job was submitted after ``ticket``."""
        with self._lock:
            return ticket == self._latest

    @property
    def busy(self) -> bool:
        """A job waits, runs, or has an answer on its way to :meth:`_show`."""
        with self._lock:
            return self._pending is not None or self._undelivered > 0

    def close(self) -> None:
        """Stop the worker after the job it runs (pending ones are dropped)."""
        with self._lock:
            self._closed = True
            self._pending = None
            self._lock.notify()

    def _work(self) -> None:
        while True:
            with self._lock:
                while self._pending is None and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                assert self._pending is not None
                ticket, job, show = self._pending
                self._pending = None
                self._undelivered += 1
                self.counts.executed += 1
            try:
                answer, error = job(), None
            except Exception as e:  # shown (if still newest) by the UI, never raised here
                answer, error = None, e
            self._deliver(lambda t=ticket, a=answer, e=error, s=show: self._show(t, a, e, s))

    def _show(self, ticket: int, answer: Any, error: BaseException | None, show) -> None:
        with self._lock:
            self._undelivered -= 1
            if self._closed:  # the widget is gone: nothing to show on
                return
            newest = ticket == self._latest
            if error is not None:
                self.counts.failed += 1
            elif newest:
                self.counts.painted += 1
            else:
                self.counts.discarded += 1
        if newest:
            show(answer, error)
