"""The ``<family>_everything_decoder`` model: config and files (SAM1, SAM2.1).

The graph (``export/everything.py``) takes one crop's features (batch 1) and a batch of P
single-point prompts, and returns only the K masks that survive the filters: every tensor
has its own shape (features [1, ...], points [P, 2], cut-offs [1], ``crop_hw`` [2], masks
[K, H, W]), so there is no common first dim for Triton to batch on: ``max_batch_size`` 0,
full shapes in the config, one request = one graph run. Its caller is the served
``<family>_everything`` model (BLS, one batch at a time), so it gets no dynamic batcher (a
cancelled job stops between batches in that model; nothing waits in this one's queue).

Production: onnxruntime (GPU instance, no TensorRT: the graph's data-dependent shapes, from
the filters, are what TensorRT's engines cannot hold); the embedded server serves its CPU
twin like every other graph (``embedded.embedded_twin``).
"""

from __future__ import annotations

import os

from tritonclient.grpc import model_config_pb2

from triton_sam.errors import InputValidationError
from triton_sam.models.spec import FamilySpec, TensorSpec
from triton_sam.repository.artifacts import onnx_artifact
from triton_sam.repository.checks import check_model_name
from triton_sam.repository.config import (
    _KINDS,
    ModelConfig,
    RepositoryOptions,
    _set_onnxruntime,
    _set_python,
    tensor_message,
)
from triton_sam.repository.cpu_twin import ARENA_SHRINKAGE_PARAM, CPU_ARENA_SHRINKAGE
from triton_sam.repository.writer import ModelFiles
from triton_sam.serving import everything as ev

FAMILIES = ev.FAMILIES


def contract(family: FamilySpec) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """(inputs, outputs) of the family's everything-decoder, full shapes (no batch dim).

    Raises:
        InputValidationError: (``family``) not SAM1 / SAM2.1.
    """
    if family.family not in FAMILIES:
        raise InputValidationError(
            "family", f"got {family.family!r}; segment everything exists for {list(FAMILIES)}"
        )
    features = tuple(TensorSpec(t.name, t.dtype, (1, *t.shape)) for t in family.encoder_outputs)
    scalar = {
        ev.IN_POINTS: ("float64", (-1, 2)),
        ev.IN_CROP_HW: ("int64", (2,)),
        ev.IN_MULTIMASK: ("bool", (1,)),
        ev.IN_USE_M2M: ("bool", (1,)),
    }
    inputs = features + tuple(
        TensorSpec(name, *scalar.get(name, ("float32", (1,)))) for name in ev.GRAPH_INPUTS
    )
    outputs = (
        TensorSpec(ev.OUT_MASKS, "bool", (-1, -1, -1)),
        TensorSpec(ev.OUT_IOU, "float32", (-1,)),
        TensorSpec(ev.OUT_STABILITY, "float32", (-1,)),
        TensorSpec(ev.OUT_BOXES, "int64", (-1, 4)),
        TensorSpec(ev.OUT_PROMPT_INDEX, "int64", (-1,)),
    )
    return inputs, outputs


def everything_decoder_config(
    family: FamilySpec, options: RepositoryOptions, *, name: str | None = None
) -> ModelConfig:
    """The production config (``options.target``; TensorRT never, see the module docstring)."""
    name = name or ev.graph_name(family.family)
    check_model_name(name)
    inputs, outputs = contract(family)
    config = ModelConfig(name=name, max_batch_size=0)
    config.input.extend(tensor_message(t, model_config_pb2.ModelInput) for t in inputs)
    config.output.extend(tensor_message(t, model_config_pb2.ModelOutput) for t in outputs)
    config.instance_group.add(kind=_KINDS[options.kind], count=options.instance_count)
    if options.target == "onnxruntime":
        _set_onnxruntime(config, options)
        config.optimization.ClearField("execution_accelerators")
        config.ClearField("optimization")
        # A job's batches upsample P x 3 masks to the crop's size (hundreds of MB on a CPU),
        # and between jobs the model idles: the CPU arena gives that memory back after each
        # run rather than holding a job's peak for good (the CPU twin keeps the parameter).
        config.parameters[ARENA_SHRINKAGE_PARAM].string_value = CPU_ARENA_SHRINKAGE
    else:
        _set_python(config, options)
    return config


def everything_decoder_artifact(
    family: FamilySpec,
    onnx_path: str | os.PathLike[str],
    options: RepositoryOptions,
    *,
    name: str | None = None,
) -> ModelFiles:
    """The model to hand to ``writer.write_models`` beside the family's pair."""
    config = everything_decoder_config(family, options, name=name)
    return onnx_artifact(config, onnx_path, target=options.target)
