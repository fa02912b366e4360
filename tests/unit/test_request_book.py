"""Session bookkeeping of the speculative client, without a server or an event loop."""

from __future__ import annotations

import random
import threading

import pytest

from triton_sam.client.request_book import STATUSES, LatestWins, RequestBook
from triton_sam.errors import InputValidationError

CANCELLED = RuntimeError("cancelled")


# -- RequestBook ---------------------------------------------------------------------------
def test_a_status_changes_once_and_the_first_change_wins():
    book = RequestBook()
    record = book.add("s")
    assert record.status == "pending" and len(record.request_id) == 36  # a uuid4
    assert book.finish(record, "cancelled")
    assert not book.finish(record, "completed")  # the reference let this overwrite "cancelled"
    assert book.status("s", record.request_id) == "cancelled"


def test_counts_have_every_status_and_sessions_are_separate():
    book = RequestBook()
    a, b, _ = book.add("s", "a"), book.add("s", "b"), book.add("other", "a")
    book.finish(a, "completed")
    book.finish(b, "failed", ValueError("x"))
    assert book.counts("s") == {"pending": 0, "completed": 1, "cancelled": 0, "failed": 1}
    assert book.counts("other") == {"pending": 1, "completed": 0, "cancelled": 0, "failed": 0}
    assert book.counts("nobody") == dict.fromkeys(STATUSES, 0)
    assert isinstance(b.error, ValueError)


def test_duplicate_request_id_in_a_session_is_refused():
    book = RequestBook()
    book.add("s", "r1")
    with pytest.raises(InputValidationError) as info:
        book.add("s", "r1")
    assert info.value.field == "request_id"
    book.add("t", "r1")  # another session may reuse it


def test_cancel_marks_only_pending_and_spares_keep():
    book = RequestBook()
    done, old, newest = book.add("s"), book.add("s"), book.add("s")
    book.finish(done, "completed")
    assert book.newest("s") is newest
    marked = book.cancel("s", keep=book.newest("s"))
    assert marked == [old]
    assert (done.status, old.status, newest.status) == ("completed", "cancelled", "pending")
    assert book.cancel("s") == [newest]
    assert book.cancel("s") == []


def test_finish_refuses_an_unknown_status():
    book = RequestBook()
    with pytest.raises(InputValidationError):
        book.finish(book.add("s"), "pending")


def test_book_is_consistent_under_threads():
    book = RequestBook()
    n_threads, per_thread = 8, 300
    barrier = threading.Barrier(n_threads)

    def work(i: int) -> None:
        barrier.wait()
        for j in range(per_thread):
            record = book.add(f"s{j % 3}")
            if j % 2:
                book.finish(record, "completed")
            if j % 5 == 0:
                book.cancel(f"s{(j + i) % 3}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = book.records()
    assert len(records) == n_threads * per_thread
    assert len({r.seq for r in records}) == len(records)  # no sequence number handed out twice
    totals = [sum(book.counts(s).values()) for s in book.session_ids()]
    assert sum(totals) == len(records)


def test_forget_drops_a_session():
    book = RequestBook()
    book.add("s")
    assert len(book.forget("s")) == 1
    assert book.session_ids() == [] and book.newest("s") is None


# -- LatestWins ----------------------------------------------------------------------------
def test_one_in_flight_and_only_the_newest_waits():
    q = LatestWins()
    first = q.new_event("e0")
    assert q.offer(first) is first  # nothing in flight: sent at once
    for i in range(1, 5):
        assert q.offer(q.new_event(f"e{i}")) is None  # waits, replacing the previous one
    assert q.waiting is not None and q.waiting.seq == 4
    assert q.superseded == 3  # e1..e3 never sent
    nxt = q.settle(first, value="m0")
    assert nxt is not None and nxt.seq == 4
    assert q.outcome is None and not q.settled  # e0's mask is not the latest
    assert q.last_value is not None and q.last_value.value == "m0"  # but can be previewed
    assert q.settle(nxt, value="m4") is None
    assert q.settled and q.outcome.value == "m4" and q.sent == 2


def test_a_newer_event_unsettles_the_latest():
    q = LatestWins()
    e0 = q.new_event()
    q.offer(e0)
    q.settle(e0, value="m0")
    assert q.settled
    q.offer(q.new_event())
    assert not q.settled  # the newest event has no mask yet: m0 must not be returned


def test_errors_of_the_newest_event_are_its_outcome():
    q = LatestWins()
    e0 = q.new_event()
    q.offer(e0)
    error = ValueError("server error")
    q.settle(e0, error=error)
    assert q.settled and q.outcome.error is error and q.last_value is None


def test_cancel_keep_latest_replaces_a_stale_in_flight_request():
    q = LatestWins()
    e0 = q.new_event()
    q.offer(e0)
    e1 = q.new_event()
    q.offer(e1)
    cancelled, to_send = q.cancel(keep_latest=True, error=CANCELLED)
    assert cancelled is e0 and to_send is e1 and q.in_flight is e1
    assert q.settle(e0, value="late m0") is None  # the cancelled request is ignored
    assert q.outcome is None and q.last_value is None
    # nothing newer waiting: the in-flight request is the newest, kept
    assert q.cancel(keep_latest=True, error=CANCELLED) == (None, None)


def test_cancel_all_gives_the_newest_a_cancelled_outcome():
    q = LatestWins()
    e0 = q.new_event()
    q.offer(e0)
    q.offer(q.new_event())
    cancelled, to_send = q.cancel(keep_latest=False, error=CANCELLED)
    assert cancelled is e0 and to_send is None and q.waiting is None
    assert q.settled and q.outcome.error is CANCELLED and q.superseded == 1
    assert q.settle(e0, value="late") is None and q.outcome.error is CANCELLED


def test_events_must_be_offered_in_order():
    q = LatestWins()
    old = q.new_event()
    q.new_event()
    with pytest.raises(InputValidationError):
        q.offer(old)


@pytest.mark.parametrize("seed", range(20))
def test_random_interleavings_keep_the_invariants(seed):
    """Whatever the order of events, answers and cancels: one request in flight at most,
    superseded events never sent, and the settled outcome always belongs to the newest."""
    rng = random.Random(seed)
    q = LatestWins()
    sent: list[int] = []
    for _ in range(300):
        op = rng.random()
        if op < 0.5:
            event = q.new_event()
            launched = q.offer(event)
            if launched is not None:
                assert launched is event
                sent.append(launched.seq)
        elif op < 0.85 and q.in_flight is not None:
            event = q.in_flight
            nxt = q.settle(event, value=f"mask {event.seq}")
            if nxt is not None:
                sent.append(nxt.seq)
        elif op < 0.95:
            _, to_send = q.cancel(keep_latest=True, error=CANCELLED)
            if to_send is not None:
                sent.append(to_send.seq)
        else:
            q.cancel(keep_latest=False, error=CANCELLED)
        if q.settled and q.outcome.error is None:
            assert q.outcome.value == f"mask {q.newest_seq}"
        if q.outcome is not None:
            assert q.outcome.seq <= q.newest_seq
    assert sent == sorted(set(sent))  # each event sent at most once, in order
    assert len(sent) + q.superseded + (q.waiting is not None) == q.events
