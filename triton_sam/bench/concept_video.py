"""Concept tracking in video: frames/s of ``sam3_concept_video`` served (embedded Triton, gRPC
stream) against transformers' ``Sam3VideoModel`` in-process on the same weights and frames,
one propagation each (the first frame's warm-up included in both).

Counts, not only time: both runs report the frames they answered and the objects on the last
one, so a faster path that answered less is visible.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from triton_sam.bench.harness import embedded
from triton_sam.client.concept_video import SAM3ConceptVideoClient
from triton_sam.repository.writer import embedded_repository
from triton_sam.setup.concept_video import build_concept_video_repository


def bench_concept_video(
    video_model: Any,
    processor: Any,
    frames: Sequence[np.ndarray],
    phrase: str,
    work_dir: Path,
    *,
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One propagation served and one in-process; frames/s of each.

    Args:
        video_model: a ``Sam3VideoModel`` in eval mode (its config's thresholds are the
            in-process run's; ``settings`` must give the served run the same ones).
        processor: its ``Sam3VideoProcessor`` (the tokenizer is exported with the graphs).
        frames: uint8 [H, W, 3] frames.
        phrase: the concept.
        work_dir: where the repository and the export are written.
        settings: ``ConceptVideoSettings`` overrides sent with the served propagation.

    Returns:
        ``served_fps``, ``inprocess_fps``, the frames each answered, the objects on the last
        answered frame of each, and the seconds of each propagation.
    """
    import torch

    repo = Path(work_dir) / "model_repository"
    build_concept_video_repository(
        repo, video_model, processor.tokenizer, work_dir=Path(work_dir) / "export"
    )
    with (
        embedded(embedded_repository(repo), startup_timeout_s=300.0) as server,
        SAM3ConceptVideoClient(server.grpc_url) as client,
    ):
        session = client.open(frames)
        client.add_prompt(session, [phrase])
        start = time.perf_counter()
        served = list(client.propagate(session, settings=settings))
        served_s = time.perf_counter() - start
        client.close(session)
    session = processor.init_video_session(
        video=list(frames), inference_device="cpu", dtype=torch.float32
    )
    processor.add_text_prompt(session, phrase)
    answers = []
    start = time.perf_counter()
    with torch.no_grad():
        for out in video_model.propagate_in_video_iterator(session):
            answers.append(processor.postprocess_outputs(session, out))
    inprocess_s = time.perf_counter() - start
    return {
        "frames": len(frames),
        "served_frames_answered": len(served),
        "inprocess_frames_answered": len(answers),
        "served_objects_last_frame": len(served[-1].result.object_ids) if served else 0,
        "inprocess_objects_last_frame": len(answers[-1]["object_ids"]) if answers else 0,
        "served_s": round(served_s, 3),
        "inprocess_s": round(inprocess_s, 3),
        "served_fps": round(len(served) / served_s, 3),
        "inprocess_fps": round(len(answers) / inprocess_s, 3),
    }
