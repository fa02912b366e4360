"""The ``<family>_session`` model's ``config.pbtxt``, rendered from the family spec, and its writer.

The session model (``serving/embedding_cache_model.py``, deployed as ``1/model.py``) is a
python-backend BLS model in BOTH targets: in the GPU container it calls the
onnxruntime-backend encoder/decoder, in the embedded server the runner_model.py ones. Its
tensors come from the spec:

- inputs: ``image_id`` (BYTES), ``image_bytes`` (BYTES: an encoded image file),
  ``image_rgb`` (UINT8 [H, W, 3]), then every encoder input, every decoder input that is not an
  encoder output (the prompts), and the control inputs ``previous_key`` (BYTES) and
  ``previous_mask_index`` (INT32); all but ``image_id`` are ``optional`` so a click carries
  only the id and its prompt tensors (a few hundred bytes). ``logits_key`` (BYTES) is declared
  as an input too, only so that the model refuses it with a typed error saying the server
  issues keys (Triton's own answer to an undeclared input names no reason);
- outputs: every decoder output, plus ``encoded`` (INT32: 1 = the encoder ran, 0 = cached),
  ``image_id`` (BYTES: the id the server computed from the image it received) and, when the
  decoder takes a mask and answers low-res logits, ``logits_key`` (BYTES: the key the server
  issued for the logits it kept, ``protocol.embedding_cache.keeps_logits``); point-list
  families also answer the finished masks and, last, the cached features (named as the
  encoder outputs) for an embed or probe that asks for them.

Its bounds (``triton_sam.serving.bounds``) and the family's preprocessing are parameters.

One instance, always (the cache lives in it; see serving/embedding_cache_model.py):
``KIND_GPU`` pinned to GPU 0 when the encoder runs on GPUs (features stay in device memory),
else ``KIND_CPU``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from triton_sam.errors import InputValidationError
from triton_sam.models.spec import FamilySpec, TensorSpec
from triton_sam.repository.config import (
    ModelConfig,
    RepositoryOptions,
    check_int,
    check_model_name,
    config_to_text,
    model_config_pb2,
    parse_config,
    tensor_message,
)
from triton_sam.repository.shipping import imported_modules
from triton_sam.repository.writer import (
    SERVING_DIR,
    ModelFiles,
    shipped_modules,
    write_models,
)
from triton_sam.serving import bounds, intake
from triton_sam.serving.protocol import embedding_cache as protocol
from triton_sam.serving.protocol.embedding_cache import (
    ENCODED,
    IMAGE_BYTES,
    IMAGE_ID,
    IMAGE_RGB,
    LOGITS_KEY,
    PREVIOUS_KEY,
    PREVIOUS_MASK_INDEX,
)

SESSION_SOURCE = SERVING_DIR / "embedding_cache_model.py"
# What the session model imports beside its model.py (triton_sam_serving/...).
SHIPPED_MODULES = imported_modules(SESSION_SOURCE)
# Prompts in original pixels and finished masks (point_list decoders: SAM1, SAM2.1).
PIXEL_INPUTS = (
    TensorSpec(protocol.POINTS, "float32", (-1, 2)),
    TensorSpec(protocol.LABELS, "int32", (-1,)),
    TensorSpec(protocol.BOX, "float32", (4,)),
    TensorSpec(protocol.MULTIMASK, "int32", (1,)),
)
FINISHED_OUTPUTS = (
    TensorSpec(protocol.MASK_BOXES, "float32", (-1, 4)),
    TensorSpec(protocol.MASK_SCORES, "float32", (-1,)),
    TensorSpec(protocol.IMAGE_SIZE, "int32", (2,)),
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
        cpu_features: on a CPU instance, where the cached features live: ``"process"``
            (the default: copied into the stub's memory, copied back into the shared-memory
            pool on every click) or ``"shared_memory"`` (the encoder's output tensors, kept
            in the python backend's shared-memory pool and passed to the decoder without a
            copy: -2.3 ms per SAM2 click, but the stub's resident memory under LRU churn is
            not yet shown to stay bounded). Measured in docs/cpu-performance.md.
        max_concurrent_embeds: images decoded, preprocessed and encoded at once (each holds
            its pixels, its encoder input and its features while it is in work; the encoder's
            memory grows with the batches it runs). The default fills one encoder batch on a
            GPU; the embedded (CPU) server lowers it (``writer.embedded_repository``).
        max_waiting_embeds: embeds that wait for a slot; one more is refused at once with
            the ``Overloaded`` answer (``ServerOverloadedError`` in the clients). Clicks never
            wait in this line.
    """

    max_images: int = protocol.DEFAULT_MAX_IMAGES
    max_bytes: int = protocol.DEFAULT_MAX_BYTES
    logits_per_image: int = protocol.DEFAULT_LOGITS_PER_IMAGE
    max_points: int = bounds.MAX_POINTS
    max_boxes: int = bounds.MAX_BOXES
    max_image_pixels: int = bounds.MAX_IMAGE_PIXELS
    max_image_bytes: int = bounds.MAX_IMAGE_BYTES
    cpu_features: str = protocol.CPU_FEATURES[0]
    max_concurrent_embeds: int = protocol.DEFAULT_MAX_CONCURRENT_EMBEDS
    max_waiting_embeds: int = protocol.DEFAULT_MAX_WAITING_EMBEDS

    def __post_init__(self) -> None:
        check_int("max_images", self.max_images, minimum=1)
        check_int("max_bytes", self.max_bytes, minimum=0)
        check_int("logits_per_image", self.logits_per_image, minimum=0)
        check_int("max_points", self.max_points, minimum=1)
        if self.max_points > bounds.GRAPH_MAX_POINTS:  # the decoder graph refuses more
            raise InputValidationError(
                "max_points",
                f"got {self.max_points}, expected at most {bounds.GRAPH_MAX_POINTS} (the "
                "exported decoders' own bound, serving.bounds.GRAPH_MAX_POINTS)",
            )
        check_int("max_boxes", self.max_boxes, minimum=0)
        check_int("max_image_pixels", self.max_image_pixels, minimum=1)
        check_int("max_image_bytes", self.max_image_bytes, minimum=1)
        check_int("max_concurrent_embeds", self.max_concurrent_embeds, minimum=1)
        check_int("max_waiting_embeds", self.max_waiting_embeds, minimum=0)
        if self.cpu_features not in protocol.CPU_FEATURES:
            raise InputValidationError(
                "cpu_features",
                f"got {self.cpu_features!r}, expected one of {list(protocol.CPU_FEATURES)}",
            )


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
    rgb = tensor_message(TensorSpec(IMAGE_RGB, "uint8", (-1, -1, 3)), model_config_pb2.ModelInput)
    config.input.append(_optional(rgb))
    for spec in (*family.encoder_inputs, *_prompt_inputs(family)):
        config.input.append(_optional(tensor_message(spec, model_config_pb2.ModelInput)))
    config.input.extend(_optional(_string_input(n)) for n in (LOGITS_KEY, PREVIOUS_KEY))
    pixel_prompts = family.prompt_layout == "point_list"
    if pixel_prompts:
        config.input.extend(
            _optional(tensor_message(t, model_config_pb2.ModelInput)) for t in PIXEL_INPUTS
        )
    index = tensor_message(
        TensorSpec(PREVIOUS_MASK_INDEX, "int32", (1,)), model_config_pb2.ModelInput
    )
    config.input.append(_optional(index))
    outputs = (*family.decoder_outputs, TensorSpec(ENCODED, "int32", (1,)))
    config.output.extend(tensor_message(t, model_config_pb2.ModelOutput) for t in outputs)
    config.output.append(
        model_config_pb2.ModelOutput(
            name=IMAGE_ID, data_type=model_config_pb2.TYPE_STRING, dims=[1]
        )
    )
    decoder_inputs = [t.name for t in family.decoder_inputs]
    if protocol.keeps_logits(decoder_inputs, [t.name for t in family.decoder_outputs]):
        config.output.append(
            model_config_pb2.ModelOutput(
                name=LOGITS_KEY, data_type=model_config_pb2.TYPE_STRING, dims=[1]
            )
        )
    if pixel_prompts:
        config.output.extend(
            model_config_pb2.ModelOutput(name=n, data_type=model_config_pb2.TYPE_STRING, dims=[-1])
            for n in protocol.ENCODED_MASK_OUTPUTS
        )
        config.output.extend(
            tensor_message(t, model_config_pb2.ModelOutput) for t in FINISHED_OUTPUTS
        )
        # The cached features, answered to an embed or probe that asks for them (the
        # everything model decodes its own prompt batches on them).
        config.output.extend(
            tensor_message(t, model_config_pb2.ModelOutput) for t in family.encoder_outputs
        )
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
        protocol.PARAM_KIND: protocol.KIND,
        protocol.PARAM_ENCODER_MODEL: encoder_model or family.encoder_model,
        protocol.PARAM_DECODER_MODEL: decoder_model or family.decoder_model,
        protocol.PARAM_ENCODER_INPUTS: ",".join(t.name for t in family.encoder_inputs),
        protocol.PARAM_EMBEDDING_NAMES: ",".join(family.embedding_names),
        protocol.PARAM_EMBEDDING_BYTES: str(embedding_bytes(family)),
        protocol.PARAM_MAX_IMAGES: str(session.max_images),
        protocol.PARAM_MAX_BYTES: str(session.max_bytes),
        protocol.PARAM_LOGITS_PER_IMAGE: str(session.logits_per_image),
        protocol.PARAM_LOW_RES_LOGIT_LIMIT: "" if limit is None else repr(float(limit)),
        protocol.PARAM_PREPROCESSING: intake.preprocessing_json(family.preprocessing),
        protocol.PARAM_MAX_POINTS: str(session.max_points),
        protocol.PARAM_MAX_BOXES: str(session.max_boxes),
        protocol.PARAM_MAX_IMAGE_PIXELS: str(session.max_image_pixels),
        protocol.PARAM_MAX_IMAGE_BYTES: str(session.max_image_bytes),
        protocol.PARAM_BOX_BEFORE_POINTS: str(family.box_before_points).lower(),
        protocol.PARAM_PAD_WITH_BOX: str(family.pad_with_box).lower(),
        protocol.PARAM_CPU_FEATURES: session.cpu_features,
        protocol.PARAM_MAX_CONCURRENT_EMBEDS: str(session.max_concurrent_embeds),
        protocol.PARAM_MAX_WAITING_EMBEDS: str(session.max_waiting_embeds),
    }
    for key, value in params.items():
        config.parameters[key].string_value = value
    return config


def render_session_config(
    family: FamilySpec, options: RepositoryOptions, session: SessionOptions | None = None
) -> str:
    """``config.pbtxt`` text of the family's session model; see :func:`build_session_config`."""
    return config_to_text(build_session_config(family, options, session))


def session_artifact(
    family: FamilySpec,
    options: RepositoryOptions,
    session: SessionOptions | None = None,
) -> ModelFiles:
    """The session model as one artifact of a repository build: its config, ``model.py`` and
    the protocol package it imports (write it with the pair, :func:`writer.write_models`)."""
    config = build_session_config(family, options, session)
    files = {"model.py": SESSION_SOURCE} | shipped_modules(SHIPPED_MODULES)
    return ModelFiles(config.name, config_to_text(config), files)


def session_variant(model: ModelFiles, *, cpu_features: str) -> ModelFiles:
    """A session model artifact (e.g. read from a repository) with ``cpu_features`` set and
    ``model.py`` and its package taken from this source tree; the rest of its config (bounds,
    models it calls) is kept. For comparing both feature stores on one export
    (``triton-sam bench click``).

    Raises:
        InputValidationError: ``cpu_features`` not in ``protocol.CPU_FEATURES``, or
            ``model`` is not a session model.
    """
    SessionOptions(cpu_features=cpu_features)  # the same check as a written config's
    config = parse_config(model.config_text)
    if config.parameters[protocol.PARAM_KIND].string_value != protocol.KIND:
        raise InputValidationError("model", f"{model.name!r} is not a session model")
    config.parameters[protocol.PARAM_CPU_FEATURES].string_value = cpu_features
    files = {"model.py": SESSION_SOURCE} | shipped_modules(SHIPPED_MODULES)
    return ModelFiles(model.name, config_to_text(config), files)


def write_session(
    repo_dir: str | os.PathLike[str],
    family: FamilySpec,
    options: RepositoryOptions,
    session: SessionOptions | None = None,
) -> str:
    """Write ``<repo>/<family>_session/`` alone, atomically; returns the name.

    Raises:
        RepositoryError / InputValidationError: as ``writer.write_models``.
    """
    artifact = session_artifact(family, options, session)
    write_models(repo_dir, [artifact])
    return artifact.name


def _prompt_inputs(family: FamilySpec) -> tuple[TensorSpec, ...]:
    embeddings = set(family.embedding_names)
    return tuple(t for t in family.decoder_inputs if t.name not in embeddings)


def _string_input(name: str) -> model_config_pb2.ModelInput:
    # BYTES tensors ([1] per item): Triton's TYPE_STRING, numpy object arrays of bytes.
    return model_config_pb2.ModelInput(name=name, data_type=model_config_pb2.TYPE_STRING, dims=[1])


def _optional(message: model_config_pb2.ModelInput) -> model_config_pb2.ModelInput:
    message.optional = True
    return message
