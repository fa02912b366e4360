"""ClickQueue: the session model's bound on clicks at its decoder, and their waiting line."""

from __future__ import annotations

import asyncio

import pytest

from triton_sam.serving.click_queue import ClickQueue, QueueFull


def run(coro):
    return asyncio.run(coro)


def test_clicks_beyond_the_slots_wait_and_go_in_arrival_order() -> None:
    async def main():
        queue = ClickQueue(slots=2, max_waiting=8)
        assert [await queue.acquire(), await queue.acquire()] == [False, False]
        order = []

        async def click(i):
            waited = await queue.acquire()
            order.append((i, waited))

        tasks = [asyncio.create_task(click(i)) for i in range(3)]
        await asyncio.sleep(0)
        assert (queue.at_decoder, queue.waiting, order) == (2, 3, [])
        for _ in range(3):
            queue.release()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        assert order == [(0, True), (1, True), (2, True)]
        assert (queue.at_decoder, queue.waiting) == (2, 0)  # each release handed its slot on
        queue.release()
        queue.release()
        assert queue.at_decoder == 0

    run(main())


def test_a_full_line_is_refused_at_once_with_the_overload_wording() -> None:
    async def main():
        queue = ClickQueue(slots=1, max_waiting=1)
        await queue.acquire()
        waiting = asyncio.create_task(queue.acquire())
        await asyncio.sleep(0)
        with pytest.raises(QueueFull, match="exceeds maximum queue size"):
            await queue.acquire()
        queue.release()
        assert await waiting is True

    run(main())


def test_a_cancelled_waiting_click_leaves_the_line_and_loses_no_slot() -> None:
    async def main():
        queue = ClickQueue(slots=1, max_waiting=4)
        await queue.acquire()
        first = asyncio.create_task(queue.acquire())
        second = asyncio.create_task(queue.acquire())
        await asyncio.sleep(0)
        first.cancel()  # while it waits
        await asyncio.sleep(0)
        assert queue.waiting == 1
        queue.release()
        assert await second is True
        # handed a slot, then cancelled before it ran: the slot goes on, not lost
        third = asyncio.create_task(queue.acquire())
        await asyncio.sleep(0)
        queue.release()  # hands the slot to third
        third.cancel()
        with pytest.raises(asyncio.CancelledError):
            await third
        assert (queue.at_decoder, queue.waiting) == (0, 0)
        assert await queue.acquire() is False

    run(main())


def test_no_slots_means_no_limit_but_clicks_are_still_counted() -> None:
    async def main():
        queue = ClickQueue(slots=0, max_waiting=0)
        assert [await queue.acquire() for _ in range(100)] == [False] * 100
        assert queue.at_decoder == 100
        for _ in range(100):
            queue.release()
        assert queue.at_decoder == 0

    run(main())


def test_the_embed_line_names_itself_in_the_refusal() -> None:
    async def main():
        embeds = ClickQueue(slots=1, max_waiting=0, what="embeds wait for an encoder slot")
        assert await embeds.acquire() is False
        with pytest.raises(QueueFull, match="exceeds maximum queue size: 0 embeds wait for an"):
            await embeds.acquire()  # no waiting room: refused at once, nothing queued
        assert (embeds.at_decoder, embeds.waiting) == (1, 0)

    run(main())


def test_clicks_and_embeds_have_separate_lines() -> None:
    async def main():
        clicks = ClickQueue(slots=1, max_waiting=4)
        embeds = ClickQueue(slots=1, max_waiting=4, what="embeds wait for an encoder slot")
        await embeds.acquire()
        stuck = asyncio.create_task(embeds.acquire())  # an embed waits for the encoder
        await asyncio.sleep(0)
        assert await clicks.acquire() is False  # a click does not wait behind it
        stuck.cancel()

    run(main())
