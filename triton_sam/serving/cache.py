"""A least-recently-used cache bounded in entries and bytes, shared fairly by tenants
(standard library only).

The serving models drive it from one event loop (their ``execute`` coroutine), so it takes no
locks. The newest entry is never evicted by its own insertion, so one entry larger than
``max_bytes`` is still served, alone.

Tenants (``owner``, :mod:`.protocol.tenancy`): the bounds are global, and each of the tenants
holding entries has a fair share of them, ``max_entries // tenants`` entries and
``max_bytes / tenants`` bytes. To stay within bounds the least recently used entry OF A TENANT
ABOVE ITS SHARE goes; with one tenant that is plain LRU. So a tenant within its share is never
evicted to make room for another tenant's entries (one tenant's burst of new images evicts
its own older ones), and a tenant alone may use the whole cache. The one exception: when the
only tenant above its share is the one whose new entry alone exceeds its byte share, plain LRU
decides (the byte bound wins over fairness; the session model's entries are all one size, so
that needs a ``max_bytes`` below two images).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

DEFAULT_OWNER = ""  # the default tenant (tenancy off)


class LruCache:
    """key -> value, at most ``max_entries`` entries and ``max_bytes`` bytes (0 = no byte bound).

    Attributes:
        nbytes: bytes held (as given to :meth:`put`).
        evictions: entries dropped to stay within bounds, since creation.
    """

    def __init__(self, max_entries: int, max_bytes: int = 0, on_evict=None) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries: got {max_entries}, expected >= 1")
        self.max_entries = int(max_entries)
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[Any, tuple[Any, int, str]] = OrderedDict()
        self._usage: dict[str, list[int]] = {}  # owner -> [entries, bytes]
        self.nbytes = 0
        self.evictions = 0
        self.on_evict = on_evict  # called (key, value) for each entry evicted (not popped)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Any) -> bool:
        return key in self._entries

    def keys(self) -> list[Any]:
        """The keys, least recently used first."""
        return list(self._entries)

    def get(self, key: Any) -> Any:
        """The value under ``key`` (now the most recently used), or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def peek(self, key: Any) -> Any:
        """The value under ``key`` (its LRU position unchanged), or None."""
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    def pop(self, key: Any) -> Any:
        """Remove ``key`` (not counted as an eviction); its value, or None."""
        value = self.peek(key)
        self._drop(key)
        return value

    def put(self, key: Any, value: Any, nbytes: int, owner: str = DEFAULT_OWNER) -> list[Any]:
        """Keep ``value`` under ``key`` for tenant ``owner`` (putting an existing key again
        replaces it and its size); returns the keys evicted to stay within bounds."""
        self._drop(key)
        self._entries[key] = (value, int(nbytes), owner)
        usage = self._usage.setdefault(owner, [0, 0])
        usage[0] += 1
        usage[1] += int(nbytes)
        self.nbytes += int(nbytes)
        evicted = []
        while len(self._entries) > 1 and (
            len(self._entries) > self.max_entries
            or (self.max_bytes and self.nbytes > self.max_bytes)
        ):
            victim = self._victim(key)
            value = self._entries[victim][0]
            self._drop(victim)
            evicted.append(victim)
            if self.on_evict is not None:
                self.on_evict(victim, value)
        self.evictions += len(evicted)
        return evicted

    def _victim(self, newest: Any) -> Any:
        """The least recently used key of a tenant above its fair share (never ``newest``)."""
        tenants = len(self._usage)
        entry_share = self.max_entries // tenants
        byte_share = self.max_bytes / tenants
        for key, (_, _, owner) in self._entries.items():
            count, nbytes = self._usage[owner]
            above = count > entry_share or (self.max_bytes and nbytes > byte_share)
            if key != newest and above:
                return key
        return next(key for key in self._entries if key != newest)

    def _drop(self, key: Any) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        _, nbytes, owner = entry
        self.nbytes -= nbytes
        usage = self._usage[owner]
        usage[0] -= 1
        usage[1] -= nbytes
        if usage[0] == 0:
            del self._usage[owner]
