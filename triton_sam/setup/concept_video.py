"""``triton-sam setup-video sam3_concept_video``: a ``Sam3VideoModel`` exported as the graphs
``sam3_concept_video`` calls (the detector's, the tracker's and the shared vision graph,
each checked against torch by its family's export gate unless verification is off) and
written with the model into a repository (:mod:`triton_sam.repository.concept_video`).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_sam.errors import CheckpointError
from triton_sam.export import ExportOptions
from triton_sam.repository.concept_video import ConceptVideoOptions, write_concept_video_models
from triton_sam.repository.config import RepositoryOptions


@dataclass(frozen=True)
class ConceptVideoBuild:
    """What one build wrote: the model names, and the export (its graphs' paths and
    figures, in a scratch directory that is gone unless ``work_dir`` was given)."""

    models: list[str]
    export: Any


def build_concept_video_repository(
    repo: Path,
    video_model: Any,
    tokenizer: Any,
    *,
    options: RepositoryOptions | None = None,
    serving: ConceptVideoOptions | None = None,
    export_options: ExportOptions | None = None,
    work_dir: Path | None = None,
) -> ConceptVideoBuild:
    """Export ``video_model`` and write its graphs and ``sam3_concept_video`` into ``repo``.

    Args:
        repo: the model repository (created; other models in it stay).
        video_model: a ``Sam3VideoModel`` in eval mode.
        tokenizer: its detector's CLIP tokenizer (``Sam3Processor.tokenizer``).
        options: target and bounds of the graphs; serving: the model's bounds.
        export_options: as the families' exporters take them.
        work_dir: where the export is kept (default: a scratch directory, removed).
    """
    from triton_sam.export.sam3_concept_video import export_concept_video, export_shared_vision

    options = options or RepositoryOptions()
    with tempfile.TemporaryDirectory(prefix="concept_video_") as scratch:
        out = Path(work_dir) if work_dir is not None else Path(scratch)
        export = export_concept_video(video_model, out, tokenizer, export_options)
        export_shared_vision(video_model, export, export_options)
        models = write_concept_video_models(repo, export, options, serving)
    return ConceptVideoBuild(models, export)


def load_checkpoint(checkpoint: Path) -> tuple[Any, Any]:
    """(``Sam3VideoModel`` in eval mode, its tokenizer) from a Hugging Face model directory
    (the facebook/sam3 snapshot).

    Raises:
        CheckpointError: not a directory transformers reads as a ``Sam3VideoModel``.
    """
    from transformers import Sam3Processor, Sam3VideoModel

    path = Path(checkpoint)
    if not path.is_dir():
        raise CheckpointError(
            f"checkpoint: {path} is not a directory; expected a Hugging Face model directory "
            "holding a Sam3VideoModel (the facebook/sam3 snapshot)"
        )
    try:
        model = Sam3VideoModel.from_pretrained(path).eval()
        tokenizer = Sam3Processor.from_pretrained(path).tokenizer
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"checkpoint: {path} is not a Sam3VideoModel directory ({e})") from e
    return model, tokenizer
