"""How many clicks (and embeds) a session model works on at once (standard library only).

On the CPU twin the session model's decoder has no dynamic batcher (``repository.config.
unbatched_cpu_decoder``: measured, the batcher's hand-off between runs idled the cores), so
the two things the batcher did for clicks are done here, on the session model's event loop:

- **bound**: at most ``slots`` clicks are at the decoder (its instances, plus one queued at
  the instance so that the next run starts the moment one ends), at most ``max_waiting``
  wait here; one more is refused at once (:class:`QueueFull`), like a full Triton queue;
- **cancellation**: a click that waited is checked before it goes to the decoder, so one
  cancelled meanwhile (a speculative client's stale click) is answered unrun.

Waiting clicks go in arrival order. ``slots`` 0 means no limit (configs without the
parameter: the decoder's own batcher bounds and cancels, as on a GPU).

Embeds get a queue of their own (``what="embeds wait for an encoder slot"``): at most
``max_concurrent_embeds`` images are decoded, preprocessed and encoded at once (each holds
its pixels, its 12 MiB encoder input and its features until it is done, and the encoder's
arena grows with the batches it runs), at most ``max_waiting_embeds`` wait, the rest are
refused at once. The two queues are separate, so a click never waits behind an embed.
"""

from __future__ import annotations

import asyncio
from collections import deque


class QueueFull(Exception):
    """``max_waiting`` requests already wait for a slot."""


class ClickQueue:
    """At most ``slots`` clicks at the decoder; the rest wait, at most ``max_waiting``.

    Args:
        slots: clicks at the decoder at once; 0: no limit.
        max_waiting: clicks that may wait for a slot.
        what: what waits, and for what (the refusal's message: "N <what>").
    """

    def __init__(
        self, slots: int, max_waiting: int, *, what: str = "clicks wait for the decoder"
    ) -> None:
        self.slots, self.max_waiting, self.what = slots, max_waiting, what
        self.at_decoder = 0
        self._waiting: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        """Clicks waiting for a slot."""
        return len(self._waiting)

    async def acquire(self) -> bool:
        """Take a slot, waiting for one if all are taken; True if it waited.

        Raises:
            QueueFull: ``max_waiting`` clicks already wait.
        """
        if self.slots <= 0 or (self.at_decoder < self.slots and not self._waiting):
            self.at_decoder += 1
            return False
        if len(self._waiting) >= self.max_waiting:
            raise QueueFull(f"exceeds maximum queue size: {self.max_waiting} {self.what}")
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        try:
            await turn  # release() hands its slot over (at_decoder unchanged)
        except asyncio.CancelledError:
            if turn in self._waiting:
                self._waiting.remove(turn)
            elif turn.done() and not turn.cancelled():
                self.release()  # the slot was handed over just before: pass it on
            raise
        return True

    def release(self) -> None:
        """Give the slot back: to the first waiting click, or free it."""
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.at_decoder -= 1
