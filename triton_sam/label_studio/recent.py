"""The task images fetched lately, so a task's later clicks do not download its image again.

Label Studio sends the task, with its image URL, with every click: without this the backend
would fetch the whole file from Label Studio before each mask (a 20 MB section: a fifth of a
second on a LAN, per click). The image is kept per tenant (one tenant never learns, by
timing, what another opened), bounded in bytes (least recently used first out) and in age (a
file replaced at the same URL is fetched again once its entry is older than ``max_age_s``).
The URL is checked by the fetcher's bounds before every lookup, so a cached image is never
served for a URL the fetcher would refuse.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from triton_sam.label_studio.fetch import Fetcher

#: Bytes of image files kept, all tenants together (a few large EM sections).
DEFAULT_MAX_BYTES = 256 * 2**20
#: Seconds an image is reused before it is fetched again.
DEFAULT_MAX_AGE_S = 600.0


@dataclass(frozen=True)
class _Entry:
    data: bytes
    size: tuple[int, int]
    fetched_at: float


class RecentImages:
    """:meth:`Fetcher.fetch_image` with a bounded memory of what it fetched (thread-safe).

    Args:
        fetcher: the bounded fetcher (its URL checks run on every call).
        max_bytes: image bytes kept at most; a file larger than this is never kept.
        max_age_s: an entry older than this is fetched again.
        clock: seconds (monotonic); tests pass their own.
    """

    def __init__(
        self,
        fetcher: Fetcher,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fetcher, self.max_bytes, self.max_age_s, self._clock = (
            fetcher,
            max_bytes,
            max_age_s,
            clock,
        )
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def kept_bytes(self) -> int:
        """Image bytes held now."""
        return self._bytes

    def fetch_image(self, url: object, field: str, *, tenant: str) -> tuple[bytes, tuple[int, int]]:
        """As :meth:`Fetcher.fetch_image`, from memory when ``tenant`` fetched it lately."""
        key = (tenant, self.fetcher.resolve(url, field))  # refuses what the bounds refuse
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and self._clock() - entry.fetched_at < self.max_age_s:
                self._entries.move_to_end(key)
                return entry.data, entry.size
        data, size = self.fetcher.fetch_image(url, field)
        self._keep(key, _Entry(data, size, self._clock()))
        return data, size

    def _keep(self, key: tuple[str, str], entry: _Entry) -> None:
        if len(entry.data) > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old.data)
            self._entries[key] = entry
            self._bytes += len(entry.data)
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= len(evicted.data)
