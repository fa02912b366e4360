"""Tracking sessions held by one server process: issued ids, tenants, bounds, and who may evict
whom (dependency-free).

Identity. ``create`` issues each session's id: ``SESSION_ID_BYTES`` random bytes from
:mod:`secrets` (128 bits), URL-safe base64. A session is held under ``(tenant, id)``, the
tenant being the one of the request that created it, so an id the server never issued, one it
issued to another tenant, and one it evicted are the same miss: ``SessionNotFound``, whose
message never echoes the id. The id is a bearer capability; nothing here logs it.

Bounds. Per session: ``max_frames`` declared, ``max_session_bytes`` held (a request that would
exceed it fails with ``LimitExceeded`` and the session stays as it was). Per tenant:
``max_tenant_sessions`` and ``max_tenant_bytes``. Per server: ``max_sessions`` and
``max_total_bytes``.

Who may evict whom. A session used (any command) within the last ``evict_idle_s`` seconds is
in active use and is never evicted, by anyone. When a new session or a growing one needs room:

1. the tenant's own bounds first: its least recently used *idle* session (other than the one
   growing) is evicted, again while needed;
2. then the server's bounds: the least recently used idle session of any tenant;
3. if no idle session is left to evict, the request is refused with ``Overloaded`` (retry
   later: sessions become idle, or their owners close them) and nothing is evicted.

So another user can take a session's place only after its owner left it idle for
``evict_idle_s``, and a tenant at its quota makes room among its own sessions. The owner's
client recovers from an eviction as from a restart: its next call gets ``SessionNotFound``, it
re-creates the session (a new id) and replays what it holds.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ..protocol import tracker as protocol
from ..protocol.tracker import TrackingError
from .state import Session

Key = tuple[str, str]  # (tenant, session id)


@dataclass
class _Held:
    session: Session
    last_used: float  # the store's clock, at the end of the last command on it
    frames_tracked: int = 0  # "track" commands answered (the session's status)


class SessionStore:
    """Sessions by (tenant, issued id), least recently used first.

    Args:
        max_sessions: sessions held at once (>= 1).
        max_frames: frames a session may declare.
        max_session_bytes: bytes one session may hold (frames, features, memory bank).
        max_total_bytes: bytes all sessions may hold together.
        feature_cache_frames: encoded frames each session keeps.
        max_tenant_sessions: sessions one tenant may hold; 0 = ``max_sessions``.
        max_tenant_bytes: bytes one tenant's sessions may hold; 0 = ``max_total_bytes``.
        evict_idle_s: seconds without a command before a session may be evicted for another.
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        max_sessions: int = protocol.DEFAULT_MAX_SESSIONS,
        max_frames: int = protocol.DEFAULT_MAX_FRAMES,
        max_session_bytes: int = protocol.DEFAULT_MAX_SESSION_BYTES,
        max_total_bytes: int = protocol.DEFAULT_MAX_TOTAL_BYTES,
        feature_cache_frames: int = protocol.DEFAULT_FEATURE_CACHE_FRAMES,
        *,
        max_tenant_sessions: int = protocol.DEFAULT_MAX_TENANT_SESSIONS,
        max_tenant_bytes: int = protocol.DEFAULT_MAX_TENANT_BYTES,
        evict_idle_s: float = protocol.DEFAULT_EVICT_IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if min(max_sessions, max_frames, max_session_bytes, max_total_bytes) < 1:
            raise ValueError("session bounds must be >= 1")
        if min(max_tenant_sessions, max_tenant_bytes, evict_idle_s) < 0:
            raise ValueError("tenant bounds and evict_idle_s must be >= 0")
        self.max_sessions = max_sessions
        self.max_frames = max_frames
        self.max_session_bytes = max_session_bytes
        self.max_total_bytes = max_total_bytes
        self.feature_cache_frames = feature_cache_frames
        self.max_tenant_sessions = min(max_tenant_sessions or max_sessions, max_sessions)
        self.max_tenant_bytes = min(max_tenant_bytes or max_total_bytes, max_total_bytes)
        self.evict_idle_s = evict_idle_s
        self._clock = clock
        self._held: OrderedDict[Key, _Held] = OrderedDict()
        self.evictions = 0  # sessions evicted for others (the operator's metric)
        self.refusals = 0  # requests refused because no idle session could make room

    # -- the operator's view (metrics), never a client's --------------------------------------
    def __len__(self) -> int:
        return len(self._held)

    @property
    def nbytes(self) -> int:
        return sum(h.session.nbytes for h in self._held.values())

    def tenant_sessions(self, tenant: str) -> list[str]:
        """The ids a tenant holds, least recently used first (tests, operators)."""
        return [sid for t, sid in self._held if t == tenant]

    # -- a tenant's sessions -------------------------------------------------------------------
    def create(
        self, tenant: str, num_frames: int, video_hw: tuple[int, int]
    ) -> tuple[str, Session]:
        """A fresh session of ``tenant``, under a newly issued id.

        Returns:
            (the issued id, the session).

        Raises:
            TrackingError: ``InvalidInput`` for a bad size, ``LimitExceeded`` above max_frames,
                ``Overloaded`` when the tenant or the server is full of sessions in active use.
        """
        if not 1 <= num_frames <= self.max_frames:
            raise TrackingError(
                protocol.ERR_LIMIT if num_frames > self.max_frames else protocol.ERR_INVALID_INPUT,
                f"num_frames: got {num_frames}, this server takes 1..{self.max_frames}",
                "num_frames",
            )
        height, width = video_hw
        if not (1 <= height <= protocol.MAX_FRAME_SIDE and 1 <= width <= protocol.MAX_FRAME_SIDE):
            raise TrackingError(
                protocol.ERR_INVALID_INPUT,
                f"video_hw: got {video_hw}, expected 1..{protocol.MAX_FRAME_SIDE} per side",
                "video_hw",
            )
        self._make_room(tenant, None, sessions=1, extra_bytes=0)
        session_id = secrets.token_urlsafe(protocol.SESSION_ID_BYTES)
        session = Session(num_frames, (height, width), self.feature_cache_frames)
        self._held[(tenant, session_id)] = _Held(session, self._clock())
        return session_id, session

    def get(self, tenant: str, session_id: str) -> Session:
        """The session (now the most recently used).

        Raises:
            TrackingError: ``SessionNotFound``, alike for an id never issued, issued to another
                tenant, evicted or closed.
        """
        return self._lookup(tenant, session_id).session

    def touch(self, tenant: str, session_id: str, *, tracked: bool = False) -> None:
        """Mark a session used now (the end of a command on it); no-op when it is gone."""
        held = self._held.get((tenant, session_id))
        if held is not None:
            held.last_used = self._clock()
            held.frames_tracked += int(tracked)

    def close(self, tenant: str, session_id: str) -> None:
        """Drop a session.

        Raises:
            TrackingError: ``SessionNotFound`` when the tenant holds no such session.
        """
        self._lookup(tenant, session_id)
        del self._held[(tenant, session_id)]

    def status(self, tenant: str, session_id: str) -> dict[str, object]:
        """The session's own figures (``protocol.STATUS_KEYS``), nothing about other sessions."""
        held = self._lookup(tenant, session_id)
        session = held.session
        return {
            "bytes": session.nbytes,
            "frames_tracked": held.frames_tracked,
            "frames_uploaded": len(session.frames),
            "num_frames": session.num_frames,
            "objects": session.obj_ids,
        }

    def check_room(self, tenant: str, session_id: str, extra_bytes: int) -> None:
        """Make room for ``session_id`` to hold ``extra_bytes`` more (0: check what it holds
        now, after a command grew it), evicting idle sessions as the module docstring says.

        Raises:
            TrackingError: ``LimitExceeded`` above ``max_session_bytes``; ``Overloaded`` when
                the tenant's or the server's bytes cannot be freed from idle sessions.
        """
        size = self._lookup(tenant, session_id).session.nbytes + extra_bytes
        if size > self.max_session_bytes:
            raise TrackingError(
                protocol.ERR_LIMIT,
                f"session_id: this session would hold {size / 2**20:.1f} MiB, above the "
                f"server's bound of {self.max_session_bytes / 2**20:.1f} MiB per session "
                "(fewer frames or objects, or raise max_session_bytes)",
                "session_id",
            )
        self._make_room(tenant, session_id, sessions=0, extra_bytes=extra_bytes)

    def frame_bytes(self, frame: np.ndarray | bytes) -> int:
        """What storing ``frame`` costs."""
        return len(frame) if isinstance(frame, bytes) else int(frame.nbytes)

    # -- internals -----------------------------------------------------------------------------
    def _lookup(self, tenant: str, session_id: str) -> _Held:
        held = self._held.get((tenant, session_id))
        if held is None:
            raise TrackingError(
                protocol.ERR_SESSION_NOT_FOUND,
                "session_id: this server holds no such session of yours (never created, "
                "closed, evicted by the bounds, or the server restarted); create one with init",
                "session_id",
            )
        self._held.move_to_end((tenant, session_id))
        return held

    def _make_room(
        self, tenant: str, active: str | None, *, sessions: int, extra_bytes: int
    ) -> None:
        """Evict idle sessions until ``sessions`` more of ``tenant`` and ``extra_bytes`` more
        fit the tenant's bounds, then the server's; refuse with ``Overloaded`` (evicting
        nothing) when they cannot."""
        keep = None if active is None else (tenant, active)

        def over_tenant(evicted: set[Key]) -> bool:
            mine = [k for k in self._held if k[0] == tenant and k not in evicted]
            held = sum(self._held[k].session.nbytes for k in mine)
            return (
                len(mine) + sessions > self.max_tenant_sessions
                or held + extra_bytes > self.max_tenant_bytes
            )

        def over_server(evicted: set[Key]) -> bool:
            rest = [k for k in self._held if k not in evicted]
            held = sum(self._held[k].session.nbytes for k in rest)
            return (
                len(rest) + sessions > self.max_sessions
                or held + extra_bytes > self.max_total_bytes
            )

        evicted: set[Key] = set()
        for over, mine_only, whose in (
            (over_tenant, True, "this tenant's"),
            (over_server, False, "the server's"),
        ):
            idle = (k for k in self._idle(keep) if not mine_only or k[0] == tenant)
            while over(evicted):
                victim = next((k for k in idle if k not in evicted), None)
                if victim is None:
                    self.refusals += 1
                    raise TrackingError(
                        protocol.ERR_OVERLOADED,
                        f"session_id: {whose} sessions are full and every one was used within "
                        f"the last {self.evict_idle_s:g} s; retry later, or close a session "
                        "you no longer need",
                        "session_id",
                    )
                evicted.add(victim)
        for key in evicted:
            del self._held[key]
        self.evictions += len(evicted)

    def _idle(self, keep: Key | None) -> Iterator[Key]:
        """Sessions that may be evicted, least recently used first."""
        now = self._clock()
        for key, held in list(self._held.items()):
            if key != keep and now - held.last_used >= self.evict_idle_s:
                yield key
