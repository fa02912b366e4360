"""Concept tracking in video end to end: a seeded small ``Sam3VideoModel`` and its reference run
through transformers (``Sam3VideoProcessor`` + ``propagate_in_video_iterator`` +
``postprocess_outputs``), for the parity of our pipeline on real graphs.

The model and its thresholds (:data:`SETTINGS`) are ``triton_sam.bench.concept_video_small``'s
(``bench concept-video`` runs it too). :func:`transformers_run` records every
query's probability so the test can assert that each lies at least :data:`SCORE_MARGIN` from
every threshold (a float32 difference in a graph cannot move a detection across one).

Clip: :func:`sam3_video_support.frames`' first three frames (240x320, two moving rectangles on
noise) with the phrase "cat".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
from sam3_video_support import frames as tracker_frames

from triton_sam.bench.concept_video_small import (  # noqa: F401 - the tests' names for them
    SMALL_SETTINGS,
    detector_config,
    video_config,
)
from triton_sam.bench.concept_video_small import small_processor as processor
from triton_sam.bench.concept_video_small import small_video_model as random_video_model
from triton_sam.serving.concept_video.settings import ConceptVideoSettings

NUM_FRAMES = 3
PHRASE = "cat"
SEED = 0

SETTINGS = SMALL_SETTINGS
THRESHOLD_NAMES = ("score_threshold_detection", "new_det_thresh", "high_conf_thresh")
SCORE_MARGIN = 1e-3


def clip() -> list[np.ndarray]:
    """uint8 [NUM_FRAMES, 240, 320, 3] frames."""
    return tracker_frames(SEED)[:NUM_FRAMES]


@dataclass
class ReferenceFrame:
    """One answered frame of the reference run.

    Attributes:
        frame_idx: the frame.
        object_ids: int [K] answered objects, increasing.
        scores: float32 [K] tracker scores (upstream's ``scores`` output).
        boxes: float32 [K, 4] (x0, y0, x1, y1) inclusive pixel extents.
        masks: bool [K, H, W] after the overlap resolution.
        raw_masks: object id -> float32 [288, 288] low-resolution logits (before resizing).
        prompt_to_obj_ids: phrase -> its object ids.
    """

    frame_idx: int
    object_ids: np.ndarray
    scores: np.ndarray
    boxes: np.ndarray
    masks: np.ndarray
    raw_masks: dict[int, np.ndarray]
    prompt_to_obj_ids: dict[str, list[int]]


@dataclass
class ReferenceRun:
    """The reference run: answered frames in order, and every detector probability.

    Attributes:
        frames: the answers.
        probabilities: per processed frame, float32 [200] query x presence probabilities.
        detections: per processed frame, the number of detections kept.
    """

    frames: list[ReferenceFrame] = field(default_factory=list)
    probabilities: list[np.ndarray] = field(default_factory=list)
    detections: list[int] = field(default_factory=list)


@lru_cache(maxsize=4)
def transformers_run(
    seed: int = SEED,
    phrase: str = PHRASE,
    prepare: Callable | None = None,
    settings: ConceptVideoSettings = SETTINGS,
) -> ReferenceRun:
    """The clip through ``Sam3VideoModel`` with ``phrase`` (cached per arguments).

    Args:
        seed: the model's seed; settings: its thresholds.
        phrase: the session's one prompt (prompt id 0).
        prepare: ``prepare(model, session)`` runs after the prompt is added and before the
            propagation (an exemplar test fills the prompt's cached embeddings there).
    """
    import torch

    model = random_video_model(seed, settings)
    proc = processor()
    session = proc.init_video_session(video=clip(), inference_device="cpu", dtype=torch.float32)
    proc.add_text_prompt(session, phrase)
    if prepare is not None:
        prepare(model, session)
    run = ReferenceRun()

    def record_probabilities(_module, _inputs, out) -> None:
        probs = (out.pred_logits.sigmoid() * out.presence_logits.sigmoid())[0]
        run.probabilities.append(probs.float().numpy().copy())

    detect = model.run_detection

    def counted_detection(*args, **kwargs):
        found = detect(*args, **kwargs)
        run.detections.append(sum(int(d["scores"].shape[0]) for d in found.values()))
        return found

    hook = model.detector_model.register_forward_hook(record_probabilities)
    model.run_detection = counted_detection
    try:
        with torch.no_grad():
            for out in model.propagate_in_video_iterator(session):
                answer = proc.postprocess_outputs(session, out)
                run.frames.append(
                    ReferenceFrame(
                        frame_idx=int(out.frame_idx),
                        object_ids=answer["object_ids"].numpy().astype(np.int64),
                        scores=answer["scores"].float().numpy(),
                        boxes=answer["boxes"].float().numpy(),
                        masks=answer["masks"].numpy().astype(bool),
                        raw_masks={
                            int(k): v.float().numpy().reshape(v.shape[-2:])
                            for k, v in out.obj_id_to_mask.items()
                        },
                        prompt_to_obj_ids={
                            str(k): [int(i) for i in v]
                            for k, v in answer["prompt_to_obj_ids"].items()
                        },
                    )
                )
    finally:
        hook.remove()
    return run


def closest_to_threshold(run: ReferenceRun, settings: ConceptVideoSettings = SETTINGS) -> float:
    """The smallest |probability - threshold| over every query of every frame."""
    probs = np.concatenate([p.ravel() for p in run.probabilities]).astype(np.float64)
    return min(float(np.abs(probs - getattr(settings, n)).min()) for n in THRESHOLD_NAMES)


def export_graphs(out_dir, seed: int = SEED, *, verify: bool = False):
    """The seeded video model exported (``ConceptVideoExport``); unverified by default: the
    end-to-end parity is the check of these graphs (their export gates run in the families'
    own export tests)."""
    from triton_sam.export import ExportOptions
    from triton_sam.export.sam3_concept import toy_tokenizer
    from triton_sam.export.sam3_concept_video import export_concept_video, export_shared_vision

    model = random_video_model(seed)
    options = ExportOptions(verify=verify)
    export = export_concept_video(model, out_dir, toy_tokenizer(), options)
    export_shared_vision(model, export, options)  # checked against torch whatever verify says
    return export


def tokens(phrase: str = PHRASE) -> tuple[np.ndarray, np.ndarray]:
    """int64 [32] token ids and attention mask of ``phrase`` (the processor's tokenizer)."""
    found = processor().tokenizer(phrase, padding="max_length", max_length=32)
    return np.array(found["input_ids"]), np.array(found["attention_mask"])


def pipeline(
    export,
    settings: ConceptVideoSettings = SETTINGS,
    *,
    shared_vision: bool = False,
    prompts: Mapping | None = None,
):
    """Our :class:`ConceptVideo` on onnxruntime over the exported graphs, on :func:`clip`
    with ``prompts`` (prompt id -> ``ConceptPrompt``; default :data:`PHRASE` alone,
    tokenised by the processor's tokenizer, as upstream does)."""
    from triton_sam.serving.concept_video.pipeline import (
        DETECTOR_KEYS,
        SHARED_VISION,
        ConceptVideo,
    )
    from triton_sam.serving.protocol import tracker as protocol
    from triton_sam.serving.tracking.runners import OnnxRuntimeRunner

    graphs = {k: export.detector.graphs[k] for k in DETECTOR_KEYS}
    if shared_vision:
        graphs[SHARED_VISION] = Path(graphs["vision"]).parent.parent / f"{SHARED_VISION}.onnx"
    detector = OnnxRuntimeRunner(graphs, keys=tuple(graphs))
    tracker = OnnxRuntimeRunner(export.tracker.graphs, keys=protocol.SAM3_GRAPH_KEYS)
    prompts = {0: tokens()} if prompts is None else prompts
    config = export.tracker.tracker_config
    return ConceptVideo(
        detector, tracker, config, clip(), prompts, settings, shared_vision=shared_vision
    )


def frame_errors(ours: list, reference: ReferenceRun, phrase: str = PHRASE) -> list[dict]:
    """Per answered frame: the comparison of ours (``(FrameOutput, FrameResult)`` pairs) with
    the reference, after asserting the same frames, object ids, prompts and boxes.

    Returns:
        One row per frame: ``logit_error`` / ``logit_bound`` (worst object), ``score_error``
        (relative), ``mask_flips_outside`` (mask pixels that differ where upstream's
        upsampled logit is above the bound: must be 0).
    """
    from sam3_video_support import RELATIVE_TOLERANCE, SCALE_FLOOR

    from triton_sam.serving.resample import bilinear

    assert [r.frame_idx for _, r in ours] == [f.frame_idx for f in reference.frames]
    rows = []
    for (output, result), ref in zip(ours, reference.frames, strict=True):
        assert result.object_ids.tolist() == ref.object_ids.tolist(), ref.frame_idx
        phrase_ids = {phrase: sorted(int(i) for i in result.object_ids)}
        assert phrase_ids == (ref.prompt_to_obj_ids or {phrase: []}), ref.frame_idx
        np.testing.assert_array_equal(result.boxes, ref.boxes)
        logit_error, logit_bound, flips = 0.0, np.inf, 0
        for k, obj_id in enumerate(ref.object_ids.tolist()):
            mine, theirs = output.obj_id_to_mask[obj_id], ref.raw_masks[obj_id]
            bound = RELATIVE_TOLERANCE * max(float(np.abs(theirs).max()), SCALE_FLOOR)
            error = float(np.abs(mine.astype(np.float64) - theirs).max())
            if error / bound > logit_error / logit_bound:
                logit_error, logit_bound = error, bound
            upsampled = bilinear(theirs[None, None], ref.masks.shape[-2:])[0, 0]
            differ = result.masks[k] != ref.masks[k]
            flips += int((differ & (np.abs(upsampled) > bound)).sum())
        score_error = 0.0
        if len(ref.scores):
            score_error = float(np.max(np.abs(result.scores - ref.scores) / np.abs(ref.scores)))
        rows.append(
            {
                "frame": ref.frame_idx,
                "objects": ref.object_ids.tolist(),
                "logit_error": logit_error,
                "logit_bound": float(logit_bound) if np.isfinite(logit_bound) else 0.0,
                "score_error": score_error,
                "mask_flips_outside": flips,
            }
        )
    return rows


def service(export, **kwargs):
    """The served model's request handling (:class:`ConceptVideoService`) on onnxruntime
    over the exported graphs, one ViT run per frame, with :data:`SETTINGS` as its defaults
    and the processor's tokenizer."""
    from triton_sam.serving.concept_video.pipeline import DETECTOR_KEYS, SHARED_VISION
    from triton_sam.serving.concept_video.service import ConceptVideoService
    from triton_sam.serving.protocol import tracker as protocol
    from triton_sam.serving.tracking.runners import OnnxRuntimeRunner

    graphs = {k: export.detector.graphs[k] for k in DETECTOR_KEYS}
    graphs[SHARED_VISION] = Path(graphs["vision"]).parent.parent / f"{SHARED_VISION}.onnx"
    detector = OnnxRuntimeRunner(graphs, keys=tuple(graphs))
    tracker = OnnxRuntimeRunner(export.tracker.graphs, keys=protocol.SAM3_GRAPH_KEYS)
    tokenizer = processor().tokenizer

    def tokenize(phrases):
        found = tokenizer(list(phrases), padding="max_length", max_length=32)
        return np.array(found["input_ids"]), np.array(found["attention_mask"])

    return ConceptVideoService(
        detector, tracker, export.tracker.tracker_config, tokenize, settings=SETTINGS, **kwargs
    )
