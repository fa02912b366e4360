"""Entry models: our encoders under another client's model name and pixel contract.

A client we do not write (Paintera, through sam-link) sends pixels already scaled to a range
(``u8 * ((hi - lo) / 255) + lo``, float32, NCHW) to an encoder it names itself. An entry model
is a Triton ensemble in front of our encoder: a tiny ONNX graph that maps those pixels to what
our encoder takes (the family's mean/std normalisation), then our encoder itself, so no
weights are loaded twice. When the client's range already is our encoder's input (the SAM3
tracker's [-1, 1]), the ensemble has the encoder as its only step: a rename.

Layout written per entry model::

    <repo>/<entry>/config.pbtxt                  platform "ensemble", an empty 1/
    <repo>/<entry>_pixels/{config.pbtxt, 1/model.onnx}   the normalising graph (if needed)
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from triton_sam.errors import RepositoryError
from triton_sam.models.naming import ENSEMBLE_PLATFORM

if TYPE_CHECKING:  # the writer imports this module's callers; no cycle at run time
    from triton_sam.repository.writer import ModelFiles
from triton_sam.models.spec import FamilySpec, GraphSpec, TensorSpec
from triton_sam.repository.checks import check_model_name
from triton_sam.repository.config import (
    ModelConfig,
    RepositoryOptions,
    config_to_text,
    graph_config,
    model_config_pb2,
    tensor_message,
)

PIXELS_SUFFIX = "_pixels"  # the entry's normalising graph
_NORMALIZED_TENSOR = "normalized_pixels"  # the ensemble's internal tensor between its steps


@dataclass(frozen=True)
class EntrySpec:
    """One entry model's contract, as the other client sends it.

    Attributes:
        name: the model name the client asks for.
        input_name: its one input tensor (float32 [B, 3, S, S], S the family's image size).
        pixel_range: ``(lo, hi)``: uint8 0 maps to lo and 255 to hi.
        output_names: encoder output name -> the name the client reads (same when absent).
    """

    name: str
    input_name: str
    pixel_range: tuple[float, float]
    output_names: tuple[tuple[str, str], ...] = ()


def affine(family: FamilySpec, pixel_range: tuple[float, float]) -> tuple[float, float] | None:
    """``(lo, k)`` such that our encoder's input is ``((x - lo) * k - mean) / std`` for a client
    pixel ``x``, or None when that map is the identity for every channel (a rename suffices).

    Upstream normalises ``u8 * pixel_scale``; the client sends ``x = u8 * (hi - lo) / 255 + lo``,
    so ``u8 * pixel_scale = (x - lo) * k`` with ``k = 255 * pixel_scale / (hi - lo)``.
    """
    lo, hi = pixel_range
    if not hi > lo:
        raise RepositoryError(f"pixel_range: got {pixel_range}, expected lo < hi")
    pre = family.preprocessing
    k = 255.0 * pre.pixel_scale / (hi - lo)
    identity = all(
        abs(k / s - 1.0) < 1e-9 and abs((-lo * k - m) / s) < 1e-9
        for m, s in zip(pre.pixel_mean, pre.pixel_std, strict=True)
    )
    return None if identity else (lo, k)


def normalizer_onnx(
    path: Path, family: FamilySpec, pixel_range: tuple[float, float], input_name: str
) -> Path:
    """Write the graph ``normalized = ((x - lo) * k - mean) / std`` (per channel, float32,
    [batch, 3, S, S] in and out) to ``path``.

    The operations are upstream's in upstream's order (scale, subtract the mean, divide by the
    std), so the result differs from the official predictor's input by float rounding only.

    Raises:
        RepositoryError: the map is the identity (write no graph then; see :func:`affine`).
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    coeffs = affine(family, pixel_range)
    if coeffs is None:
        raise RepositoryError(f"{family.family}: {pixel_range} is the encoder's input already")
    lo, k = coeffs
    size = family.preprocessing.image_size
    pre = family.preprocessing

    def const(name: str, values: object) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(values, np.float32), name)

    channel = (1, 3, 1, 1)
    initializers = [
        const("lo", lo),
        const("k", k),
        const("mean", np.reshape(pre.pixel_mean, channel)),
        const("std", np.reshape(pre.pixel_std, channel)),
    ]
    nodes = [
        helper.make_node("Sub", [input_name, "lo"], ["shifted"]),
        helper.make_node("Mul", ["shifted", "k"], ["scaled"]),
        helper.make_node("Sub", ["scaled", "mean"], ["centred"]),
        helper.make_node("Div", ["centred", "std"], [_NORMALIZED_TENSOR]),
    ]
    shape = ["batch", 3, size, size]
    graph = helper.make_graph(
        nodes,
        "entry_normalizer",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(_NORMALIZED_TENSOR, TensorProto.FLOAT, shape)],
        initializers,
    )
    # IR 8 / opset 17: loadable by the onnxruntime of every Triton release we serve with.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def normalizer_config(
    entry: EntrySpec, family: FamilySpec, options: RepositoryOptions
) -> ModelConfig:
    """The normalising graph's model config: served like the encoder (same batch size, queue
    bounds and instance kind), so the ensemble never asks it for more than the encoder takes."""
    pixels = _pixels_tensor(entry, family)
    graph = GraphSpec(
        "normalizer",
        entry.name + PIXELS_SUFFIX,
        (pixels,),
        (TensorSpec(_NORMALIZED_TENSOR, "float32", pixels.shape),),
        "encoder",
    )
    return graph_config(graph, options)


def ensemble_config(
    entry: EntrySpec,
    family: FamilySpec,
    encoder: ModelConfig,
    normalizer: ModelConfig | None,
) -> ModelConfig:
    """The entry ensemble: ``normalizer`` (if any), then ``encoder``, outputs renamed per
    ``entry.output_names``.

    Args:
        encoder: our encoder's config (its name, inputs, outputs and ``max_batch_size``).
        normalizer: the normalising graph's config, or None for a rename.

    Raises:
        InputValidationError: a bad entry name.
        RepositoryError: the encoder does not take one input.
    """
    check_model_name(entry.name)
    if len(encoder.input) != 1:
        raise RepositoryError(
            f"{encoder.name}: an entry model feeds one input, the encoder has "
            f"{[t.name for t in encoder.input]}"
        )
    config = ModelConfig(
        name=entry.name, platform=ENSEMBLE_PLATFORM, max_batch_size=encoder.max_batch_size
    )
    config.input.append(tensor_message(_pixels_tensor(entry, family), model_config_pb2.ModelInput))
    rename = dict(entry.output_names)
    for out in encoder.output:
        public = model_config_pb2.ModelOutput()
        public.CopyFrom(out)
        public.name = rename.get(out.name, out.name)
        config.output.append(public)
    steps = config.ensemble_scheduling.step
    encoder_input = encoder.input[0].name
    if normalizer is None:
        fed = entry.input_name
    else:
        step = steps.add(model_name=normalizer.name, model_version=-1)
        step.input_map[normalizer.input[0].name] = entry.input_name
        step.output_map[normalizer.output[0].name] = _NORMALIZED_TENSOR
        fed = _NORMALIZED_TENSOR
    step = steps.add(model_name=encoder.name, model_version=-1)
    step.input_map[encoder_input] = fed
    for out in encoder.output:
        step.output_map[out.name] = rename.get(out.name, out.name)
    return config


def entry_configs(
    entry: EntrySpec,
    family: FamilySpec,
    encoder: ModelConfig,
    options: RepositoryOptions,
) -> tuple[ModelConfig, ModelConfig | None]:
    """The entry ensemble and its normalising graph's config (None when a rename)."""
    normalizer = None
    if affine(family, entry.pixel_range) is not None:
        normalizer = normalizer_config(entry, family, options)
    return ensemble_config(entry, family, encoder, normalizer), normalizer


def entry_artifacts(
    entry: EntrySpec,
    family: FamilySpec,
    encoder: ModelConfig,
    options: RepositoryOptions,
    work_dir: Path,
) -> list[ModelFiles]:
    """The models of one entry (``writer.ModelFiles``): the ensemble and, when the pixel
    contracts differ, its normalising graph (written into ``work_dir`` first).

    Raises:
        RepositoryError / InputValidationError: as :func:`ensemble_config` and the writer.
    """
    from triton_sam.repository.artifacts import onnx_artifact
    from triton_sam.repository.writer import ModelFiles

    ensemble, normalizer = entry_configs(entry, family, encoder, options)
    models = [ModelFiles(ensemble.name, config_to_text(ensemble), {})]
    if normalizer is not None:
        graph = Path(tempfile.mkdtemp(prefix="entry-", dir=work_dir)) / "model.onnx"
        normalizer_onnx(graph, family, entry.pixel_range, normalizer.input[0].name)
        models.append(onnx_artifact(normalizer, graph, target=options.target))
    return models


def _pixels_tensor(entry: EntrySpec, family: FamilySpec) -> TensorSpec:
    size = family.preprocessing.image_size
    return TensorSpec(entry.input_name, "float32", (3, size, size))
