"""The Paintera bundle: our encoders behind the model names and pixel contracts Paintera uses.

Paintera (saalfeldlab/paintera) encodes on a Triton server through saalfeldlab/sam-link 1.0.0
and decodes locally with the ONNX decoders sam-link bundles (SAM1 ViT-H, SAM2.1 Hiera-L, the
SAM3 tracker). What it sends (sam-link ``encode/triton/Sam{1,2,3Tracker}TritonEncoder.kt``,
``encode/EncodeHelper.kt``, ``models/SamModels.kt``): one float32 NCHW image, longest side
scaled to the encoder's size and padded black at the bottom/right, pixels
``u8 * ((hi - lo) / 255) + lo``:

=============================  ===============  ==========  ===================================
model (Paintera's default)     input            range       outputs read
=============================  ===============  ==========  ===================================
``sam1_encoder``               ``image``        [0, 1]      ``image_embeddings``
``sam2.1_large_encoder``       ``image``        [0, 1]      ``image_embed``, ``high_res_feats_0/1``
``sam3_tracker_encoder_fp16``  ``pixel_values``  [-1, 1]     ``image_embeddings.0/.1/.2``
=============================  ===============  ==========  ===================================

Each is an entry model (:mod:`triton_sam.repository.entry`) in front of our encoder of that
family, written by the ordinary pipeline. ``sam1_encoder`` is our own SAM1 encoder's default
name too: in this bundle the entry takes it and our encoder is written as
``sam1_encoder_normalized`` (:func:`~triton_sam.models.naming.normalized_name`), which
the ``sam1_session`` model and our clients use instead (``flow.connect`` finds the entry by
its ``ensemble`` platform).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from triton_sam.errors import InputValidationError
from triton_sam.models.naming import normalized_name
from triton_sam.models.spec import ModelSpec
from triton_sam.repository.entry import EntrySpec, entry_artifacts

FAMILIES = ("sam1", "sam2", "sam3")
# The variants whose encoders match the decoders sam-link bundles (ViT-H, Hiera-L, tracker).
DEFAULT_VARIANTS: Mapping[str, str] = {
    "sam1": "sam1_vit_h",
    "sam2": "sam2.1_hiera_large",
    "sam3": "sam3_tracker",
}
ENTRIES: Mapping[str, EntrySpec] = {
    "sam1": EntrySpec("sam1_encoder", "image", (0.0, 1.0)),
    "sam2": EntrySpec("sam2.1_large_encoder", "image", (0.0, 1.0)),
    "sam3": EntrySpec("sam3_tracker_encoder_fp16", "pixel_values", (-1.0, 1.0)),
}


@dataclass(frozen=True)
class PainteraFamily:
    """What one family of the bundle wrote: the pipeline's build and the entry's models."""

    build: Any  # pipeline.RepositoryBuild
    entry_models: tuple[str, ...]


def bundle_spec(spec: ModelSpec) -> ModelSpec:
    """``spec`` with its encoder renamed where the entry model takes its name (SAM1)."""
    family = spec.family
    entry = ENTRIES.get(family.family)
    if entry is None:
        raise InputValidationError(
            "model", f"Paintera has entry models for {list(FAMILIES)}, got {spec.name!r}"
        )
    if entry.name == family.encoder_model:
        family = replace(family, encoder_model=normalized_name(family.encoder_model))
        spec = replace(spec, family=family)
    return spec


def build_paintera_family(spec: ModelSpec, repository: Path, **build_args: Any) -> PainteraFamily:
    """Write ``spec``'s models (:func:`~triton_sam.setup.pipeline.build_repository`, with the
    encoder renamed per :func:`bundle_spec`) and its Paintera entry model.

    Args:
        spec: a SAM1, SAM2.1 or SAM3 tracker variant (any size: small ones for tests).
        repository: the model repository.
        build_args: :func:`~triton_sam.setup.pipeline.build_repository`'s keyword arguments.

    Raises:
        InputValidationError: a family Paintera has no entry for.
        ExportError / RepositoryError: from the pipeline and the writer.
    """
    from triton_sam.repository.config import RepositoryOptions, parse_config
    from triton_sam.repository.writer import CONFIG_FILENAME, write_models
    from triton_sam.setup.pipeline import build_repository

    spec = bundle_spec(spec)
    build = build_repository(spec, repository, **build_args)
    encoder = parse_config((repository / build.models[0] / CONFIG_FILENAME).read_text())
    options = build_args.get("repository_options") or RepositoryOptions()
    scratch = Path(tempfile.mkdtemp(prefix=".paintera-", dir=repository.resolve().parent))
    try:
        models = entry_artifacts(
            ENTRIES[spec.family.family], spec.family, encoder, options, scratch
        )
        write_models(repository, models)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return PainteraFamily(build, tuple(m.name for m in models))


def build_paintera_repository(
    repository: Path,
    *,
    variants: Mapping[str, str] | None = None,
    checkpoints: Mapping[str, Path | None] | None = None,
    random_init: bool = False,
    checkpoints_dir: Path = Path("checkpoints"),
    download: bool = True,
    **build_args: Any,
) -> dict[str, PainteraFamily]:
    """Write the whole bundle (one family after the other) from a notebook or a test.

    Args:
        variants: family -> variant (default :data:`DEFAULT_VARIANTS`; a family left out
            of a given mapping is not written).
        checkpoints: family -> checkpoint file or (SAM3) directory; missing ones are
            downloaded when ``download``, unless ``random_init``.
        random_init: random weights for the families without a checkpoint.
        build_args: further :func:`~triton_sam.setup.pipeline.build_repository` arguments.
    """
    from triton_sam.models.registry import get_model
    from triton_sam.setup.pipeline import obtain_checkpoint

    variants = DEFAULT_VARIANTS if variants is None else variants
    checkpoints = checkpoints or {}
    out = {}
    for family, variant in variants.items():
        spec = get_model(variant)
        given = checkpoints.get(family)
        ckpt = None
        if given is not None or not random_init:
            ckpt = obtain_checkpoint(
                spec, checkpoint=given, checkpoints_dir=checkpoints_dir, download=download
            )
        out[family] = build_paintera_family(
            spec,
            repository,
            checkpoint=ckpt,
            random_init=ckpt is None,
            checkpoints_dir=checkpoints_dir,
            **build_args,
        )
    return out
