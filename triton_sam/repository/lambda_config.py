"""The ``sam2`` model's ``config.pbtxt`` (the Lambda seed's JSON contract) and its artifact.

Written by ``triton-sam setup`` / ``export`` beside the session model of SAM2.1 variants
(:func:`triton_sam.setup.pipeline.build_repository`). Its tensors are the seed's
(``models/sam2/config.pbtxt``): ``image_b64`` and ``prompt_json`` (TYPE_STRING, dims [1]) in,
``result_json`` out, with a batch dimension, so the seed's ``[1, 1]`` requests are served as
they are. One ``KIND_CPU`` instance on every target: it only parses JSON and routes tensors to
the session model, and keeps no state. Its bounds are the session model's (one
``SessionOptions``), plus the boxes and prompt bytes of
:mod:`triton_sam.serving.protocol.lambda_json`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from triton_sam.models.spec import FamilySpec
from triton_sam.repository.checks import check_model_name
from triton_sam.repository.config import (
    ModelConfig,
    RepositoryOptions,
    config_to_text,
    model_config_pb2,
    set_parameters,
)
from triton_sam.repository.session_config import SessionOptions
from triton_sam.repository.shipping import shipped_files
from triton_sam.repository.writer import (
    CONFIG_FILENAME,
    SERVING_DIR,
    ModelFiles,
    read_model,
    written_by_triton_sam,
)
from triton_sam.serving import intake
from triton_sam.serving.protocol import lambda_json as protocol

log = logging.getLogger(__name__)

LAMBDA_SOURCE = SERVING_DIR / "lambda_model.py"


def serves_lambda(family: FamilySpec) -> bool:
    """Whether ``setup`` writes the ``sam2`` model beside this family's session model: SAM2.1
    (the seed serves SAM2), whose session model takes prompts in pixels."""
    return family.family == "sam2" and family.prompt_layout == "point_list"


def build_lambda_config(
    family: FamilySpec,
    options: RepositoryOptions,
    session: SessionOptions | None = None,
    *,
    name: str = protocol.DEFAULT_NAME,
) -> ModelConfig:
    """The ``sam2`` model config as a protobuf message.

    Args:
        family: the family whose session model it calls (``family.session_model``).
        options: ``decoder_max_batch_size`` (requests per ``execute``) and
            ``max_queue_delay_us``, as the session model's.
        session: the session model's bounds (image bytes, points), checked here first.
        name: the model name (the seed's ``sam2`` by default).
    """
    session = session or SessionOptions()
    check_model_name(name)
    config = ModelConfig(name=name, backend="python", max_batch_size=options.decoder_max_batch_size)
    for tensor in (protocol.IMAGE_B64, protocol.PROMPT_JSON):
        config.input.append(
            model_config_pb2.ModelInput(
                name=tensor, data_type=model_config_pb2.TYPE_STRING, dims=[1]
            )
        )
    config.output.append(
        model_config_pb2.ModelOutput(
            name=protocol.RESULT_JSON, data_type=model_config_pb2.TYPE_STRING, dims=[1]
        )
    )
    config.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    # Several queued requests reach one execute (their BLS calls overlap), and a request
    # cancelled while queued is dropped.
    config.dynamic_batching.max_queue_delay_microseconds = options.max_queue_delay_us
    served = protocol.LambdaSettings(
        session_model=family.session_model,
        max_image_bytes=session.max_image_bytes,
        max_points=session.max_points,
        preprocessing=intake.preprocessing_json(family.preprocessing),
    )
    set_parameters(config, served, kind=protocol.KIND)
    return config


def lambda_artifact(
    family: FamilySpec, options: RepositoryOptions, session: SessionOptions | None = None
) -> ModelFiles:
    """The ``sam2`` model as one artifact of a repository build (written with the pair and
    the session model, ``writer.write_models``)."""
    config = build_lambda_config(family, options, session)
    files = {"model.py": LAMBDA_SOURCE} | shipped_files(LAMBDA_SOURCE)
    return ModelFiles(config.name, config_to_text(config), files)


def lambda_artifact_for(
    repository: str | os.PathLike[str],
    family: FamilySpec,
    options: RepositoryOptions,
    session: SessionOptions | None = None,
) -> ModelFiles | None:
    """The ``sam2`` artifact to write into ``repository`` beside ``family``'s session model,
    or None: the family has none (:func:`serves_lambda`), or the repository already holds a
    ``sam2`` model of the user's own (the Lambda seed's python model, say), which ``setup``
    keeps as it is, with a warning, rather than replace it."""
    if not serves_lambda(family):
        return None
    existing = Path(repository) / protocol.DEFAULT_NAME
    ours = not (existing / CONFIG_FILENAME).is_file() or written_by_triton_sam(
        read_model(repository, protocol.DEFAULT_NAME)
    )
    if not ours:
        log.warning(
            "%s is a model of your own: kept as it is, and the Lambda JSON contract model of "
            "triton-sam not written (rename or move yours, then run setup again, to serve "
            "the contract over %s)",
            existing,
            family.session_model,
        )
        return None
    return lambda_artifact(family, options, session)
