"""Which decoder a session click runs on, on a CPU twin (standard library only).

The CPU twin has two copies of the decoder (``repository.config.busy_cpu_decoder``): the main
one, one instance with all the cores' threads (a lone click's latency), and the busy twin,
one single-thread instance per core (concurrent clicks side by side). A click goes to the
busy twin while another click is being decoded; otherwise to the main one, so one user
clicking on one image, even back to back, always gets all the threads.

(A variant that also kept clicks on the busy twin for 100 ms after another image's click,
to keep a 2-thread run from starting inside a burst of users, measured no gain on 2 cores,
c=4: 0.73-0.83x in-process ORT's clicks/s against 0.72-0.78x; not kept.)

The session model drives it from its event loop, so it takes no locks.
"""

from __future__ import annotations


class DecoderRouter:
    """Picks ``main`` or ``busy`` per click and counts clicks in flight.

    Args:
        main: the decoder for a click when no other is being decoded.
        busy: the busy twin; empty: always ``main``.
    """

    def __init__(self, main: str, busy: str = "") -> None:
        self.main, self.busy = main, busy
        self.in_flight = 0

    def start(self) -> str:
        """The decoder for a click about to be sent; counts it in flight."""
        chosen = self.busy if self.busy and self.in_flight else self.main
        self.in_flight += 1
        return chosen

    def finish(self) -> None:
        """A click came back (answered or failed)."""
        self.in_flight -= 1
