"""The tracker model's request handling, without Triton (dependency-free).

``TrackingService.handle`` takes one request's tensors by name (numpy, per item: no batch
dim) of one tenant and answers the command they carry (:mod:`.protocol`), holding every
session in a bounded :class:`.sessions.SessionStore` under the id it issued and the tenant
that created it. Answers speak of the caller's own session only: server-wide counters are
the operator's (the model's metrics), not a client's. The Triton model
(``serving/tracker_model.py``) only converts tensors and errors; tests drive this class.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

from ..protocol import tracker as p
from ..protocol.tracker import TrackingError
from .config import TrackerConfig
from .frames import encoded_size
from .sessions import SessionStore
from .state import Session
from .tracker import COND, GraphRunner, Tracker

Tensors = Mapping[str, np.ndarray]


class TrackingService:
    """Answers tracker commands against a bounded store of sessions.

    Args:
        runner: executes the graphs (BLS in Triton, onnxruntime in-process).
        config: the variant's tracking settings.
        store: the sessions (bounds and LRU).
    """

    def __init__(
        self, runner: GraphRunner, config: TrackerConfig, store: SessionStore | None = None
    ) -> None:
        self.tracker = Tracker(runner, config)
        self.store = store if store is not None else SessionStore()  # an empty store is falsy
        self.frames_tracked = 0  # frames answered by "track", every session (metrics only)
        self._handlers = {
            p.CMD_ADD_FRAME: self._add_frame,
            p.CMD_ADD_POINTS: self._add_points,
            p.CMD_ADD_MASK: self._add_mask,
            p.CMD_PREFLIGHT: self._preflight,
            p.CMD_TRACK: self._track,
            p.CMD_GET: self._get,
            p.CMD_CLEAR_PROMPTS: self._clear_prompts,
            p.CMD_REMOVE_OBJECT: self._remove_object,
            p.CMD_RESET: self._reset,
            p.CMD_CLOSE: self._close,
            p.CMD_INFO: self._info,
        }

    def handle(self, inputs: Tensors, tenant: str = "") -> dict[str, np.ndarray]:
        """Answer one request of ``tenant``; its outputs by name (a subset of
        ``protocol.OUTPUTS``).

        ``init`` issues the session's id (``out_session_id``) and must not carry one; every
        other command names a session of the same tenant by that id.

        Raises:
            TrackingError: a bad request, a session this tenant does not hold, a bound.
        """
        command = _text(inputs, p.COMMAND)
        if command == p.CMD_INIT:
            if p.SESSION_ID in inputs:
                raise TrackingError(
                    p.ERR_INVALID_INPUT,
                    "session_id: init must not carry one; the server issues the id and "
                    f"answers it in {p.OUT_SESSION_ID}",
                    p.SESSION_ID,
                )
            return self._init(tenant, inputs)
        handler = self._handlers.get(command)
        if handler is None:
            raise TrackingError(
                p.ERR_INVALID_INPUT,
                f"command: got {command!r}, expected one of {list(p.COMMANDS)}",
                p.COMMAND,
            )
        if p.SESSION_ID not in inputs:
            raise TrackingError(
                p.ERR_INVALID_INPUT,
                f"session_id: required by {command}; send the id init answered",
                p.SESSION_ID,
            )
        session_id = _text(inputs, p.SESSION_ID)
        if not 0 < len(session_id) <= p.MAX_SESSION_ID_CHARS:
            raise TrackingError(
                p.ERR_INVALID_INPUT,
                f"session_id: expected 1..{p.MAX_SESSION_ID_CHARS} characters",
                p.SESSION_ID,
            )
        outputs = handler(_Call(self.store, tenant, session_id), inputs)
        self.store.touch(tenant, session_id, tracked=command == p.CMD_TRACK)
        return outputs

    # -- commands ----------------------------------------------------------------------------
    def _init(self, tenant: str, inputs: Tensors) -> dict[str, np.ndarray]:
        num_frames = _int(inputs, p.NUM_FRAMES)
        hw = _required(inputs, p.VIDEO_HW).reshape(-1)
        if hw.size != 2:
            raise TrackingError(p.ERR_INVALID_INPUT, "video_hw: expected (H, W)", p.VIDEO_HW)
        session_id, _ = self.store.create(tenant, num_frames, (int(hw[0]), int(hw[1])))
        out = self._status_out(_Call(self.store, tenant, session_id))
        out[p.OUT_SESSION_ID] = np.array([session_id.encode()], dtype=object)
        return out

    def _add_frame(self, call: _Call, inputs: Tensors) -> dict[str, np.ndarray]:
        session = call.session()
        index = self._frame_index(session, inputs)
        frame: np.ndarray | bytes
        if p.FRAME_BYTES in inputs:
            frame = _bytes(inputs, p.FRAME_BYTES)
            if len(frame) > p.MAX_FRAME_BYTES:
                raise TrackingError(
                    p.ERR_LIMIT, f"frame_bytes: above {p.MAX_FRAME_BYTES} bytes", p.FRAME_BYTES
                )
            size = encoded_size(frame)
        elif p.FRAME in inputs:
            frame = np.ascontiguousarray(inputs[p.FRAME])
            if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] not in (1, 3):
                raise TrackingError(
                    p.ERR_INVALID_INPUT,
                    f"frame: got {frame.dtype} {frame.shape}; expected uint8 [H, W, 1 or 3]",
                    p.FRAME,
                )
            size = frame.shape[:2]
        else:
            raise TrackingError(
                p.ERR_INVALID_INPUT, "frame: send frame (uint8) or frame_bytes", p.FRAME
            )
        if tuple(size) != session.video_hw:
            raise TrackingError(
                p.ERR_INVALID_INPUT,
                f"frame: {size[1]}x{size[0]} (W x H), the session's video is "
                f"{session.video_hw[1]}x{session.video_hw[0]}",
                p.FRAME,
            )
        old = session.frames.get(index)
        call.check_room(self.store.frame_bytes(frame) - _size(old))
        session.frames[index] = frame
        session.features.pop(index, None)  # a replaced frame is encoded again
        return self._status_out(call)

    def _add_points(self, call: _Call, inputs: Tensors) -> dict[str, np.ndarray]:
        session = call.session()
        frame = self._frame_index(session, inputs)
        points = inputs.get(p.POINTS)
        labels = inputs.get(p.LABELS)
        box = inputs.get(p.BOX)
        frame, ids, masks = self.tracker.add_new_points_or_box(
            session,
            frame,
            _int(inputs, p.OBJECT_ID),
            None if points is None else points.reshape(-1, 2),
            None if labels is None else labels.reshape(-1),
            clear_old_points=_flag(inputs, p.CLEAR_OLD_POINTS, True),
            normalize_coords=_flag(inputs, p.NORMALIZE_COORDS, True),
            box=None if box is None else box.reshape(-1),
        )
        call.check_room(0)
        return self._with_scores(session, _masks_out(frame, ids, masks))

    def _add_mask(self, call: _Call, inputs: Tensors) -> dict[str, np.ndarray]:
        session = call.session()
        frame = self._frame_index(session, inputs)
        mask = _required(inputs, p.MASK)
        if mask.shape != session.video_hw:
            raise TrackingError(
                p.ERR_INVALID_INPUT,
                f"mask: got shape {mask.shape}, expected the video's {session.video_hw}",
                p.MASK,
            )
        frame, ids, masks = self.tracker.add_new_mask(
            session, frame, _int(inputs, p.OBJECT_ID), mask
        )
        return self._with_scores(session, _masks_out(frame, ids, masks))

    def _preflight(self, call: _Call, inputs: Tensors) -> dict[str, np.ndarray]:
        session = call.session()
        start = _int(inputs, p.START_FRAME, -1)
        count = _int(inputs, p.MAX_FRAMES, -1)
        order = self.tracker.processing_order(
            session,
            None if start < 0 else start,
            None if count < 0 else count,
            _flag(inputs, p.REVERSE, False),
        )
        return {p.OUT_FRAMES: np.array(order, np.int32), **self._status_out(call)}

    def _track(self, call: _Call, inputs: Tensors) -> dict[str, np.ndarray]:
        session = call.session()
        frame = self._frame_index(session, inputs)
        ids, masks, scores = self.tracker.track(session, frame, _flag(inputs, p.REVERSE, False))
        self.frames_tracked += 1
        call.check_room(0)
        out = _masks_out(frame, ids, masks)
        out[p.OUT_OBJECT_SCORES] = scores.astype(np.float32)
        return out

    def _get(self, call: _Call, inputs: Tensors) -> dict[str, np.ndarray]:
        session = call.session()
        frame = self._frame_index(session, inputs)
        is_cond = any(frame in o.temp_outputs[COND] for o in session.objects.values())
        masks = self.tracker.consolidate(session, frame, is_cond)
        return self._with_scores(session, _masks_out(frame, session.obj_ids, masks))

    def _clear_prompts(self, call: _Call, inputs: Tensors) -> dict[str, np.ndarray]:
        session = call.session()
        frame = self._frame_index(session, inputs)
        result = self.tracker.clear_all_prompts_in_frame(session, frame, _int(inputs, p.OBJECT_ID))
        assert result is not None
        return self._with_scores(session, _masks_out(*result))

    def _remove_object(self, call: _Call, inputs: Tensors) -> dict[str, np.ndarray]:
        session = call.session()
        ids, updated = self.tracker.remove_object(
            session, _int(inputs, p.OBJECT_ID), strict=_flag(inputs, p.STRICT, False)
        )
        return {
            p.OUT_OBJECT_IDS: np.array(ids, np.int32),
            p.OUT_FRAMES: np.array(sorted(t for t, _ in updated), np.int32),
        }

    def _reset(self, call: _Call, inputs: Tensors) -> dict[str, np.ndarray]:
        self.tracker.reset_state(call.session())
        return self._status_out(call)

    def _close(self, call: _Call, inputs: Tensors) -> dict[str, np.ndarray]:
        self.store.close(call.tenant, call.session_id)
        return {}

    def _info(self, call: _Call, inputs: Tensors) -> dict[str, np.ndarray]:
        return self._status_out(call)  # SessionNotFound for a session this tenant lacks

    # -- helpers -----------------------------------------------------------------------------
    def _with_scores(self, session: Session, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Add the objects' score logits on the answer's frame (as its masks show them)."""
        frame = int(out[p.OUT_FRAME_INDEX][0])
        is_cond = any(frame in o.temp_outputs[COND] for o in session.objects.values())
        out[p.OUT_OBJECT_SCORES] = self.tracker.object_scores(session, frame, is_cond)
        return out

    def _status_out(self, call: _Call) -> dict[str, np.ndarray]:
        """The caller's own session, nothing server-wide (``protocol.STATUS_KEYS``)."""
        status = {"session": self.store.status(call.tenant, call.session_id)}
        text = json.dumps(status, sort_keys=True)
        return {p.OUT_STATUS: np.array([text.encode()], dtype=object)}

    def _frame_index(self, session: Session, inputs: Tensors) -> int:
        index = _int(inputs, p.FRAME_INDEX)
        if not 0 <= index < session.num_frames:
            raise TrackingError(
                p.ERR_FRAME_OUT_OF_RANGE,
                f"frame_index: got {index}, expected 0..{session.num_frames - 1}",
                p.FRAME_INDEX,
            )
        return index


class _Call:
    """The session one request names: its tenant and id, resolved against the store."""

    def __init__(self, store: SessionStore, tenant: str, session_id: str) -> None:
        self.store = store
        self.tenant = tenant
        self.session_id = session_id

    def session(self) -> Session:
        return self.store.get(self.tenant, self.session_id)

    def check_room(self, extra_bytes: int) -> None:
        self.store.check_room(self.tenant, self.session_id, extra_bytes)


def _masks_out(frame: int, ids: list[int], masks: np.ndarray) -> dict[str, np.ndarray]:
    return {
        p.OUT_FRAME_INDEX: np.array([frame], np.int32),
        p.OUT_OBJECT_IDS: np.array(ids, np.int32),
        # no object: an empty batch of the family's mask size (masks is [0, 1, S, S] then)
        p.OUT_MASKS: np.ascontiguousarray(masks, np.float32).reshape(
            len(ids), 1, *masks.shape[-2:]
        ),
    }


def _required(inputs: Tensors, name: str) -> np.ndarray:
    value = inputs.get(name)
    if value is None:
        raise TrackingError(p.ERR_INVALID_INPUT, f"{name}: required by this command", name)
    return np.asarray(value)


def _int(inputs: Tensors, name: str, default: int | None = None) -> int:
    if name not in inputs and default is not None:
        return default
    value = _required(inputs, name).reshape(-1)
    if value.size != 1 or not np.issubdtype(value.dtype, np.integer):
        raise TrackingError(p.ERR_INVALID_INPUT, f"{name}: expected one integer", name)
    return int(value[0])


def _flag(inputs: Tensors, name: str, default: bool) -> bool:
    if name not in inputs:
        return default
    value = np.asarray(inputs[name]).reshape(-1)
    if value.size != 1:
        raise TrackingError(p.ERR_INVALID_INPUT, f"{name}: expected one boolean", name)
    return bool(value[0])


def _bytes(inputs: Tensors, name: str) -> bytes:
    value = _required(inputs, name).reshape(-1)
    if value.size != 1:
        raise TrackingError(p.ERR_INVALID_INPUT, f"{name}: expected one item", name)
    item = value[0]
    return item if isinstance(item, bytes) else str(item).encode()


def _text(inputs: Tensors, name: str) -> str:
    try:
        return _bytes(inputs, name).decode("utf-8")
    except UnicodeDecodeError as e:
        raise TrackingError(p.ERR_INVALID_INPUT, f"{name}: not UTF-8 text", name) from e


def _size(frame: np.ndarray | bytes | None) -> int:
    if frame is None:
        return 0
    return len(frame) if isinstance(frame, bytes) else int(frame.nbytes)
