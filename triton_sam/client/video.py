"""SAM2VideoTritonClient: ``SAM2VideoPredictor``'s API, with the tracking done by Triton.

The server's ``sam2_tracker`` model keeps each video's state (frames, features, memory bank,
object pointers); this client sends each frame once (its file bytes, or uint8 pixels for
arrays), prompts, and one "track" request per propagated frame, and gets back that frame's
low-res logits, which it upsamples to the video's resolution as upstream does.

The server issues each session's id in its answer to ``init`` (a secret: whoever holds it
and shares the tenant can use the session) and binds it to the caller's tenant. A session the
server lost (evicted after it sat idle while others needed room, or a restart) is re-created
transparently: the client keeps the video and a log of the state-changing calls, opens a new
session (a new id), replays them (re-sending frames as they are needed) and retries the call
that failed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from triton_sam.client.closing import ClosesOnExit
from triton_sam.client.endpoint import TlsOptions, bearer_headers, resolve_endpoint
from triton_sam.client.retry import RetryPolicy
from triton_sam.client.transport import Transport
from triton_sam.client.video_api import Masks, PointsPrompt, Propagation, VideoPredictorAPI
from triton_sam.client.video_errors import typed_error
from triton_sam.client.video_source import open_video
from triton_sam.client.video_state import (
    IDEMPOTENT,
    LOGGED,
    NEEDS_FRAME,
    TrackerRequest,
    VideoState,
    int32,
    payload_bytes,
)
from triton_sam.errors import (
    RequestCancelledError,
    ServerUnavailableError,
    TrackingSessionNotFoundError,
    TritonSamError,
)
from triton_sam.serving.protocol import tracker as p
from triton_sam.serving.resample import bilinear

_MASK_OUTPUTS = (p.OUT_FRAME_INDEX, p.OUT_OBJECT_IDS, p.OUT_MASKS, p.OUT_OBJECT_SCORES)


class SAM2VideoTritonClient(VideoPredictorAPI[VideoState], ClosesOnExit):
    """Track objects through a video or a 3-D volume with SAM2.1 on a Triton server.

    Args:
        url: ``host:port`` (or ``grpc://host:port``, gRPC whatever ``protocol`` says); defaults
            to ``$TRITON_URL``, else localhost:8001 (gRPC) / localhost:8000 (HTTP).
        protocol: ``"grpc"`` (cancellation reaches the server) or ``"http"``.
        model: the tracker model's name.
        timeout_s: per-request timeout (a tracked frame takes about a second on a GPU, a few
            on a CPU).
        retry: backoff for idempotent calls; None uses the default policy.
        tls: certificates for an ``https://`` server.
        token: a bearer token for a server behind the token proxy; never logged.

    Raises:
        ServerUnavailableError: no ready server, or no ready tracker model.

    Example:
        >>> client = SAM2VideoTritonClient("localhost:8001")
        >>> state = client.init_state("frames/")          # or an mp4, or a (Z, Y, X) volume
        >>> client.add_new_points_or_box(state, 0, obj_id=1, points=[[210, 350]], labels=[1])
        >>> for frame_idx, obj_ids, masks in client.propagate_in_video(state):
        ...     binary = masks[0, 0] > 0                   # object obj_ids[0] on this frame
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        protocol: str = "grpc",
        model: str = p.TRACKER_MODEL,
        timeout_s: float = 600.0,
        retry: RetryPolicy | None = None,
        tls: TlsOptions | None = None,
        token: str | None = None,
    ) -> None:
        self.model = model
        self.transport = Transport(
            resolve_endpoint(url, protocol),
            timeout_s=timeout_s,
            retry=retry,
            tls=tls,
            headers=bearer_headers(token),
        )
        self.bytes_sent = 0  # request tensor payloads (frames, prompts), for reports
        try:
            self._check_ready()
        except BaseException:
            self.transport.close()
            raise

    # -- API mirroring SAM2VideoPredictor -----------------------------------------------------
    # add_new_points_or_box and propagate_in_video: VideoPredictorAPI, run by _add_points and
    # _propagate below
    def init_state(self, video: object) -> VideoState:
        """Open ``video`` (a folder of frames, an mp4, a list of images, a TIFF stack, or a
        numpy volume (Z, Y, X) / (Z, Y, X, C)) as a session on the server; frame 0 is sent
        now, the others the first time a call needs them.

        Raises:
            InputValidationError: (field ``video``) an unusable video or volume.
            TrackingLimitError: more frames than the server takes.
            ServerOverloadedError: the server (or your tenant's quota) is full of sessions in
                active use; retry later or close one.
        """
        state = VideoState(open_video(video))
        self._init_session(state)
        self._ensure_frame(state, 0)
        return state

    def add_new_mask(
        self, state: VideoState, frame_idx: int, obj_id: int, mask: np.ndarray
    ) -> Masks:
        """A binary mask [H, W] (the video's size) for one object on one frame; returns as
        :meth:`add_new_points_or_box`."""
        tensors = {
            p.FRAME_INDEX: int32(frame_idx),
            p.OBJECT_ID: int32(obj_id),
            p.MASK: np.asarray(mask).astype(bool),
        }
        return self._masks(state, self._command(state, _masks_request(p.CMD_ADD_MASK, tensors)))

    def cancel_propagation(self, state: VideoState) -> None:
        """Stop a running :meth:`propagate_in_video` (from any thread): no further frame is
        requested, and over gRPC the request in flight is cancelled."""
        state._cancel.set()
        pending = state._pending
        if pending is not None:
            pending.cancel()

    def get_frame_masks(self, state: VideoState, frame_idx: int) -> Masks:
        """The masks the server holds for a frame (nothing is recomputed, nothing but the
        frame's masks crosses the wire); as :meth:`add_new_points_or_box` returns them."""
        request = _masks_request(p.CMD_GET, {p.FRAME_INDEX: int32(frame_idx)})
        return self._masks(state, self._command(state, request))

    def clear_all_prompts_in_frame(self, state: VideoState, frame_idx: int, obj_id: int) -> Masks:
        """Remove one object's prompts on a frame (``clear_all_prompts_in_frame``)."""
        tensors = {p.FRAME_INDEX: int32(frame_idx), p.OBJECT_ID: int32(obj_id)}
        return self._masks(
            state, self._command(state, _masks_request(p.CMD_CLEAR_PROMPTS, tensors))
        )

    def remove_object(
        self, state: VideoState, obj_id: int, strict: bool = False
    ) -> tuple[list[int], list[tuple[int, np.ndarray]]]:
        """Remove an object; returns (remaining ids, [(frame, logits [K, 1, H, W])] for the
        frames where it had prompts).

        Raises:
            ObjectNotFoundError: ``strict`` and the object was never added.
        """
        tensors = {p.OBJECT_ID: int32(obj_id), p.STRICT: np.array([bool(strict)])}
        request = TrackerRequest(p.CMD_REMOVE_OBJECT, tensors, (p.OUT_OBJECT_IDS, p.OUT_FRAMES))
        out = self._command(state, request)
        state.obj_ids = out[p.OUT_OBJECT_IDS].tolist()
        updated = [(t, self.get_frame_masks(state, t)[2]) for t in out[p.OUT_FRAMES].tolist()]
        return state.obj_ids, updated

    def reset_state(self, state: VideoState) -> None:
        """Remove every object, prompt and result (the frames stay on the server)."""
        self._command(state, TrackerRequest(p.CMD_RESET, {}))
        state.obj_ids = []
        state.log = []

    def close_state(self, state: VideoState) -> None:
        """Free the session on the server (frames, features, memory bank)."""
        with contextlib.suppress(TritonSamError):
            self._send(state, TrackerRequest(p.CMD_CLOSE, {}))

    def session_info(self, state: VideoState) -> dict[str, Any]:
        """This session as the server holds it: ``{"session": {"bytes", "frames_tracked",
        "frames_uploaded", "num_frames", "objects"}}`` (nothing about other sessions)."""
        import json

        out = self._command(state, TrackerRequest(p.CMD_INFO, {}))
        return json.loads(out[p.OUT_STATUS].reshape(-1)[0])

    def close(self) -> None:
        """Close the connections (idempotent)."""
        self.transport.close()

    # -- the two calls of VideoPredictorAPI ---------------------------------------------------
    def _add_points(self, state: VideoState, prompt: PointsPrompt) -> Masks:
        tensors: dict[str, np.ndarray] = {
            p.FRAME_INDEX: int32(prompt.frame_idx),
            p.OBJECT_ID: int32(prompt.obj_id),
            p.CLEAR_OLD_POINTS: np.array([bool(prompt.clear_old_points)]),
            p.NORMALIZE_COORDS: np.array([bool(prompt.normalize_coords)]),
        }
        if prompt.points is not None:
            tensors[p.POINTS] = np.asarray(prompt.points, np.float32).reshape(-1, 2)
        if prompt.labels is not None:
            tensors[p.LABELS] = np.asarray(prompt.labels).astype(np.int32).reshape(-1)
        if prompt.box is not None:
            tensors[p.BOX] = np.asarray(prompt.box, np.float32).reshape(-1)
        return self._masks(state, self._command(state, _masks_request(p.CMD_ADD_POINTS, tensors)))

    def _propagate(self, state: VideoState, run: Propagation) -> Iterator[Masks]:
        reverse = np.array([bool(run.reverse)])
        tensors = {
            p.START_FRAME: int32(-1 if run.start_frame_idx is None else run.start_frame_idx),
            p.MAX_FRAMES: int32(
                -1 if run.max_frame_num_to_track is None else run.max_frame_num_to_track
            ),
            p.REVERSE: reverse,
        }
        request = TrackerRequest(p.CMD_PREFLIGHT, tensors, (p.OUT_FRAMES,))
        order = self._command(state, request)[p.OUT_FRAMES]
        state._cancel.clear()
        for frame_idx in order.tolist():
            if state._cancel.is_set():
                return
            tensors = {p.FRAME_INDEX: int32(frame_idx), p.REVERSE: reverse}
            request = TrackerRequest(p.CMD_TRACK, tensors, _MASK_OUTPUTS, cancellable=True)
            try:
                out = self._command(state, request)
            except RequestCancelledError:
                return
            yield self._masks(state, out)

    # -- requests ------------------------------------------------------------------------------
    def _command(self, state: VideoState, request: TrackerRequest) -> dict[str, np.ndarray]:
        """Send a command, sending frames first when it needs them, re-creating the session
        once if the server lost it."""
        for attempt in range(2):
            try:
                self._prepare(state, request)
                out = self._send(state, request)
            except TrackingSessionNotFoundError:
                if attempt or request.command == p.CMD_CLOSE:
                    raise
                self._recreate(state)
                continue
            if request.command in LOGGED:
                state.log.append((request.command, request.tensors))
            if p.OUT_OBJECT_IDS in out:
                state.obj_ids = out[p.OUT_OBJECT_IDS].tolist()
            return out
        raise AssertionError("unreachable")

    def _prepare(self, state: VideoState, request: TrackerRequest) -> None:
        if request.command in NEEDS_FRAME:
            self._ensure_frame(state, int(request.tensors[p.FRAME_INDEX][0]))

    def _send(self, state: VideoState, request: TrackerRequest) -> dict[str, np.ndarray]:
        inputs = {p.COMMAND: np.array([[request.command.encode()]], dtype=object)}
        if request.command != p.CMD_INIT:  # init is answered the id
            inputs[p.SESSION_ID] = np.array([[state.session_id.encode()]], dtype=object)
        # Triton's batch dimension
        inputs |= {name: value[None] for name, value in request.tensors.items()}
        self.bytes_sent += sum(payload_bytes(v) for v in inputs.values())
        outputs = request.outputs
        try:
            if request.cancellable:
                state._pending = self.transport.start_infer(
                    self.model, inputs, outputs, routing_key=state.routing_key
                )
                try:
                    result = state._pending.wait()
                finally:
                    state._pending = None
            else:
                idempotent = request.command in IDEMPOTENT
                result = self.transport.infer(
                    self.model,
                    inputs,
                    outputs,
                    idempotent=idempotent,
                    routing_key=state.routing_key,
                )
        except RequestCancelledError:
            raise
        except TritonSamError as e:
            raise typed_error(e) from e
        return {name: value[0] for name, value in result.items()}

    def _init_session(self, state: VideoState) -> None:
        tensors = {
            p.NUM_FRAMES: int32(state.num_frames),
            p.VIDEO_HW: np.array(state.video_hw, np.int32),
        }
        out = self._send(state, TrackerRequest(p.CMD_INIT, tensors, (p.OUT_SESSION_ID,)))
        state.session_id = out[p.OUT_SESSION_ID].reshape(-1)[0].decode()
        state.uploaded.clear()

    def _ensure_frame(self, state: VideoState, frame_idx: int) -> None:
        """Send frame ``frame_idx`` if the server does not hold it (sent once per session)."""
        if frame_idx in state.uploaded or not 0 <= frame_idx < state.num_frames:
            return  # an out-of-range index is the server's to refuse, with its typed error
        encoded = state.source.encoded(frame_idx)
        tensors: dict[str, np.ndarray] = {p.FRAME_INDEX: int32(frame_idx)}
        if encoded is not None:
            tensors[p.FRAME_BYTES] = np.array([encoded], dtype=object)
        else:
            pixels = state.source.pixels(frame_idx)
            tensors[p.FRAME] = pixels[..., None] if pixels.ndim == 2 else pixels
        self._send(state, TrackerRequest(p.CMD_ADD_FRAME, tensors))
        state.uploaded.add(frame_idx)

    def _recreate(self, state: VideoState) -> None:
        """The server lost the session: create it again and replay what it held."""
        state.resets += 1
        self._init_session(state)
        self._ensure_frame(state, 0)
        for command, tensors in state.log:
            request = TrackerRequest(command, tensors)
            self._prepare(state, request)
            self._send(state, request)

    def _masks(self, state: VideoState, out: dict[str, np.ndarray]) -> Masks:
        masks = out[p.OUT_MASKS]
        ids = out[p.OUT_OBJECT_IDS].tolist()
        frame = int(out[p.OUT_FRAME_INDEX].reshape(-1)[0])
        if p.OUT_OBJECT_SCORES in out:
            state.object_scores[frame] = out[p.OUT_OBJECT_SCORES]
        height, width = state.video_hw
        full = (
            bilinear(masks, (height, width)) if ids else np.zeros((0, 1, height, width), np.float32)
        )
        return frame, ids, full

    def _check_ready(self) -> None:
        address = self.transport.endpoint.address
        if not self.transport.is_server_ready():
            raise ServerUnavailableError(
                f"url: no ready Triton server at {address}; start one with `triton-sam serve`"
            )
        if not self.transport.is_model_ready(self.model):
            raise ServerUnavailableError(
                f"model: {self.model!r} is not ready on {address}; write the video models with "
                "`triton-sam setup-video` and check the server log"
            )


def _masks_request(command: str, tensors: dict[str, np.ndarray]) -> TrackerRequest:
    """A command answered with masks (``_masks`` reads them)."""
    return TrackerRequest(command, tensors, _MASK_OUTPUTS)
