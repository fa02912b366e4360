"""The model instance's own event loop, on a thread of the stub (as the session model's)."""

from __future__ import annotations

import asyncio
import threading


class LoopThread:
    """An asyncio loop running on a daemon thread: ``submit`` schedules a coroutine there."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def submit(self, coroutine) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def stop(self, timeout: float = 10) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=timeout)
