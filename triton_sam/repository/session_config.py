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

Its bounds (``triton_sam.serving.bounds``) and the family's preprocessing are parameters: one
dataclass, ``serving/embedding_cache/settings.py``'s ``SessionSettings``, filled here and
written field by field, read back by the model the same way (``serving/protocol/parameters.py``).

One instance, always (the cache lives in it; see serving/embedding_cache_model.py):
``KIND_GPU`` pinned to GPU 0 when the encoder runs on GPUs (features stay in device memory),
else ``KIND_CPU``.
"""

from __future__ import annotations

import math
import os

import numpy as np

from triton_sam.errors import InputValidationError
from triton_sam.models.spec import FamilySpec, TensorSpec
from triton_sam.repository.checks import check_model_name
from triton_sam.repository.config import (
    ModelConfig,
    RepositoryOptions,
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
from triton_sam.serving import intake
from triton_sam.serving.embedding_cache import settings
from triton_sam.serving.embedding_cache.settings import SessionSettings
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
from triton_sam.serving.protocol.parameters import ParameterError, to_parameters

SESSION_SOURCE = SERVING_DIR / "embedding_cache_model.py"
# What the session model imports beside its model.py (triton_sam_serving/...).
SHIPPED_MODULES = imported_modules(SESSION_SOURCE)
# Prompts in original pixels and finished masks (point_list decoders: SAM1, SAM2.1, the SAM3
# tracker as exported; each mapped by its own upstream rule, serving/rules.py).
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


class SessionOptions(settings.SessionOptions):
    """Bounds of the server-side feature cache: the fields of
    :class:`triton_sam.serving.embedding_cache.settings.SessionOptions`, shared with the model.

    Raises:
        InputValidationError: a value out of its type or range, naming the field.
    """

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ParameterError as e:  # the package's own error, as every option's
            raise InputValidationError(e.name, e.reason) from None


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
    for key, value in _parameters(family, session, encoder_model, decoder_model).items():
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


def _parameters(
    family: FamilySpec,
    session: SessionOptions,
    encoder_model: str | None,
    decoder_model: str | None,
) -> dict[str, str]:
    """The config parameters: the model kind, then every rendered field of the settings."""
    limit = family.preprocessing.low_res_logit_limit
    derived = SessionSettings.of(
        session,
        encoder_model=encoder_model or family.encoder_model,
        decoder_model=decoder_model or family.decoder_model,
        encoder_inputs=tuple(t.name for t in family.encoder_inputs),
        embedding_names=tuple(family.embedding_names),
        embedding_bytes=embedding_bytes(family),
        low_res_logit_limit=None if limit is None else float(limit),
        preprocessing=intake.preprocessing_json(family.preprocessing),
        box_before_points=bool(family.box_before_points),
        pad_with_box=bool(family.pad_with_box),
    )
    return {protocol.PARAM_KIND: protocol.KIND, **to_parameters(derived)}


def _prompt_inputs(family: FamilySpec) -> tuple[TensorSpec, ...]:
    embeddings = set(family.embedding_names)
    return tuple(t for t in family.decoder_inputs if t.name not in embeddings)


def _string_input(name: str) -> model_config_pb2.ModelInput:
    # BYTES tensors ([1] per item): Triton's TYPE_STRING, numpy object arrays of bytes.
    return model_config_pb2.ModelInput(name=name, data_type=model_config_pb2.TYPE_STRING, dims=[1])


def _optional(message: model_config_pb2.ModelInput) -> model_config_pb2.ModelInput:
    message.optional = True
    return message
