"""Which decoder a session click runs on, on a CPU twin (standard library only).

The CPU twin has two copies of the decoder (``repository.config.busy_cpu_decoder``): the main
one, one instance with all the cores' threads (a lone click's latency), and the busy twin,
one single-thread instance per core (concurrent clicks side by side). A click goes to the
busy twin while a click on **another image** is being decoded (other users are clicking);
otherwise to the main one. One user's overlapping clicks on one image (a speculative client
firing on every mouse move, which cancels the stale ones) stay on the main decoder: the
newest click is the one that matters, and it should get all the threads, not one.

(A variant that also kept clicks on the busy twin for 100 ms after another image's click
measured no gain on 2 cores, c=4: 0.73-0.83x in-process ORT's clicks/s against
0.72-0.78x; not kept.)

The session model drives it from its event loop, so it takes no locks.
"""

from __future__ import annotations


class DecoderRouter:
    """Picks ``main`` or ``busy`` per click and counts clicks in flight per image.

    Args:
        main: the decoder for a click when no other image's click is being decoded.
        busy: the busy twin; empty: always ``main``.
    """

    def __init__(self, main: str, busy: str = "") -> None:
        self.main, self.busy = main, busy
        self._in_flight: dict[str, int] = {}  # image id -> its clicks being decoded

    @property
    def in_flight(self) -> int:
        """Clicks being decoded, all images together."""
        return sum(self._in_flight.values())

    def start(self, image_id: str) -> str:
        """The decoder for a click on ``image_id`` about to be sent; counts it in flight."""
        others = any(k != image_id for k in self._in_flight)
        self._in_flight[image_id] = self._in_flight.get(image_id, 0) + 1
        return self.busy if self.busy and others else self.main

    def finish(self, image_id: str) -> None:
        """The click on ``image_id`` came back (answered or failed)."""
        left = self._in_flight.get(image_id, 0) - 1
        if left > 0:
            self._in_flight[image_id] = left
        else:
            self._in_flight.pop(image_id, None)
