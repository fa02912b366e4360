"""The SAM3 video stage of ``setup-video``: ``Sam3TrackerVideoModel`` exported as the tracker's
graphs (``export/sam3_video.py``) and written with the ``sam3_tracker`` model."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from triton_sam.errors import InputValidationError
from triton_sam.export import ExportOptions
from triton_sam.repository.config import RepositoryOptions
from triton_sam.repository.video_config import TrackerOptions

log = logging.getLogger(__name__)


def build_sam3_video(
    repository: Path,
    *,
    checkpoint: Path | None,
    random_init: bool,
    export_options: ExportOptions | None,
    repository_options: RepositoryOptions | None,
    tracker_options: TrackerOptions | None,
    work_dir: Path | None,
) -> tuple[list[str], dict[str, float], dict[str, float]]:
    """``Sam3TrackerVideoModel``'s graphs and the ``sam3_tracker`` model: from a Hugging Face
    model directory (the facebook/sam3 snapshot), or the full-size config's random
    initialisation with ``random_init``.

    Returns:
        (models written, max |ORT - torch| per graph output, seconds per stage): the fields
        of ``pipeline.VideoRepositoryBuild``.
    """
    from transformers import Sam3TrackerVideoConfig

    from triton_sam.export import sam3_video
    from triton_sam.repository.video_config import write_video_models

    if checkpoint is None and not random_init:
        raise InputValidationError(
            "checkpoint", "no checkpoint given; download one or pass random_init=True"
        )
    options = export_options or ExportOptions()
    if checkpoint is None:
        log.warning("exporting sam3_tracker video graphs with RANDOM weights")
        model = sam3_video.random_model(options.seed, Sam3TrackerVideoConfig())
    else:
        model = sam3_video.build_video_model(checkpoint)
    repository.mkdir(parents=True, exist_ok=True)
    scratch = Path(
        tempfile.mkdtemp(
            prefix=f".{repository.resolve().name}.sam3-video-export-",
            dir=work_dir or repository.resolve().parent,
        )
    )
    try:
        result = sam3_video.export_sam3_video(model, scratch / "onnx", options)
        models = write_video_models(
            repository,
            result.graphs,
            result.tracker_config,
            repository_options or RepositoryOptions(),
            tracker_options,
            family="sam3",
        )
        return models, result.max_abs_error, result.seconds
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
