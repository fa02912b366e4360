"""The gateway's work queue and sessions (triton_sam/gateway/work_queue.py), with fake work.

Deterministic: work waits on events the test sets, and the test steps the loop with
``asyncio.sleep(0)`` until the queue reaches the state it checks; no timing thresholds.
"""

from __future__ import annotations

import asyncio

import pytest

from triton_sam.gateway.work_queue import (
    CancelledByClientError,
    QueueFullError,
    SessionRegistry,
    UnknownSessionError,
    WorkQueue,
)


class Work:
    """Work items that finish when released; ``ran`` lists the ones that started."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.release: dict[str, asyncio.Event] = {}
        self.cancelled: list[str] = []

    def __call__(self, name: str):
        self.release[name] = asyncio.Event()

        async def work() -> str:
            self.ran.append(name)
            try:
                await self.release[name].wait()
            except asyncio.CancelledError:
                self.cancelled.append(name)
                raise
            return name

        return work


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def run(coro):
    return asyncio.run(coro)


def test_at_most_workers_run_and_the_rest_wait_in_order():
    async def main():
        q, w = WorkQueue(workers=1, max_queued=8, max_queued_per_session=8), Work()
        tasks = [asyncio.create_task(q.submit(w(n), "s")) for n in "abc"]
        await settle()
        assert w.ran == ["a"] and q.queued("s") == 2 and q.running() == 1
        for n in "abc":
            w.release[n].set()
            await settle()
        assert [t.result() for t in tasks] == ["a", "b", "c"]
        assert q.stats.started == 3 and q.stats.finished == 3

    run(main())


def test_cancel_session_drops_queued_work_and_cancels_running_work():
    async def main():
        q, w = WorkQueue(workers=1, max_queued=8, max_queued_per_session=8), Work()
        other = asyncio.create_task(q.submit(w("other"), "t"))  # another session, running
        await settle()
        mine = [asyncio.create_task(q.submit(w(n), "s")) for n in ("q1", "q2")]
        await settle()
        assert q.queued("s") == 2
        assert q.cancel_session("s") == 2
        await settle()
        for task in mine:  # answered at once, without running
            assert isinstance(task.exception(), CancelledByClientError)
        w.release["other"].set()
        await settle()
        assert other.result() == "other"
        assert w.ran == ["other"]  # the cancelled ones never started
        assert q.stats.cancelled_queued == 2 and q.stats.started == 1

    run(main())


def test_cancel_answers_running_work_at_once_and_cancels_its_task():
    async def main():
        q, w = WorkQueue(workers=1, max_queued=8, max_queued_per_session=8), Work()
        running = asyncio.create_task(q.submit(w("a"), "s"))
        await settle()
        waiting = asyncio.create_task(q.submit(w("b"), "t"))
        await settle()
        q.cancel_session("s")
        await settle()
        assert isinstance(running.exception(), CancelledByClientError)
        assert w.cancelled == ["a"]  # the RPC's task was cancelled...
        assert w.ran == ["a", "b"]  # ...which freed the worker for the next session's work
        w.release["b"].set()
        await settle()
        assert waiting.result() == "b" and q.stats.cancelled_running == 1

    run(main())


def test_new_work_after_a_cancel_runs():
    async def main():
        q, w = WorkQueue(workers=1, max_queued=8, max_queued_per_session=8), Work()
        first = asyncio.create_task(q.submit(w("a"), "s"))
        await settle()
        q.cancel_session("s")  # as cancel_pending=true does before queueing its own work
        second = asyncio.create_task(q.submit(w("b"), "s"))
        await settle()
        w.release["b"].set()
        await settle()
        assert isinstance(first.exception(), CancelledByClientError)
        assert second.result() == "b"

    run(main())


def test_bounds_refuse_at_once_per_session_and_overall():
    async def main():
        q, w = WorkQueue(workers=1, max_queued=3, max_queued_per_session=2), Work()
        tasks = [asyncio.create_task(q.submit(w(n), "s")) for n in ("run", "q1", "q2")]
        await settle()
        with pytest.raises(QueueFullError) as e:
            await q.submit(w("q3"), "s")
        assert e.value.scope == "session"
        tasks.append(asyncio.create_task(q.submit(w("t1"), "t")))
        await settle()
        with pytest.raises(QueueFullError) as e:
            await q.submit(w("t2"), "t")
        assert e.value.scope == "gateway"
        for name in ("run", "q1", "q2", "t1"):
            w.release[name].set()
        await asyncio.gather(*tasks)
        assert "q3" not in w.ran and "t2" not in w.ran

    run(main())


def test_work_errors_reach_the_caller():
    async def main():
        q = WorkQueue(workers=1, max_queued=1, max_queued_per_session=1)

        async def boom():
            raise RuntimeError("encoder failed")

        with pytest.raises(RuntimeError, match="encoder failed"):
            await q.submit(boom, None)

    run(main())


def test_sessions_are_issued_unguessable_and_bound_to_their_tenant():
    sessions = SessionRegistry()
    a = sessions.issue("lab-a")
    assert len(a) == 36 and a != sessions.issue("lab-a")  # uuid4 text, as SAM_service
    assert sessions.check(a, "lab-a") == a
    with pytest.raises(UnknownSessionError):
        sessions.check(a, "lab-b")  # another tenant's id is an unknown one
    with pytest.raises(UnknownSessionError):
        sessions.check("my-own-id", "lab-a")  # never a client's choice


def test_sessions_forget_the_least_recently_used_idle_one():
    sessions = SessionRegistry(max_sessions=2)
    busy_one = sessions.issue("")
    idle = sessions.issue("")
    sessions.issue("", busy=lambda s: s == busy_one)  # over the bound: the idle one goes
    assert len(sessions) == 2
    sessions.check(busy_one, "")
    with pytest.raises(UnknownSessionError):
        sessions.check(idle, "")
