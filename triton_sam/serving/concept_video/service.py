"""The ``sam3_concept_video`` model's request handling, without Triton (dependency-free but
for the injected tokenizer).

Sessions are the tracker's: the same :class:`~..tracking.sessions.SessionStore` (server-issued
ids bound to the tenant, bounds on sessions, frames and bytes, idle eviction) and the same
session commands, answered by a :class:`~..tracking.service.TrackingService` over that store
(``init``, ``add_frame``, ``close``, ``info``). This module adds what concepts need per
session: the prompts (``add_prompt``: phrases, exemplar boxes drawn on one uploaded frame, or
both; :mod:`.prompts`) and the :class:`.pipeline.ConceptVideo` built on the session's frames
at its first propagation (its bookkeeping and the tracker's memories then
live as long as the session).

``propagate`` checks the whole request before anything runs (session, frames uploaded,
prompts, settings, mask format, admission) and then streams: one response per processed
frame, an answered frame's tensors (:func:`.wire.frame_response`) or progress alone while the
hot-start hold-back keeps answers back, then a final response with the totals. The caller's
``cancelled()`` is asked before each frame, so a cancel waits for one frame's work at most;
the bookkeeping of every processed frame is committed (:meth:`.pipeline.ConceptVideo.steps`),
held-back answers are dropped.

Concurrency: the Triton model answers commands on its own thread and streams propagations on
others; one lock serialises every command and every frame of every propagation, so a
session's state is only ever touched by one frame or command at a time, and at most
``max_propagations`` propagations stream at once (one more is refused with ``Overloaded``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..protocol import concept_video as p
from ..protocol.tracker import TrackingError
from ..tracking.config import TrackerConfig
from ..tracking.service import TrackingService
from ..tracking.sessions import SessionStore
from .loop import processing_order
from .pipeline import ConceptVideo
from .prompts import ConceptPrompt
from .request import (
    PromptKey,
    exemplar_key,
    optional_bytes,
    read_exemplar,
    read_flag,
    read_int,
    read_phrases,
    read_text,
)
from .settings import ConceptVideoSettings
from .wire import frame_response, parse_settings, progress_response

Tensors = Mapping[str, np.ndarray]
Tokenize = Callable[[Sequence[str]], tuple[np.ndarray, np.ndarray]]
Key = tuple[str, str]  # (tenant, session id)
# Served: each mask to the object it was propagated for (upstream gives a frame's propagated
# masks to the ids after that frame's removals, so a removal shifts masks to other ids; see
# docs/concept-video.md).
SERVED_UPSTREAM_ROWS = False
SERVED_SETTINGS = ConceptVideoSettings(max_num_objects=p.MAX_OBJECTS)


@dataclass
class _Concepts:
    """What a session holds beyond the tracker's state."""

    prompts: dict[PromptKey, int] = field(default_factory=dict)  # -> prompt id
    tokens: dict[int, ConceptPrompt] = field(default_factory=dict)
    video: ConceptVideo | None = None
    streaming: bool = False  # a propagation of this session is running


class ConceptVideoService:
    """Answers ``sam3_concept_video`` commands.

    Args:
        detector: runs the concept graphs ``text``, ``exemplar``, ``decoder`` and
            ``video_vision`` (or ``vision`` without ``shared_vision``).
        tracker: runs the SAM3 tracker's graphs.
        tracker_config: the tracker's ``TrackerConfig``.
        tokenize: phrases -> (int64 [N, 32] token ids, int64 [N, 32] attention mask); may
            raise ``RequestError`` naming ``text``.
        store: the sessions.
        settings: the reconciliation's defaults (a propagation's ``settings`` overrides some).
        shared_vision: one ViT run per frame for detector and tracker.
        max_propagations: propagations streaming at once.
    """

    def __init__(
        self,
        detector,
        tracker,
        tracker_config: TrackerConfig,
        tokenize: Tokenize,
        store: SessionStore | None = None,
        *,
        settings: ConceptVideoSettings = SERVED_SETTINGS,
        shared_vision: bool = True,
        max_propagations: int = 1,
    ) -> None:
        self.sessions = TrackingService(tracker, tracker_config, store)
        self.store = self.sessions.store
        self.detector, self.tracker, self.tracker_config = detector, tracker, tracker_config
        self.tokenize, self.settings = tokenize, settings
        self.shared_vision = shared_vision
        self.max_propagations = max(1, max_propagations)
        self.lock = threading.RLock()
        self._concepts: dict[Key, _Concepts] = {}
        self.streaming = 0  # propagations running (metrics)
        self.frames_processed = 0  # frames processed by every propagation (metrics)
        self.frames_answered = 0  # frame responses sent (metrics)

    # -- commands answered at once ---------------------------------------------------------
    def handle(self, inputs: Tensors, tenant: str = "") -> dict[str, np.ndarray]:
        """Answer one non-streaming command of ``tenant``.

        Raises:
            TrackingError: a bad request, a session this tenant does not hold, a bound.
            RequestError: a phrase the tokenizer refuses (field ``text``), a bad exemplar box
                or label (``exemplar_boxes[i]``, ``exemplar_labels``).
        """
        command = read_text(inputs, p.COMMAND)
        with self.lock:
            if command in p.SESSION_COMMANDS:
                out = self.sessions.handle(inputs, tenant)
                self._forget_gone()
                if command == p.CMD_INFO:
                    out[p.OUT_STATUS] = self._status(tenant, inputs, out[p.OUT_STATUS])
                return out
            if command == p.CMD_ADD_PROMPT:
                return self._add_prompt(tenant, inputs)
        if command == p.CMD_PROPAGATE:
            raise TrackingError(
                p.ERR_INVALID_INPUT,
                "command: propagate streams its answers; send it on a streaming call",
                p.COMMAND,
            )
        raise TrackingError(
            p.ERR_INVALID_INPUT,
            f"command: got {command!r}, expected one of {list(p.COMMANDS)}",
            p.COMMAND,
        )

    def _add_prompt(self, tenant: str, inputs: Tensors) -> dict[str, np.ndarray]:
        key, concepts = self._session(tenant, inputs)
        exemplar = read_exemplar(self.store.get(*key), inputs)
        if p.TEXT in inputs or exemplar is None:
            phrases = read_phrases(inputs)
        else:  # boxes alone: Sam3Processor's phrase for them
            phrases = [p.EXEMPLAR_ONLY_PHRASE]
        keys: list[PromptKey] = [
            phrase if exemplar is None else exemplar_key(phrase, exemplar) for phrase in phrases
        ]
        new = [k for k in dict.fromkeys(keys) if k not in concepts.prompts]
        if len(concepts.prompts) + len(new) > p.MAX_PROMPTS:
            raise TrackingError(
                p.ERR_LIMIT,
                f"text: {len(concepts.prompts)} prompts held and {len(new)} new, expected at "
                f"most {p.MAX_PROMPTS} per session",
                p.TEXT,
            )
        if concepts.streaming:
            raise TrackingError(
                p.ERR_INVALID_INPUT,
                "text: this session is propagating; add prompts before or after",
                p.TEXT,
            )
        if new:
            # refuses a long phrase before anything changes
            ids, mask = self.tokenize([k if isinstance(k, str) else k[0] for k in new])
            for row, prompt_key in enumerate(new):
                prompt_id = len(concepts.prompts)  # upstream's ids: in the order added
                concepts.prompts[prompt_key] = prompt_id
                concepts.tokens[prompt_id] = ConceptPrompt(ids[row], mask[row], exemplar)
            if concepts.video is not None:
                concepts.video.set_prompts(concepts.tokens)
        self.store.touch(*key)
        answer = [concepts.prompts[k] for k in keys]  # a repeated prompt: the same id
        return {p.OUT_PROMPT_IDS: np.array(answer, np.int32)}

    # -- propagation -----------------------------------------------------------------------
    def propagate(
        self, inputs: Tensors, tenant: str, cancelled: Callable[[], bool] = lambda: False
    ) -> Iterator[dict[str, np.ndarray]]:
        """Check a ``propagate`` request and return its stream of responses.

        Everything the request names is checked here, before any graph runs; the stream
        then raises only for a cancel (``Cancelled``), a session closed or evicted meanwhile
        (``SessionNotFound``) or a bound reached while it grows (``LimitExceeded``).

        Raises:
            TrackingError / RequestError: the request refused, naming the field.
        """
        with self.lock:
            key, concepts = self._session(tenant, inputs)
            session = self.store.get(*key)
            missing = [i for i in range(session.num_frames) if i not in session.frames]
            if missing:
                raise TrackingError(
                    p.ERR_FRAME_MISSING,
                    f"frame_index: frames {missing[:8]} of {session.num_frames} not uploaded; "
                    "send every frame with add_frame before propagate",
                    p.FRAME_INDEX,
                )
            if not concepts.tokens:
                raise TrackingError(
                    p.ERR_NO_PROMPTS,
                    "text: no prompt yet; send add_prompt (phrases, exemplar boxes or both) first",
                    p.TEXT,
                )
            settings = parse_settings(optional_bytes(inputs, p.SETTINGS), self.settings)
            mask_format = optional_bytes(inputs, p.MASK_FORMAT) or b"rle"
            mask_format = mask_format.decode("utf-8", "replace")
            if mask_format not in p.MASK_FORMATS:
                raise TrackingError(
                    p.ERR_INVALID_INPUT,
                    f"mask_format: got {mask_format!r}, expected one of {list(p.MASK_FORMATS)}",
                    p.MASK_FORMAT,
                )
            start = read_int(inputs, p.START_FRAME, 0)
            limit = read_int(inputs, p.MAX_FRAMES, -1)
            reverse = read_flag(inputs, p.REVERSE)
            if not 0 <= start < session.num_frames + int(reverse):
                raise TrackingError(
                    p.ERR_FRAME_OUT_OF_RANGE,
                    f"start_frame_index: got {start}, the video has {session.num_frames} frames",
                    p.START_FRAME,
                )
            if concepts.streaming:
                raise TrackingError(
                    p.ERR_OVERLOADED,
                    "session_id: this session is already propagating; wait for its end",
                    p.SESSION_ID,
                )
            if self.streaming >= self.max_propagations:
                raise TrackingError(
                    p.ERR_OVERLOADED,
                    f"command: {self.streaming} propagation(s) running, this server runs "
                    f"{self.max_propagations} at once; retry later",
                    p.COMMAND,
                )
            if concepts.video is None:
                concepts.video = ConceptVideo(
                    self.detector, self.tracker, self.tracker_config, session,
                    concepts.tokens, settings, shared_vision=self.shared_vision,
                )  # fmt: skip
            concepts.video.settings = settings
            concepts.streaming = True
            self.streaming += 1
        max_frames = None if limit < 0 else limit
        return self._stream(key, concepts, start, max_frames, reverse, mask_format, cancelled)

    def _stream(
        self,
        key: Key,
        concepts: _Concepts,
        start: int,
        max_frames: int | None,
        reverse: bool,
        mask_format: str,
        cancelled: Callable[[], bool],
    ) -> Iterator[dict[str, np.ndarray]]:
        video = concepts.video
        assert video is not None
        try:
            total = _count_frames(video.num_frames, start, max_frames, reverse)
            steps = video.steps(
                start, max_frames, reverse=reverse, upstream_rows=SERVED_UPSTREAM_ROWS
            )
            reported = set(video.book.removed_obj_ids)
            answered = processed = 0
            while True:
                if cancelled():
                    steps.close()  # the book of the last processed frame is kept
                    raise TrackingError(
                        p.ERR_CANCELLED,
                        f"propagate: cancelled after {processed} of {total} frames",
                        p.COMMAND,
                    )
                with self.lock:
                    self.store.get(*key)  # closed or evicted meanwhile: SessionNotFound
                    step = next(steps, None)
                    if step is not None:
                        processed = step.processed
                        self.frames_processed += 1
                        self.store.touch(*key, tracked=True)
                        self.store.check_room(*key, 0)  # the memories grew
                if step is None:
                    break
                if not step.released:
                    yield progress_response(processed, total)
                for output, result in step.released:
                    removed = step.book.removed_obj_ids - reported
                    reported |= removed
                    answered += 1
                    self.frames_answered += 1
                    yield frame_response(
                        result,
                        tracker_scores=output.obj_id_to_tracker_score,
                        removed_since_last=removed,
                        progress=(processed, total),
                        mask_format=mask_format,
                        low_res_masks=output.obj_id_to_mask,
                    )
            yield {
                p.FRAMES_ANSWERED: np.array([answered], np.int32),
                p.PROGRESS: np.array([processed, total], np.int32),
            }
        finally:
            with self.lock:
                concepts.streaming = False
                self.streaming -= 1

    # -- sessions --------------------------------------------------------------------------
    def _status(self, tenant: str, inputs: Tensors, status: np.ndarray) -> np.ndarray:
        """The tracker's status of the session plus its prompts (``prompts``: phrase -> id
        for phrases alone; ``exemplar_prompts``: one entry per prompt with boxes) and whether
        a propagation of it is running (a client waits on that after a cancel)."""
        _, concepts = self._session(tenant, inputs)
        value = json.loads(status.reshape(-1)[0])
        value["session"]["prompts"] = {
            k: i for k, i in concepts.prompts.items() if isinstance(k, str)
        }
        value["session"]["exemplar_prompts"] = [
            {"prompt_id": i, "phrase": k[0], "frame_index": k[1], "boxes": len(k[3]) // 8}
            for k, i in concepts.prompts.items()
            if not isinstance(k, str)
        ]
        value["session"]["propagating"] = concepts.streaming
        return np.array([json.dumps(value, sort_keys=True).encode()], dtype=object)

    def _session(self, tenant: str, inputs: Tensors) -> tuple[Key, _Concepts]:
        """The tenant's session the request names and its concept state."""
        if p.SESSION_ID not in inputs:
            raise TrackingError(
                p.ERR_INVALID_INPUT,
                "session_id: required; send the id init answered",
                p.SESSION_ID,
            )
        session_id = read_text(inputs, p.SESSION_ID)
        self.store.get(tenant, session_id)  # another tenant's id: SessionNotFound
        key = (tenant, session_id)
        return key, self._concepts.setdefault(key, _Concepts())

    def _forget_gone(self) -> None:
        """Drop the concept state of sessions the store no longer holds (closed, evicted)."""
        tenants = {tenant for tenant, _ in self._concepts}
        held = {(t, s) for t in tenants for s in self.store.tenant_sessions(t)}
        for key in [k for k in self._concepts if k not in held]:
            del self._concepts[key]


def _count_frames(num_frames: int, start: int, max_frames: int | None, reverse: bool) -> int:
    frames, _ = processing_order(num_frames, start, max_frames, reverse=reverse)
    return len(frames)


__all__ = ["SERVED_SETTINGS", "SERVED_UPSTREAM_ROWS", "ConceptVideoService"]
