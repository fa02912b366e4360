"""The models the user benchmark serves: exported once (verified weights, else seeded random
ones beside the export), their embedded repositories, and the encoder export variants with
their agreement with the fp32 encoder.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from triton_sam.models.spec import ModelSpec

# Encoder export variants the bench can build from the fp32 export (label -> the tolerance
# its agreement with the fp32 encoder is judged by: the one the export check uses for it).
BASE_VARIANT = "fp32"
ENCODER_VARIANTS = ("fp32", "fused", "int8")


@dataclass(frozen=True)
class ServedModel:
    """One model ready to benchmark.

    Attributes:
        spec: the variant.
        checkpoint: the weights the ONNX files were exported from (the official predictor
            loads the same file).
        repository: the embedded server's repository (onnxruntime backend twins).
        runner_repository: its python-runner twins, or None to skip that row.
        encoder_variants: label (``fused``, ``int8``) -> an embedded repository identical
            to ``repository`` but for that encoder export variant.
        skipped_variants: label -> why this model has no such variant (e.g. no attention
            fusion for its family).
    """

    spec: ModelSpec
    checkpoint: Path
    repository: Path
    runner_repository: Path | None = None
    encoder_variants: Mapping[str, Path] = field(default_factory=dict)
    skipped_variants: Mapping[str, str] = field(default_factory=dict)


def prepare_model(
    name: str,
    work_dir: Path,
    *,
    checkpoints_dir: Path = Path("checkpoints"),
    runner: bool = True,
    encoder_variants: Sequence[str] = (),
) -> ServedModel:
    """Export ``name`` once into ``work_dir/<name>`` (reused when its build finished before)
    and write its embedded repositories.

    Weights: the verified checkpoint in ``checkpoints_dir`` when there is one, else a seeded
    random initialisation of the official config written beside the export (for the SAM3
    tracker the small config of :func:`triton_sam.export.sam3.small_config`: the real
    1008/288 tensor contract with a 2-layer ViT), so the official predictor and the ONNX
    files share their weights.

    ``encoder_variants`` (besides ``fp32``, the export itself): see
    :func:`prepare_encoder_variant`; a variant the family has no rewrite for is recorded in
    ``skipped_variants`` instead of failing the run.
    """
    from triton_sam.bench.harness import setup_repository
    from triton_sam.errors import ExportError
    from triton_sam.models import get_model
    from triton_sam.repository.writer import embedded_repository
    from triton_sam.setup.pipeline import obtain_checkpoint

    unknown = set(encoder_variants) - set(ENCODER_VARIANTS)
    if unknown:
        from triton_sam.errors import InputValidationError

        raise InputValidationError(
            "encoder_variants", f"got {sorted(unknown)}, expected from {list(ENCODER_VARIANTS)}"
        )
    spec = get_model(name)
    root = work_dir / name
    checkpoint = _checkpoint(spec, root, checkpoints_dir)
    repo = root / "model_repository"
    done = root / "build.json"
    if not (done.is_file() and json.loads(done.read_text()).get("checkpoint") == str(checkpoint)):
        if repo.exists():
            shutil.rmtree(repo)
        checkpoint = obtain_checkpoint(
            spec, checkpoint=checkpoint, checkpoints_dir=checkpoints_dir, download=False
        )
        # its twins are written below, with this benchmark's choices
        setup_repository(
            spec, repo, checkpoint=checkpoint, twin=False, checkpoints_dir=checkpoints_dir
        )
        done.write_text(json.dumps({"checkpoint": str(checkpoint)}))
    # fp32: the graphs as exported; `triton-sam serve`'s default twin is the ``fused`` variant
    # where the family has an attention fusion (the same twin as the served path otherwise).
    served = embedded_repository(repo, root / "embedded", fuse_attention=False)
    runner_repo = embedded_repository(repo, root / "runner", target="python") if runner else None
    variants: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    for variant in dict.fromkeys(encoder_variants):
        if variant == BASE_VARIANT:
            continue
        try:
            variants[variant] = prepare_encoder_variant(spec, repo, root / variant, variant)
        except ExportError as e:
            skipped[variant] = str(e)
    return ServedModel(spec, checkpoint, served, runner_repo, variants, skipped)


def prepare_encoder_variant(spec: ModelSpec, repo: Path, root: Path, variant: str) -> Path:
    """An embedded repository like ``repo``'s but with the encoder rewritten as ``variant``.

    ``fused``: exactly what ``triton-sam serve`` serves by default (the CPU twin with fused
    attention, :mod:`~triton_sam.repository.cpu_graphs`). ``int8``: a copy of the fp32
    export's encoder through :func:`~triton_sam.export.optimize.quantize_int8` (the rewrite
    ``export.quantize=int8`` applies; no second torch export), every other model linked to
    ``repo``'s files, reused when ``root/variant.json`` names the same source encoder.

    Raises:
        ExportError: the family has no such rewrite (fused: see
            :func:`~triton_sam.export.optimize.has_attention_fusion`) or it failed.
    """
    from triton_sam.errors import ExportError
    from triton_sam.export import optimize
    from triton_sam.repository import cpu_graphs
    from triton_sam.repository.writer import (
        ModelFiles,
        embedded_repository,
        list_models,
        read_model,
        write_models,
    )

    encoder_name = spec.family.encoder_model
    if variant == "fused":
        if not optimize.has_attention_fusion(spec.family.family):
            raise ExportError(f"fuse_attention: no attention fusion for {spec.family.family!r}")
        served = embedded_repository(repo, root / "embedded")
        if not cpu_graphs.graph_family(served / encoder_name / "1" / "model.onnx")[1]:
            raise ExportError(f"{encoder_name}: attention fusion failed (see the log)")
        return served
    if variant != "int8":
        raise ValueError(f"variant {variant!r}: no encoder rewrite")
    source = (repo / encoder_name / "1" / "model.onnx").resolve()
    marker = root / "variant.json"
    stamp = {"variant": variant, "source": str(source), "mtime": source.stat().st_mtime}
    variant_repo = root / "model_repository"
    if not (marker.is_file() and json.loads(marker.read_text()) == stamp):
        if root.exists():
            shutil.rmtree(root)
        encoder_dir = root / "encoder"
        encoder_dir.mkdir(parents=True)
        models = [read_model(repo, name) for name in list_models(repo)]
        encoder = next(m for m in models if m.name == encoder_name)
        files = {}
        for rel, src in encoder.files.items():  # model.onnx and its .onnx_data sidecar
            dest = encoder_dir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(src).resolve(), dest)
            files[rel] = dest
        optimize.quantize_int8(encoder_dir / "model.onnx")
        models = [
            ModelFiles(m.name, m.config_text, files) if m.name == encoder_name else m
            for m in models
        ]
        write_models(variant_repo, models, link=True)
        marker.write_text(json.dumps(stamp))
    return embedded_repository(variant_repo, root / "embedded", fuse_attention=False)


def variant_tolerance(variant: str) -> Any:
    """The tolerance the export check uses for an encoder ``variant`` (see
    :mod:`triton_sam.export.optimize`): fp32's for fused attention (same math up to float
    reassociation), ``INT8_TOLERANCE`` for int8 weights."""
    from triton_sam.export import onnx_utils, optimize

    return optimize.INT8_TOLERANCE if variant == "int8" else onnx_utils.FP32_TOLERANCE


def _checkpoint(spec: ModelSpec, root: Path, checkpoints_dir: Path) -> Path:
    from triton_sam.errors import CheckpointError, IntegrityError
    from triton_sam.models.checkpoints import resolve_checkpoint

    if not spec.checkpoint.hf_repo:
        try:
            return resolve_checkpoint(spec.checkpoint, None, checkpoints_dir)
        except (CheckpointError, IntegrityError):
            pass
    root.mkdir(parents=True, exist_ok=True)
    if spec.family.family == "sam3":
        from triton_sam.export import sam3

        path = root / "random_small_sam3"
        if not path.exists():
            sam3.save_random_checkpoint(spec, path, seed=0, config=sam3.small_config())
        return path
    from triton_sam.export import save_random_checkpoint

    path = root / f"random_{spec.checkpoint.filename}"
    if not path.exists():
        save_random_checkpoint(spec, path, seed=0)
    return path


def encoder_agreement(
    reference: Path, variant: Path, model: ServedModel, image: np.ndarray, tolerance: Any
) -> dict[str, object]:
    """How far an encoder variant's outputs are from the fp32 encoder's on ``image``.

    Both encoders (``<repo>/<encoder>/1/model.onnx`` of the two embedded repositories) run
    in-process onnxruntime on the same preprocessed tensor. ``tolerance`` (an
    ``onnx_utils.Tolerance``) is the one the export check uses for that variant.

    Returns:
        ``{"max_abs": {output: float}, "tolerance": str, "within": bool}``;
        ``within``: every output is within ``tolerance`` (``Tolerance.mismatch``).
    """
    import onnxruntime as ort

    from triton_sam.client import model_frame

    family = model.spec.family
    tensor = model_frame.preprocess(image, family.preprocessing)
    names = list(family.embedding_names)
    outputs = []
    for repo in (reference, variant):
        path = (repo / family.encoder_model / "1" / "model.onnx").resolve()
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outputs.append(session.run(names, {family.encoder_inputs[0].name: tensor}))
        del session  # one encoder session alive at a time
    max_abs, within = {}, True
    for name, r, v in zip(names, *outputs, strict=True):
        max_abs[name] = float(np.max(np.abs(v - r)))
        within &= tolerance.mismatch(v, r) is None
    return {"max_abs": max_abs, "tolerance": tolerance.describe(), "within": within}
