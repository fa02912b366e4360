"""The ``<family>_session`` model's ``config.pbtxt``, rendered from the family spec, and its writer.

The session model (``serving/embedding_cache_model.py``, deployed as ``1/model.py``) is a
python-backend BLS model in BOTH targets: in the GPU container it calls the
onnxruntime-backend encoder/decoder, in the embedded server the runner_model.py ones. Its
tensors come from the spec:

- inputs: ``image_id`` (BYTES), ``image_bytes`` (BYTES: an encoded image file),
  ``image_rgb`` (UINT8 [H, W, 3]), then every encoder input, every decoder input that is not an
  encoder output (the prompts), and the control inputs ``logits_key``, ``previous_key``
  (BYTES) and ``previous_mask_index`` (INT32); all but ``image_id`` are ``optional`` so a click
  carries only the id and its prompt tensors (a few hundred bytes);
- outputs: every decoder output, plus ``encoded`` (INT32: 1 = the encoder ran, 0 = cached)
  and ``image_id`` (BYTES: the id the server computed from the image it received).

Its bounds (``triton_sam.serving.bounds``) and the family's preprocessing are parameters.

One instance, always (the cache lives in it; see serving/embedding_cache_model.py):
``KIND_GPU`` pinned to GPU 0 when the encoder runs on GPUs (features stay in device memory),
else ``KIND_CPU``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from triton_sam.errors import InputValidationError
from triton_sam.models.spec import FamilySpec, TensorSpec
from triton_sam.repository.config import (
    ModelConfig,
    RepositoryOptions,
    _check_int,
    _tensor,
    check_model_name,
    config_to_text,
    model_config_pb2,
)
from triton_sam.serving import bounds, intake

# writer.py imports this module, so its SERVING_DIR / shipped_modules are imported lazily.
SESSION_SOURCE = Path(__file__).resolve().parent.parent / "serving" / "embedding_cache_model.py"
# The dependency-free modules embedding_cache_model.py imports (shipped as ``triton_sam_serving``).
SHIPPED_MODULES = ("__init__", "bounds", "images", "intake", "masks", "prompt_frame", "resample")
# Prompts in original pixels and finished masks (point_list decoders: SAM1, SAM2.1).
PIXEL_INPUTS = (
    TensorSpec("points", "float32", (-1, 2)),
    TensorSpec("labels", "int32", (-1,)),
    TensorSpec("box", "float32", (4,)),
    TensorSpec("multimask_output", "int32", (1,)),
)
FINISHED_OUTPUTS = (
    TensorSpec("mask_boxes", "float32", (-1, 4)),
    TensorSpec("mask_scores", "float32", (-1,)),
    TensorSpec("image_size", "int32", (2,)),
)
ENCODED_MASK_OUTPUTS = ("masks_rle", "masks_png", "masks_bits")
IMAGE_BYTES = "image_bytes"
IMAGE_RGB = "image_rgb"
IMAGE_ID = "image_id"
ENCODED = "encoded"
LOGITS_KEY = "logits_key"
PREVIOUS_KEY = "previous_key"
PREVIOUS_MASK_INDEX = "previous_mask_index"
# Config ``parameters`` read by embedding_cache_model.py (it cannot import this module; a unit test
# keeps both equal).
PARAM_KEYS = (
    "encoder_model",
    "decoder_model",
    "encoder_inputs",
    "embedding_names",
    "embedding_bytes",
    "max_images",
    "max_bytes",
    "logits_per_image",
    "low_res_logit_limit",
    "preprocessing",
    "max_points",
    "max_boxes",
    "max_image_pixels",
    "max_image_bytes",
    "box_before_points",
    "pad_with_box",
)


@dataclass(frozen=True)
class SessionOptions:
    """Bounds of the server-side feature cache.

    Attributes:
        max_images: images whose features are kept (LRU beyond). SAM2 keeps 16 MiB per image
            (fp32, with the high-resolution features), SAM1 4 MiB, the SAM3 tracker ~21 MiB.
        max_bytes: bound on features + kept logits in bytes (0 = only ``max_images``).
        logits_per_image: low-res logits kept per image for refinement without resending
            them (the most recent predictions that asked to keep them).
        max_points / max_boxes / max_image_pixels / max_image_bytes: the request bounds the
            server enforces (defaults and reasons in :mod:`triton_sam.serving.bounds`).
    """

    max_images: int = 16
    max_bytes: int = 2 * 2**30
    logits_per_image: int = 4
    max_points: int = bounds.MAX_POINTS
    max_boxes: int = bounds.MAX_BOXES
    max_image_pixels: int = bounds.MAX_IMAGE_PIXELS
    max_image_bytes: int = bounds.MAX_IMAGE_BYTES

    def __post_init__(self) -> None:
        _check_int("max_images", self.max_images, minimum=1)
        _check_int("max_bytes", self.max_bytes, minimum=0)
        _check_int("logits_per_image", self.logits_per_image, minimum=0)
        _check_int("max_points", self.max_points, minimum=1)
        _check_int("max_boxes", self.max_boxes, minimum=0)
        _check_int("max_image_pixels", self.max_image_pixels, minimum=1)
        _check_int("max_image_bytes", self.max_image_bytes, minimum=1)


def embedding_bytes(family: FamilySpec) -> int:
    """Bytes of one image's encoder outputs (batch 1), as the session model keeps them."""
    total = 0
    for t in family.encoder_outputs:
        if any(d < 0 for d in t.shape):
            raise InputValidationError(
                "encoder_outputs", f"{t.name} has a variable dim {t.shape}; expected fixed dims"
            )
        total += math.prod(t.shape) * np.dtype(t.dtype).itemsize
    return total


def build_session_config(
    family: FamilySpec,
    options: RepositoryOptions,
    session: SessionOptions | None = None,
    *,
    name: str | None = None,
    encoder_model: str | None = None,
    decoder_model: str | None = None,
) -> ModelConfig:
    """Build the ``<family>_session`` model config as a protobuf message.

    Args:
        family: the family spec (tensor names, dtypes and shapes).
        options: the repository's options: target (instance kind), ``decoder_max_batch_size``
            (requests per ``execute``) and ``max_queue_delay_us``.
        session: cache bounds.
        name: model name (default ``family.session_model``).
        encoder_model / decoder_model: the models called through BLS (default the family's).

    Raises:
        InputValidationError: a bad name or an unsupported dtype in the spec.
    """
    session = session or SessionOptions()
    name = name or family.session_model
    check_model_name(name)
    config = ModelConfig(name=name, backend="python", max_batch_size=options.decoder_max_batch_size)
    config.input.append(_optional(_string_input(IMAGE_ID)))
    config.input.append(_optional(_string_input(IMAGE_BYTES)))
    rgb = _tensor(TensorSpec(IMAGE_RGB, "uint8", (-1, -1, 3)), model_config_pb2.ModelInput)
    config.input.append(_optional(rgb))
    for spec in (*family.encoder_inputs, *_prompt_inputs(family)):
        config.input.append(_optional(_tensor(spec, model_config_pb2.ModelInput)))
    config.input.extend(_optional(_string_input(n)) for n in (LOGITS_KEY, PREVIOUS_KEY))
    pixel_prompts = family.prompt_layout == "point_list"
    if pixel_prompts:
        config.input.extend(
            _optional(_tensor(t, model_config_pb2.ModelInput)) for t in PIXEL_INPUTS
        )
    index = _tensor(TensorSpec(PREVIOUS_MASK_INDEX, "int32", (1,)), model_config_pb2.ModelInput)
    config.input.append(_optional(index))
    outputs = (*family.decoder_outputs, TensorSpec(ENCODED, "int32", (1,)))
    config.output.extend(_tensor(t, model_config_pb2.ModelOutput) for t in outputs)
    config.output.append(
        model_config_pb2.ModelOutput(
            name=IMAGE_ID, data_type=model_config_pb2.TYPE_STRING, dims=[1]
        )
    )
    if pixel_prompts:
        config.output.extend(
            model_config_pb2.ModelOutput(name=n, data_type=model_config_pb2.TYPE_STRING, dims=[-1])
            for n in ENCODED_MASK_OUTPUTS
        )
        config.output.extend(_tensor(t, model_config_pb2.ModelOutput) for t in FINISHED_OUTPUTS)
    group = config.instance_group.add(count=1)
    if options.kind == "gpu":
        group.kind = model_config_pb2.ModelInstanceGroup.KIND_GPU
        group.gpus.append(0)  # one instance in total, not one per GPU: one cache
    else:
        group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU
    # Several queued requests reach one execute (their BLS calls then overlap), and a request
    # cancelled while queued is dropped, as for the decoder.
    config.dynamic_batching.max_queue_delay_microseconds = options.max_queue_delay_us
    limit = family.preprocessing.low_res_logit_limit
    params = {
        "encoder_model": encoder_model or family.encoder_model,
        "decoder_model": decoder_model or family.decoder_model,
        "encoder_inputs": ",".join(t.name for t in family.encoder_inputs),
        "embedding_names": ",".join(family.embedding_names),
        "embedding_bytes": str(embedding_bytes(family)),
        "max_images": str(session.max_images),
        "max_bytes": str(session.max_bytes),
        "logits_per_image": str(session.logits_per_image),
        "low_res_logit_limit": "" if limit is None else repr(float(limit)),
        "preprocessing": intake.preprocessing_json(family.preprocessing),
        "max_points": str(session.max_points),
        "max_boxes": str(session.max_boxes),
        "max_image_pixels": str(session.max_image_pixels),
        "max_image_bytes": str(session.max_image_bytes),
        "box_before_points": str(family.box_before_points).lower(),
        "pad_with_box": str(family.pad_with_box).lower(),
    }
    for key, value in params.items():
        config.parameters[key].string_value = value
    return config


def render_session_config(
    family: FamilySpec, options: RepositoryOptions, session: SessionOptions | None = None
) -> str:
    """``config.pbtxt`` text of the family's session model; see :func:`build_session_config`."""
    return config_to_text(build_session_config(family, options, session))


def is_session_config(config: ModelConfig) -> bool:
    """True for a session model's config (python backend, BLS parameters, no ONNX file)."""
    return config.backend == "python" and "embedding_names" in config.parameters


def session_twin(config: ModelConfig) -> ModelConfig:
    """The embedded (CPU) twin of a session config: same tensors and bounds, ``KIND_CPU``."""
    twin = ModelConfig()
    twin.CopyFrom(config)
    del twin.instance_group[:]
    twin.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    return twin


def write_session(
    repo_dir: str | os.PathLike[str],
    family: FamilySpec,
    options: RepositoryOptions,
    session: SessionOptions | None = None,
) -> str:
    """Write ``<repo>/<family>_session/{config.pbtxt, 1/model.py}`` atomically; returns the name.

    Raises:
        RepositoryError / InputValidationError: as ``writer.write_model``.
    """
    from triton_sam.repository.writer import ModelFiles, write_models

    config = build_session_config(family, options, session)
    write_models(repo_dir, [ModelFiles(config.name, config_to_text(config), session_files())])
    return config.name


def session_files() -> dict[str, Path]:
    """What goes into the session model's version directory: ``model.py`` and the package."""
    from triton_sam.repository.writer import shipped_modules

    return {"model.py": SESSION_SOURCE} | shipped_modules(SHIPPED_MODULES)


def _prompt_inputs(family: FamilySpec) -> tuple[TensorSpec, ...]:
    embeddings = set(family.embedding_names)
    return tuple(t for t in family.decoder_inputs if t.name not in embeddings)


def _string_input(name: str) -> model_config_pb2.ModelInput:
    # BYTES tensors ([1] per item): Triton's TYPE_STRING, numpy object arrays of bytes.
    return model_config_pb2.ModelInput(name=name, data_type=model_config_pb2.TYPE_STRING, dims=[1])


def _optional(message: model_config_pb2.ModelInput) -> model_config_pb2.ModelInput:
    message.optional = True
    return message
