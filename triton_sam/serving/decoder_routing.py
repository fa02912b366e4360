"""Which decoder a session click runs on, on a CPU twin (standard library only).

The CPU twin has two copies of the decoder (``repository.config.busy_cpu_decoder``): the main
one, one instance with all the cores' threads (a lone click's latency), and the busy twin,
one single-thread instance per core (concurrent clicks side by side). A click goes to the
busy twin while another click is being decoded, and also while **other images** were decoded
within the last ``window_s``: several users are active, so more clicks are coming, and a
2-thread run started now would share the cores with the runs that follow it (measured on 2
cores, c=4: a main run overlapped by busy ones took 400-500 ms, the p95 of the burst, where a
run alone takes ~35 ms). One user clicking on one image, even back to back, always gets the
main decoder.

The session model drives it from its event loop, so it takes no locks.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# One decoder run on the busy twin plus a client's round trip and postprocessing (~50-100 ms
# on 2 cores): clicks of other users closer than this belong to the same burst.
DEFAULT_WINDOW_S = 0.1


class DecoderRouter:
    """Picks ``main`` or ``busy`` per click and counts clicks in flight.

    Args:
        main: the decoder for a lone user's click.
        busy: the busy twin; empty: always ``main``.
        window_s: how recently another image's click must have been decoded to count as
            another active user.
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        main: str,
        busy: str = "",
        window_s: float = DEFAULT_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.main, self.busy, self.window_s, self._clock = main, busy, window_s, clock
        self.in_flight = 0
        self._recent: dict[str, float] = {}  # image id -> when its last click was decoded

    def start(self, image_id: str) -> str:
        """The decoder for a click on ``image_id`` about to be sent; counts it in flight."""
        now = self._clock()
        self._recent = {k: t for k, t in self._recent.items() if now - t <= self.window_s}
        others = any(k != image_id for k in self._recent)
        chosen = self.busy if self.busy and (self.in_flight or others) else self.main
        self.in_flight += 1
        return chosen

    def finish(self, image_id: str) -> None:
        """The click on ``image_id`` came back (answered or failed)."""
        self.in_flight -= 1
        self._recent[image_id] = self._clock()
