"""Client of ``sam3_concept_video``: concepts (phrases, exemplar boxes, or both) tracked
through a video or a z-stack, answered frame by frame over gRPC's stream (the model is
decoupled; Triton's HTTP endpoint refuses decoupled models).

    with SAM3ConceptVideoClient("grpc://localhost:8001") as client:
        session = client.open(video)              # uploads every frame (see open)
        client.add_prompt(session, ["cell"])      # -> prompt ids
        client.add_prompt(session, boxes=[[x0, y0, x1, y1]], frame_index=4)  # an exemplar
        for frame in client.propagate(session):   # ConceptVideoFrame per answered frame
            ...
        client.close(session)

Answers trail the frames processed by the server's hot-start hold-back; ``progress(done,
total)`` reports every processed frame. Leaving the iteration early (a break, an exception,
Ctrl-C) cancels the propagation on the server, which stops before its next frame.
``propagate(..., labels=OmeZarrLabelWriter(...))`` also writes each answered frame as a
section of per-prompt label volumes.
"""

from __future__ import annotations

import json
import queue
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_sam.client.endpoint import Endpoint, resolve_endpoint
from triton_sam.client.everything import stream_error
from triton_sam.client.video_source import VideoSource, open_video
from triton_sam.client.wire import build_infer_inputs
from triton_sam.errors import (
    InferenceTimeoutError,
    InputValidationError,
    ServerUnavailableError,
)
from triton_sam.serving.concept_video.results import FrameResult
from triton_sam.serving.masks import decode_rle
from triton_sam.serving.protocol import concept_video as protocol

Progress = Callable[[int, int], None]
# Every output the model answers (what a relay of its responses reads, the gateway's too).
ANSWER_NAMES = (
    protocol.OUT_SESSION_ID, protocol.OUT_STATUS, protocol.OUT_PROMPT_IDS,
    protocol.FRAME_INDEX, protocol.OBJECT_IDS, protocol.PROMPT_IDS, protocol.SCORES,
    protocol.TRACKER_SCORES, protocol.BOXES, protocol.MASKS_RLE, protocol.MASKS_LOGITS,
    protocol.REMOVED_OBJECT_IDS, protocol.PROGRESS, protocol.FRAMES_ANSWERED,
)  # fmt: skip


@dataclass(frozen=True)
class ConceptVideoFrame:
    """One answered frame.

    Attributes:
        result: ids, prompt ids, scores, boxes and bool [K, H, W] masks at the video's size
            (``FrameResult``, as the in-process pipeline answers it).
        tracker_scores: float32 [K] the tracker's object scores on this frame.
        removed_object_ids: ids hot-start removed since the previous answer (a client that
            showed them already may hide them).
        progress: (frames processed, frames to process) when this answer was sent.
    """

    result: FrameResult
    tracker_scores: np.ndarray
    removed_object_ids: np.ndarray
    progress: tuple[int, int]


class SAM3ConceptVideoClient:
    """Sessions of ``sam3_concept_video`` on one server.

    Args:
        url: the server's gRPC endpoint (``grpc://host:8001`` or ``host:8001``).
        headers: sent with every request (a bearer token through the proxy, a tenant).
        timeout_s: the longest wait for one response.
        model: the model's name.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 300.0,
        model: str = protocol.MODEL,
    ) -> None:
        import tritonclient.grpc as grpcclient

        self.endpoint: Endpoint = resolve_endpoint(url, "grpc")
        self.headers = dict(headers or {}) or None
        self.timeout_s, self.model = timeout_s, model
        try:
            self._client = grpcclient.InferenceServerClient(self.endpoint.address)
        except Exception as e:
            raise ServerUnavailableError(f"{model}: {e}") from e
        self._grpc = grpcclient
        self._hw: dict[str, tuple[int, int]] = {}  # session -> (H, W) of its frames

    def __enter__(self) -> SAM3ConceptVideoClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    # -- sessions ----------------------------------------------------------------------------
    def open(self, video: object, *, progress: Progress | None = None) -> str:
        """A new session holding every frame of ``video``; its id.

        Args:
            video: a ``VideoSource``, or what :func:`~triton_sam.client.video_source.open_video`
                takes: a folder of frames, an mp4, a TIFF stack, a numpy volume (Z, Y, X[, C])
                or a list of uint8 images of one size. Files go up as their own bytes (the
                server decodes them), arrays as pixels, one frame at a time (never held
                decoded here).
            progress: called with (frames uploaded, frames) after each one.
        """
        source = video if isinstance(video, VideoSource) else open_video(video)
        height, width = source.height, source.width
        answer = self._call(
            protocol.CMD_INIT,
            num_frames=np.array([source.num_frames], np.int32),
            video_hw=np.array([height, width], np.int32),
        )
        session = _text(answer[protocol.OUT_SESSION_ID])
        self._hw[session] = (int(height), int(width))
        for index in range(source.num_frames):
            tensors = {protocol.FRAME_INDEX: np.array([index], np.int32)}
            encoded = source.encoded(index)
            if encoded is not None:
                tensors[protocol.FRAME_BYTES] = np.array([encoded], dtype=object)
            else:
                pixels = source.pixels(index)
                tensors[protocol.FRAME] = np.ascontiguousarray(
                    pixels[..., None] if pixels.ndim == 2 else pixels
                )
            self._call(protocol.CMD_ADD_FRAME, session, **tensors)
            if progress is not None:
                progress(index + 1, source.num_frames)
        return session

    def add_prompt(
        self,
        session: str,
        phrases: Sequence[str] | None = None,
        boxes: Any = None,
        box_labels: Sequence[int] | None = None,
        frame_index: int = 0,
    ) -> list[int]:
        """Search every later frame for ``phrases``, for exemplar ``boxes``, or for both.

        Args:
            session: the id :meth:`open` answered.
            phrases: noun phrases; each is one prompt.
            boxes: [G, 4] (x0, y0, x1, y1) in pixels of frame ``frame_index``, each around an
                example of the concept (or, labelled 0, a counter-example); encoded once on
                that frame and searched for on every frame. With phrases, every phrase's
                prompt carries them; alone, they make one prompt (phrase ``"visual"``).
            box_labels: [G] 1 positive, 0 negative (default: all positive).
            frame_index: the frame the boxes are drawn on (uploaded).

        Returns:
            Each phrase's prompt id (the boxes' one prompt's without phrases).

        Raises:
            InvalidRequestError: the server refuses the request, naming the field
                (``exemplar_boxes[i]``, ``exemplar_labels``, ``frame_index``, ``text``).
        """
        tensors: dict[str, np.ndarray] = {}
        if phrases is not None:
            tensors[protocol.TEXT] = np.array([p.encode() for p in phrases], dtype=np.object_)
        if boxes is not None:
            tensors[protocol.EXEMPLAR_BOXES] = np.asarray(boxes, np.float32)
            tensors[protocol.FRAME_INDEX] = np.array([frame_index], np.int32)
            if box_labels is not None:
                tensors[protocol.EXEMPLAR_LABELS] = np.asarray(box_labels, np.int32)
        answer = self._call(protocol.CMD_ADD_PROMPT, session, **tensors)
        return [int(v) for v in answer[protocol.OUT_PROMPT_IDS]]

    def info(self, session: str) -> dict[str, Any]:
        """The session's own figures (frames uploaded and tracked, objects, bytes)."""
        return json.loads(_text(self._call(protocol.CMD_INFO, session)[protocol.OUT_STATUS]))

    def close(self, session: str) -> None:
        self._call(protocol.CMD_CLOSE, session)

    # -- propagation -------------------------------------------------------------------------
    def propagate(
        self,
        session: str,
        *,
        start_frame_index: int = 0,
        max_frames: int | None = None,
        reverse: bool = False,
        settings: Mapping[str, Any] | None = None,
        progress: Progress | None = None,
        labels: Any = None,
    ) -> Iterator[ConceptVideoFrame]:
        """Track the session's phrases; yields each answered frame as it arrives.

        Args:
            session: the id :meth:`open` answered.
            start_frame_index / max_frames / reverse: as ``propagate_in_video_iterator``.
            settings: ``ConceptVideoSettings`` fields to override (refused naming
                ``settings.<key>`` when unknown or out of bounds).
            progress: called with (frames processed, frames to process) on every response.
            labels: an ``OmeZarrLabelWriter``; each answered frame is written at its index.

        Raises:
            InvalidRequestError / ServerOverloadedError / RequestCancelledError / ServerError:
                the server's refusal (the message names the field).
        """
        inputs: dict[str, np.ndarray] = {
            protocol.START_FRAME: np.array([start_frame_index], np.int32),
            protocol.MAX_FRAMES: np.array([-1 if max_frames is None else max_frames], np.int32),
            protocol.REVERSE: np.array([reverse], bool),
        }
        if settings:
            inputs[protocol.SETTINGS] = np.array([json.dumps(dict(settings)).encode()], object)
        for answer in self._stream(protocol.CMD_PROPAGATE, session, inputs):
            done_total = answer.get(protocol.PROGRESS)
            if done_total is not None and progress is not None:
                progress(int(done_total[0]), int(done_total[1]))
            if protocol.FRAME_INDEX not in answer:
                continue
            frame = _frame(answer, self._video_hw(session))
            if labels is not None:
                labels.write(frame.result.frame_idx, frame.result)
            yield frame

    # -- transport ---------------------------------------------------------------------------
    def _video_hw(self, session: str) -> tuple[int, int]:
        """The frames' size, remembered from :meth:`open` (the masks come as RLE counts)."""
        if session not in self._hw:
            raise InputValidationError(
                "session", "not opened by this client: its frames' size is unknown here"
            )
        return self._hw[session]

    def _call(self, command: str, session: str | None = None, **tensors: np.ndarray) -> dict:
        """One command's one response ({} for a command that answers nothing, ``close``)."""
        answers = list(self._stream(command, session, tensors))
        return answers[-1] if answers else {}

    def _stream(
        self, command: str, session: str | None, tensors: Mapping[str, np.ndarray]
    ) -> Iterator[dict[str, np.ndarray]]:
        """The responses of one request, until the final one; leaving early cancels it."""
        inputs = {protocol.COMMAND: np.array([command.encode()], dtype=np.object_)}
        if session is not None:
            inputs[protocol.SESSION_ID] = np.array([session.encode()], dtype=np.object_)
        inputs |= dict(tensors)
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        finished = False
        self._client.start_stream(
            callback=lambda result, error: answers.put((result, error)), headers=self.headers
        )
        try:
            self._client.async_stream_infer(
                self.model,
                build_infer_inputs(self._grpc, inputs, http=False),
                enable_empty_final_response=True,
            )
            while True:
                try:
                    result, error = answers.get(timeout=self.timeout_s)
                except queue.Empty as e:
                    raise InferenceTimeoutError(
                        f"{self.model} {command}: no answer in {self.timeout_s} s"
                    ) from e
                if error is not None:
                    finished = True
                    message = error.message() if hasattr(error, "message") else str(error)
                    raise stream_error(message)
                response = result.get_response()
                final = response.parameters.get("triton_final_response")
                outputs = {
                    n: result.as_numpy(n) for n in ANSWER_NAMES if result.as_numpy(n) is not None
                }
                if outputs:
                    yield outputs
                if final is not None and final.bool_param:
                    finished = True
                    return
        finally:
            self._client.stop_stream(cancel_requests=not finished)


def _frame(answer: Mapping[str, np.ndarray], video_hw: tuple[int, int]) -> ConceptVideoFrame:
    ids = answer[protocol.OBJECT_IDS].astype(np.int64)
    counts = answer.get(protocol.MASKS_RLE, np.zeros(0, object))
    masks = np.zeros((len(ids), *video_hw), bool)
    for row, value in enumerate(counts.reshape(-1)):
        masks[row] = decode_rle(value, video_hw)
    result = FrameResult(
        frame_idx=int(answer[protocol.FRAME_INDEX][0]),
        object_ids=ids,
        scores=answer[protocol.SCORES],
        boxes=answer[protocol.BOXES].reshape(-1, 4),
        masks=masks,
        prompt_ids=answer[protocol.PROMPT_IDS].astype(np.int64),
    )
    done, total = (int(v) for v in answer[protocol.PROGRESS])
    return ConceptVideoFrame(
        result, answer[protocol.TRACKER_SCORES], answer[protocol.REMOVED_OBJECT_IDS], (done, total)
    )


def _text(value: np.ndarray) -> str:
    item = np.asarray(value).reshape(-1)[0]
    return item.decode() if isinstance(item, bytes) else str(item)
