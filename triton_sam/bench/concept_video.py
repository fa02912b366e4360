"""Concept tracking in video: frames/s of ``sam3_concept_video`` served (embedded Triton, gRPC
stream) against transformers' ``Sam3VideoModel`` in-process on the same weights and frames,
in one run.

Counts, not only time: each path reports the frames it answered and the objects on its last
answered frame, and the served path the frames the server says it tracked (the session's
``frames_tracked``), so a faster path that did less is visible. Per-frame times are the gaps
between answers as the caller receives them (the first includes the first frame's warm-up
on both paths; answers held back by the hot-start delay arrive in bursts, on both paths).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from triton_sam.bench.harness import embedded
from triton_sam.bench.stats import percentiles, ratio
from triton_sam.client.concept_video import SAM3ConceptVideoClient
from triton_sam.repository.writer import embedded_repository
from triton_sam.setup.concept_video import build_concept_video_repository


@dataclass
class ConceptVideoPath:
    """One path's figures over its repeats.

    Attributes:
        path: ``served`` or ``transformers``.
        seconds: each propagation's wall time.
        frame_ms: the gaps between answers (ms), every repeat together.
        frames_answered: answers of the last repeat; objects_last_frame: on its last answer.
        server_frames_tracked: the frames the server says it tracked (served only).
    """

    path: str
    seconds: list[float] = field(default_factory=list)
    frame_ms: list[float] = field(default_factory=list)
    frames_answered: int = 0
    objects_last_frame: int = 0
    server_frames_tracked: int | None = None

    @property
    def fps(self) -> float:
        """Answers per second, median propagation."""
        return self.frames_answered / float(np.median(self.seconds)) if self.seconds else 0.0


@dataclass
class ConceptVideoReport:
    """:func:`bench_concept_video`'s results and what they were measured on."""

    frames: int
    frame_hw: tuple[int, int]
    phrase: str
    repeats: int
    weights: str
    results: list[ConceptVideoPath]

    def markdown(self) -> str:
        """The report's table."""
        upstream = next(r.fps for r in self.results if r.path == "transformers")
        lines = [
            f"{self.frames} frames of {self.frame_hw[1]}x{self.frame_hw[0]}, phrase "
            f"{self.phrase!r}, {self.weights}; median of {self.repeats}; 'vs transformers' "
            "is frames/s relative to Sam3VideoModel in-process (1.20 = 20 % faster)",
            "",
            "| path | frames/s | frame ms p50 | p95 | max | vs transformers | answered "
            "| server tracked | objects (last frame) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in self.results:
            p = percentiles(r.frame_ms, digits=0)
            tracked = "" if r.server_frames_tracked is None else str(r.server_frames_tracked)
            lines.append(
                f"| {r.path} | {r.fps:.3f} | {p['p50']:.0f} | {p['p95']:.0f} | {p['max']:.0f} "
                f"| {ratio(r.fps, upstream):.2f} | {r.frames_answered} | {tracked} "
                f"| {r.objects_last_frame} |"
            )
        return "\n".join(lines)


def bench_concept_video(
    video_model: Any,
    processor: Any,
    frames: Sequence[np.ndarray],
    phrase: str,
    work_dir: Path,
    *,
    settings: Mapping[str, Any] | None = None,
    repeats: int = 1,
    weights: str = "checkpoint",
    progress: Any = None,
) -> ConceptVideoReport:
    """``repeats`` propagations served, then as many in-process, on the same frames.

    Args:
        video_model: a ``Sam3VideoModel`` in eval mode (its config's thresholds are the
            in-process run's; ``settings`` must give the served run the same ones).
        processor: its ``Sam3VideoProcessor`` (the tokenizer is exported with the graphs).
        frames: uint8 [H, W, 3] frames.
        phrase: the concept.
        work_dir: where the repository and the export are written.
        settings: ``ConceptVideoSettings`` overrides sent with the served propagation.
        repeats: propagations per path (each on a new session).
        weights: what the weights are, for the report.
        progress: called with a line of text at each stage.
    """
    say = progress or (lambda _line: None)
    repo = Path(work_dir) / "model_repository"
    say("exporting the graphs and writing the repository")
    build_concept_video_repository(
        repo, video_model, processor.tokenizer, work_dir=Path(work_dir) / "export"
    )
    served = ConceptVideoPath("served")
    say("serving: embedded Triton, gRPC stream")
    with (
        embedded(embedded_repository(repo), startup_timeout_s=300.0) as server,
        SAM3ConceptVideoClient(server.grpc_url) as client,
    ):
        for _ in range(repeats):
            session = client.open(frames)
            client.add_prompt(session, [phrase])
            answers = _timed(client.propagate(session, settings=settings), served)
            served.server_frames_tracked = client.info(session)["session"]["frames_tracked"]
            client.close(session)
            served.frames_answered = len(answers)
            served.objects_last_frame = len(answers[-1].result.object_ids) if answers else 0
    upstream = ConceptVideoPath("transformers")
    say("transformers: Sam3VideoModel in-process")
    for _ in range(repeats):
        # the session (frames resized and normalised) before the clock, as the served path
        # uploads its frames before it
        session = _transformers_session(processor, frames, phrase)
        answers = _timed(_transformers_answers(video_model, processor, session), upstream)
        upstream.frames_answered = len(answers)
        upstream.objects_last_frame = len(answers[-1]["object_ids"]) if answers else 0
    return ConceptVideoReport(
        frames=len(frames),
        frame_hw=tuple(frames[0].shape[:2]),
        phrase=phrase,
        repeats=repeats,
        weights=weights,
        results=[served, upstream],
    )


def write_concept_video_report(report: ConceptVideoReport, out_dir: Path) -> dict[str, Path]:
    """``concept_video_bench.json`` and ``.md`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "concept_video_bench.json", "md": out_dir / "concept_video_bench.md"}
    figures = asdict(report) | {"fps": {r.path: round(r.fps, 3) for r in report.results}}
    paths["json"].write_text(json.dumps(figures, indent=2))
    paths["md"].write_text(report.markdown() + "\n")
    return paths


def _timed(answers: Iterable[Any], into: ConceptVideoPath) -> list[Any]:
    """Every answer of ``answers``, with the propagation's time and the gaps between answers
    added to ``into``."""
    out = []
    start = last = time.perf_counter()
    for answer in answers:
        now = time.perf_counter()
        into.frame_ms.append((now - last) * 1e3)
        last = now
        out.append(answer)
    into.seconds.append(time.perf_counter() - start)
    return out


def _transformers_session(processor: Any, frames: Sequence[np.ndarray], phrase: str) -> Any:
    import torch

    session = processor.init_video_session(
        video=list(frames), inference_device="cpu", dtype=torch.float32
    )
    processor.add_text_prompt(session, phrase)
    return session


def _transformers_answers(video_model: Any, processor: Any, session: Any) -> Iterable[dict]:
    import torch

    with torch.no_grad():
        for out in video_model.propagate_in_video_iterator(session):
            yield processor.postprocess_outputs(session, out)
