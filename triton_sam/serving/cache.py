"""A least-recently-used cache bounded in entries and bytes (standard library only).

The serving models drive it from one event loop (their ``execute`` coroutine), so it takes no
locks. The newest entry is never evicted by its own insertion, so one entry larger than
``max_bytes`` is still served, alone.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class LruCache:
    """key -> value, at most ``max_entries`` entries and ``max_bytes`` bytes (0 = no byte bound).

    Attributes:
        nbytes: bytes held (as given to :meth:`put`).
        evictions: entries dropped to stay within bounds, since creation.
    """

    def __init__(self, max_entries: int, max_bytes: int = 0) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries: got {max_entries}, expected >= 1")
        self.max_entries = int(max_entries)
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self.nbytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Any) -> bool:
        return key in self._entries

    def get(self, key: Any) -> Any:
        """The value under ``key`` (now the most recently used), or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: Any, value: Any, nbytes: int) -> list[Any]:
        """Keep ``value`` under ``key``; returns the keys evicted to stay within bounds."""
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= old[1]
        self._entries[key] = (value, int(nbytes))
        self.nbytes += int(nbytes)
        evicted = []
        while len(self._entries) > 1 and (
            len(self._entries) > self.max_entries
            or (self.max_bytes and self.nbytes > self.max_bytes)
        ):
            dropped, (_, size) = self._entries.popitem(last=False)
            self.nbytes -= size
            evicted.append(dropped)
        self.evictions += len(evicted)
        return evicted
