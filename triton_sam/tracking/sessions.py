"""Tracking sessions held by one server process, bounded, least recently used evicted first
(dependency-free).

Bounds: sessions, frames per session, bytes per session, bytes over all sessions. A request
that would make its own session exceed ``max_session_bytes`` fails with ``LimitExceeded`` (the
session is kept as it was); other sessions are evicted, least recently used first, to keep the
total under ``max_total_bytes`` and the count under ``max_sessions``. A client that then asks
for an evicted session gets ``SessionNotFound`` and can re-create it.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from . import protocol
from .protocol import TrackingError
from .state import Session


class SessionStore:
    """Sessions by id, in LRU order.

    Args:
        max_sessions: sessions held at once (>= 1).
        max_frames: frames a session may declare.
        max_session_bytes: bytes one session may hold (frames, features, memory bank).
        max_total_bytes: bytes all sessions may hold together.
        feature_cache_frames: encoded frames each session keeps.
    """

    def __init__(
        self,
        max_sessions: int = protocol.DEFAULT_MAX_SESSIONS,
        max_frames: int = protocol.DEFAULT_MAX_FRAMES,
        max_session_bytes: int = protocol.DEFAULT_MAX_SESSION_BYTES,
        max_total_bytes: int = protocol.DEFAULT_MAX_TOTAL_BYTES,
        feature_cache_frames: int = protocol.DEFAULT_FEATURE_CACHE_FRAMES,
    ) -> None:
        if min(max_sessions, max_frames, max_session_bytes, max_total_bytes) < 1:
            raise ValueError("session bounds must be >= 1")
        self.max_sessions = max_sessions
        self.max_frames = max_frames
        self.max_session_bytes = max_session_bytes
        self.max_total_bytes = max_total_bytes
        self.feature_cache_frames = feature_cache_frames
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._sessions.values())

    def create(self, session_id: str, num_frames: int, video_hw: tuple[int, int]) -> Session:
        """A fresh session (an existing one under this id is replaced).

        Raises:
            TrackingError: ``InvalidInput`` for a bad size, ``LimitExceeded`` above max_frames.
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
        self._sessions.pop(session_id, None)
        session = Session(num_frames, (height, width), self.feature_cache_frames)
        self._sessions[session_id] = session
        self.enforce(session_id)
        return session

    def get(self, session_id: str) -> Session:
        """The session (now the most recently used).

        Raises:
            TrackingError: ``SessionNotFound``.
        """
        session = self._sessions.get(session_id)
        if session is None:
            raise TrackingError(
                protocol.ERR_SESSION_NOT_FOUND,
                f"session_id: {session_id!r} is not held by this server (never created, evicted "
                "by its memory bounds, or the server restarted); create it again with init",
                "session_id",
            )
        self._sessions.move_to_end(session_id)
        return session

    def close(self, session_id: str) -> bool:
        """Drop a session; False when it was not held."""
        return self._sessions.pop(session_id, None) is not None

    def check_room(self, session_id: str, extra_bytes: int) -> None:
        """Refuse to grow ``session_id`` by ``extra_bytes`` past ``max_session_bytes``."""
        size = self._sessions[session_id].nbytes + extra_bytes
        if size > self.max_session_bytes:
            raise TrackingError(
                protocol.ERR_LIMIT,
                f"session_id: this session would hold {size / 2**20:.1f} MiB, above the "
                f"server's bound of {self.max_session_bytes / 2**20:.1f} MiB per session "
                "(fewer frames or objects, or raise max_session_bytes)",
                "session_id",
            )

    def enforce(self, active_id: str) -> list[str]:
        """Evict least recently used sessions other than ``active_id`` until the count and
        the total bytes are within bounds; returns the evicted ids."""
        evicted = []
        for session_id in list(self._sessions):
            over_count = len(self._sessions) > self.max_sessions
            if not over_count and self.nbytes <= self.max_total_bytes:
                break
            if session_id != active_id:
                del self._sessions[session_id]
                evicted.append(session_id)
        self.evictions += len(evicted)
        return evicted

    def frame_bytes(self, frame: np.ndarray | bytes) -> int:
        """What storing ``frame`` costs."""
        return len(frame) if isinstance(frame, bytes) else int(frame.nbytes)
