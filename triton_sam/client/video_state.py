"""One video on the tracker, from the client's side, and the tracker's commands (no I/O).

:class:`VideoState` is what :meth:`SAM2VideoTritonClient.init_state
<triton_sam.client.video.SAM2VideoTritonClient.init_state>` returns; a
:class:`TrackerRequest` is one command to send; the sets below say which commands the server
keeps (replayed after a lost session), which need their frame, and which are safe to retry.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field

import numpy as np

from triton_sam.client.transport import PendingInfer
from triton_sam.client.video_source import VideoSource
from triton_sam.serving.protocol import tracker as p


@dataclass
class VideoState:
    """One video on the server (what :meth:`SAM2VideoTritonClient.init_state` returns).

    Attributes:
        session_id: the id the server issued for this video's session (a secret; replaced
            when the session is re-created).
        source: the frames (kept to re-send them when the server lost the session).
        obj_ids: object ids as the server last reported them.
        uploaded: frames the server holds.
        log: state-changing calls since init, replayed after a lost session.
        resets: how many times the session was re-created.
        object_scores: per frame, the objects' score logits of the latest answer about it
            (float32 [K] in ``obj_ids`` order; > 0: the object is present, NaN: no output).
        routing_key: this video's replica-affinity key behind a proxy (random, not secret:
            the session id must not travel in a header).
    """

    source: VideoSource
    session_id: str = field(default="", repr=False)  # a secret: not in reprs or logs
    obj_ids: list[int] = field(default_factory=list)
    uploaded: set[int] = field(default_factory=set)
    log: list[tuple[str, dict[str, np.ndarray]]] = field(default_factory=list)
    resets: int = 0
    object_scores: dict[int, np.ndarray] = field(default_factory=dict)
    routing_key: str = field(default_factory=lambda: secrets.token_hex(8))
    _pending: PendingInfer | None = None
    _cancel: threading.Event = field(default_factory=threading.Event)

    @property
    def num_frames(self) -> int:
        return self.source.num_frames

    @property
    def video_hw(self) -> tuple[int, int]:
        return self.source.height, self.source.width


@dataclass(frozen=True)
class TrackerRequest:
    """One command for the tracker model.

    Attributes:
        command: one of the protocol's ``CMD_*`` names.
        tensors: its inputs, without Triton's batch dimension.
        outputs: the outputs to ask for (only those cross the wire).
        cancellable: :meth:`SAM2VideoTritonClient.cancel_propagation
            <triton_sam.client.video.SAM2VideoTritonClient.cancel_propagation>` may cancel it
            in flight (sent without retries).
    """

    command: str
    tensors: dict[str, np.ndarray]
    outputs: tuple[str, ...] = (p.OUT_STATUS,)
    cancellable: bool = False


# commands whose effect the server keeps (replayed after a lost session), those that need
# their frame on the server, and those safe to retry (init too: a session whose answer was
# lost is never used again; it sits idle and is evicted when its tenant or the server needs
# the room)
LOGGED = {
    p.CMD_ADD_POINTS,
    p.CMD_ADD_MASK,
    p.CMD_TRACK,
    p.CMD_CLEAR_PROMPTS,
    p.CMD_REMOVE_OBJECT,
}
NEEDS_FRAME = {p.CMD_ADD_POINTS, p.CMD_ADD_MASK, p.CMD_TRACK}
IDEMPOTENT = {p.CMD_INIT, p.CMD_ADD_FRAME, p.CMD_GET, p.CMD_INFO, p.CMD_PREFLIGHT}


def int32(value: int) -> np.ndarray:
    return np.array([int(value)], np.int32)


def payload_bytes(array: np.ndarray) -> int:
    if array.dtype == object:
        return sum(len(v) for v in array.reshape(-1))
    return int(array.nbytes)
