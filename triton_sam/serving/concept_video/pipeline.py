"""Concept tracking in video in-process: the concept graphs detect, the SAM3 tracker's graphs
track (:class:`.tracker_steps.GraphTrackerSteps`), :func:`.loop.propagate` reconciles, all on
graph runners (onnxruntime sessions in-process, as
:class:`~triton_sam.serving.tracking.runners.OnnxRuntimeRunner`).

Per frame: the detector's vision graph on the frame, its decoder on every prompt (threshold
``score_threshold_detection``, every query allowed; one call per prompt length: prompts with
the same exemplar token count share a call), then the tracker's calls. A prompt's exemplar
(:mod:`.prompts`) is encoded once, by the ``exemplar`` graph on its frame's 72x72 level,
when the prompt is set. The
frames are preprocessed once, as transformers' SAM3 video processor does
(:func:`~triton_sam.serving.tracking.frames.preprocess`), and both vision graphs read the same
pixels, as upstream's one ViT run does.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from ..concept_exemplars import with_exemplars
from ..protocol import tracker as protocol
from ..protocol.tracker import TrackingError
from ..tracking.frames import decode_frame, preprocess
from ..tracking.state import Session
from .detections import Detections, select_detections
from .loop import FrameOutput, FrameStep, processing_order, propagate_steps
from .prompts import ConceptPrompt, Exemplar, as_prompt
from .results import PackedFrameResult
from .settings import ConceptVideoSettings
from .state import ObjectBook
from .tracker_steps import GraphTrackerSteps

FEATURE_NAMES = ("fpn_features.0", "fpn_features.1", "fpn_features.2")
TRACKER_FEATURE_NAMES = ("vision_feats", "high_res_feats_0", "high_res_feats_1")
SHARED_VISION = "video_vision"  # one ViT run for both (export.sam3_concept_video.SharedVision)
NUM_QUERIES = 200  # the decoder answers at most this many instances per prompt
MASK_HW = (288, 288)
DETECTOR_KEYS = ("vision", "text", "exemplar", "decoder")
EXEMPLAR_LEVEL = FEATURE_NAMES[-1]  # the 72x72 level the geometry encoder reads


class ConceptVideo:
    """One video's concept tracking on graph runners.

    Args:
        detector: runs the concept graphs ``vision``, ``text``, ``exemplar`` (for prompts
            with exemplars), ``decoder``.
        tracker: runs the SAM3 tracker's graphs.
        tracker_config: the tracker's ``TrackerConfig`` (from its export).
        frames: uint8 [H, W, 3] frames of the video, in order.
        prompts: prompt id -> :class:`.prompts.ConceptPrompt` (or a (int64 [32] token ids,
            int64 [32] attention mask) pair for a phrase alone), in the order added.
        settings: the reconciliation's thresholds.
        shared_vision: the detector runner has the ``video_vision`` graph: run it once per
            frame for both the detector and the tracker (whose encoder then never runs),
            instead of the detector's ``vision`` graph and the tracker's ``video_encoder``.
    """

    def __init__(
        self,
        detector,
        tracker,
        tracker_config,
        frames: Sequence[np.ndarray] | Session,
        prompts: Mapping[int, ConceptPrompt | tuple[np.ndarray, np.ndarray]],
        settings: ConceptVideoSettings,
        *,
        shared_vision: bool = False,
    ) -> None:
        self.detector, self.settings = detector, settings
        self.shared_vision = shared_vision
        if isinstance(frames, Session):
            session = frames  # a served session: frames uploaded, maybe still encoded
        else:
            session = Session(len(frames), tuple(frames[0].shape[:2]))
            session.frames.update(enumerate(frames))
        self.video_hw = session.video_hw
        self.tracker = GraphTrackerSteps(tracker, tracker_config, session)
        self.exemplar_tokens: dict[int, np.ndarray] = {}  # prompt id -> [G + 1, C]
        self.set_prompts(prompts)
        self.book = ObjectBook()

    @property
    def num_frames(self) -> int:
        return self.tracker.session.num_frames

    def set_prompts(
        self, prompts: Mapping[int, ConceptPrompt | tuple[np.ndarray, np.ndarray]]
    ) -> None:
        """The prompts every later frame is searched for (``Sam3VideoInferenceSession``'s
        prompts), in the order they were added. Objects found so far keep their prompt ids.
        The text graph runs on every phrase; an exemplar not encoded yet is encoded now, on
        its frame (the frame must be held by the session), and kept for every later call.

        Raises:
            TrackingError: ``NoPrompts`` for none (before any graph runs).
        """
        if not prompts:
            raise TrackingError(
                protocol.ERR_NO_PROMPTS,
                "prompts: got none; expected at least one phrase or exemplar",
                "prompts",
            )
        given = {prompt_id: as_prompt(value) for prompt_id, value in prompts.items()}
        self.prompt_ids = list(given)
        ids = np.stack([p.input_ids for p in given.values()]).astype(np.int64)
        mask = np.stack([p.attention_mask for p in given.values()]).astype(np.int64)
        text = self.detector.run(
            "text", {"input_ids": ids, "attention_mask": mask}, ["text_features"]
        )["text_features"]
        for prompt_id, prompt in given.items():
            if prompt.exemplar is not None and prompt_id not in self.exemplar_tokens:
                self.exemplar_tokens[prompt_id] = self._encode_exemplar(prompt.exemplar)
        # one decoder call per prompt length (its prompt tokens are one tensor)
        groups: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {}
        for row, prompt_id in enumerate(self.prompt_ids):
            features, valid = with_exemplars(
                text[row : row + 1], mask[row : row + 1], self.exemplar_tokens.get(prompt_id)
            )
            groups.setdefault(features.shape[1], []).append((prompt_id, features, valid))
        self.prompt_groups = [
            (
                [prompt_id for prompt_id, _, _ in group],
                np.concatenate([f for _, f, _ in group])[None],  # [1, n, P, C]
                np.concatenate([v for _, _, v in group])[None],  # [1, n, P]
            )
            for group in groups.values()
        ]

    def _encode_exemplar(self, exemplar: Exemplar) -> np.ndarray:
        """float32 [G + 1, C]: the geometry encoder's tokens of ``exemplar`` on its frame."""
        pixels = preprocess(self._frame(exemplar.frame_idx), self.tracker.size, "sam3")
        graph = SHARED_VISION if self.shared_vision else "vision"
        level = self.detector.run(graph, {"pixel_values": pixels}, [EXEMPLAR_LEVEL])
        feeds = {
            EXEMPLAR_LEVEL: level[EXEMPLAR_LEVEL],
            "exemplar_boxes": np.asarray(exemplar.boxes, np.float32)[None],
            "exemplar_labels": np.asarray(exemplar.labels, np.int64)[None],
        }
        out = self.detector.run("exemplar", feeds, ["exemplar_features"])
        return np.array(out["exemplar_features"][0], np.float32)

    def _frame(self, frame_idx: int) -> np.ndarray:
        """uint8 [H, W, 3] pixels of a frame (an uploaded encoded frame is decoded)."""
        frame = self.tracker.session.frames[frame_idx]
        return decode_frame(frame) if isinstance(frame, bytes) else frame

    def detect(self, frame_idx: int) -> dict[int, Detections]:
        """Each prompt's detections on the frame (``run_detection``), prompts in order."""
        pixels = preprocess(self._frame(frame_idx), self.tracker.size, "sam3")
        if self.shared_vision:
            names = [*FEATURE_NAMES, *TRACKER_FEATURE_NAMES]
            both = self.detector.run(SHARED_VISION, {"pixel_values": pixels}, names)
            features = {n: both[n] for n in FEATURE_NAMES}
            # the tracker reads its features from the session's cache before encoding a frame
            tracker_features = tuple(both[n] for n in TRACKER_FEATURE_NAMES)
            self.tracker.session.cache_features(frame_idx, tracker_features)
        else:
            features = self.detector.run("vision", {"pixel_values": pixels}, list(FEATURE_NAMES))
        names = ["scores", "boxes", "masks", "num_instances"]
        threshold = np.array([[self.settings.score_threshold_detection]], np.float32)
        found = {}
        for prompt_ids, prompt_features, prompt_mask in self.prompt_groups:
            out = self.detector.run(
                "decoder",
                features
                | {
                    "prompt_features": prompt_features,
                    "prompt_mask": prompt_mask,
                    "threshold": threshold,
                    "max_instances": np.array([[NUM_QUERIES]], np.int64),
                },
                names,
            )
            for p, prompt_id in enumerate(prompt_ids):
                n = int(out["num_instances"][0, p])
                found[prompt_id] = select_detections(
                    out["scores"][0, p, :n], out["boxes"][0, p, :n], out["masks"][0, p, :n],
                    prompt_id, self.settings,
                )  # fmt: skip
        return {prompt_id: found[prompt_id] for prompt_id in self.prompt_ids}

    def steps(
        self,
        start_frame_idx: int = 0,
        max_frames: int | None = None,
        *,
        reverse: bool = False,
        upstream_rows: bool = True,
    ) -> Iterator[FrameStep]:
        """Track over the video one frame per step (:func:`.loop.propagate_steps`).

        ``self.book`` is committed before each step is handed out, so it always matches the
        tracker's memories: a caller that stops asking for steps (a cancel between frames)
        leaves the session consistent, and the answers still held back are dropped.

        Args:
            start_frame_idx / max_frames / reverse: as ``propagate_in_video_iterator``.
            upstream_rows: as :func:`.loop.track_frame` (the served model passes False).
        """
        frames, end = processing_order(
            self.num_frames, start_frame_idx, max_frames, reverse=reverse
        )
        for step in propagate_steps(
            self.book, frames, end, self.detect, self.tracker, self.settings,
            mask_hw=MASK_HW, video_hw=self.video_hw, reverse=reverse,
            upstream_rows=upstream_rows,
        ):  # fmt: skip
            self.book = step.book
            yield step

    def propagate(
        self, start_frame_idx: int = 0, max_frames: int | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[FrameOutput, PackedFrameResult]]:
        """Track over the video (``propagate_in_video_iterator`` + ``postprocess_outputs``);
        yields each answered frame, ``hotstart_delay`` frames late."""
        for step in self.steps(start_frame_idx, max_frames, reverse=reverse):
            yield from step.released
