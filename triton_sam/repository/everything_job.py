"""The everything JOB model ``<family>_everything``: its ``config.pbtxt`` and its artifact.

Not the everything DECODER (``<family>_everything_decoder``, the ONNX graph the job calls for
each batch of points: ``repository/everything.py``): this is the python-backend model that
runs a whole segment-everything job over the session model and that decoder.

Written by ``triton-sam setup`` / ``export`` for the point-list families (SAM1, SAM2.1) beside
their session model and the ``<family>_everything_decoder`` graph it calls
(:func:`triton_sam.setup.pipeline.build_repository`). A python-backend BLS model
(``serving/everything_model.py``), **decoupled** (progress responses, then the instances, over
gRPC's stream; the reasons are in :mod:`triton_sam.serving.protocol.everything`), with no
batch dimension (one job per request) and one ``KIND_CPU`` instance on every target: it only
drives the job; the encoder and the decoder graph it calls run where their configs put them.
Its image bounds are the session model's (one ``SessionOptions``).
"""

from __future__ import annotations

from dataclasses import dataclass

from triton_sam.models.spec import FamilySpec
from triton_sam.repository.checks import check_int, check_model_name
from triton_sam.repository.config import (
    ModelConfig,
    config_to_text,
    model_config_pb2,
    set_parameters,
)
from triton_sam.repository.session_config import SessionOptions
from triton_sam.repository.shipping import shipped_files
from triton_sam.repository.writer import SERVING_DIR, ModelFiles
from triton_sam.serving import everything
from triton_sam.serving.protocol import everything as protocol
from triton_sam.serving.protocol import large

EVERYTHING_SOURCE = SERVING_DIR / "everything_model.py"


@dataclass(frozen=True)
class EverythingOptions:
    """Admission of the everything model.

    Attributes:
        max_concurrent_jobs: jobs run at once (each holds an image, one crop's features and
            one batch of masks: the memory bound is this many of those).
        max_waiting_jobs: jobs that wait for a slot; one more is refused at once with
            ``Overloaded`` (``ServerOverloadedError`` in the clients).
    """

    max_concurrent_jobs: int = protocol.DEFAULT_MAX_CONCURRENT_JOBS
    max_waiting_jobs: int = protocol.DEFAULT_MAX_WAITING_JOBS

    def __post_init__(self) -> None:
        check_int("max_concurrent_jobs", self.max_concurrent_jobs, minimum=1)
        check_int("max_waiting_jobs", self.max_waiting_jobs, minimum=0)


def serves_everything(family: FamilySpec) -> bool:
    """Whether ``setup`` writes ``<family>_everything``: the families whose official generator
    it reproduces (SAM1, SAM2.1: point-list prompts)."""
    return family.family in everything.FAMILIES and family.prompt_layout == "point_list"


def build_everything_config(
    family: FamilySpec,
    session: SessionOptions | None = None,
    options: EverythingOptions | None = None,
) -> ModelConfig:
    """The ``<family>_everything`` model config as a protobuf message.

    Args:
        family: the family (its session model and everything-decoder are called over BLS).
        session: the session model's image bounds, checked here too.
        options: admission bounds.
    """
    session = session or SessionOptions()
    options = options or EverythingOptions()
    name = protocol.model_name(family.session_model)
    check_model_name(name)
    config = ModelConfig(name=name, backend="python", max_batch_size=0)
    config.model_transaction_policy.decoupled = True
    string, uint8 = model_config_pb2.TYPE_STRING, model_config_pb2.TYPE_UINT8
    for tensor, dtype, dims in (
        (protocol.IMAGE_BYTES, string, [1]),
        (protocol.IMAGE_RGB, uint8, [-1, -1, 3]),
        (protocol.IMAGE_ID, string, [1]),
        (protocol.PARAMS, string, [1]),
        (protocol.HANDLE, string, [1]),
        (protocol.BLOCK, model_config_pb2.TYPE_INT32, [4]),
        (protocol.Z, model_config_pb2.TYPE_INT32, [1]),
    ):
        config.input.append(
            model_config_pb2.ModelInput(name=tensor, data_type=dtype, dims=dims, optional=True)
        )
    config.output.append(
        model_config_pb2.ModelOutput(
            name=protocol.PROGRESS, data_type=model_config_pb2.TYPE_INT32, dims=[2]
        )
    )
    config.output.append(
        model_config_pb2.ModelOutput(name=protocol.INSTANCES, data_type=string, dims=[1])
    )
    config.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    job = protocol.JobSettings(
        family=family.family,
        session_model=family.session_model,
        decoder_model=everything.graph_name(family.family),
        embedding_names=tuple(family.embedding_names),
        max_image_bytes=session.max_image_bytes,
        max_image_pixels=session.max_image_pixels,
        max_concurrent_jobs=options.max_concurrent_jobs,
        max_waiting_jobs=options.max_waiting_jobs,
        # written beside this model for the same families (setup/pipeline.py)
        large_model=large.model_name(family.session_model),
    )
    set_parameters(config, job, kind=protocol.KIND)
    return config


def everything_artifact(
    family: FamilySpec,
    session: SessionOptions | None = None,
    options: EverythingOptions | None = None,
) -> ModelFiles:
    """The everything model as one artifact of a repository build (written with the graphs,
    the session model and the everything-decoder, ``writer.write_models``)."""
    config = build_everything_config(family, session, options)
    files = {"model.py": EVERYTHING_SOURCE} | shipped_files(EVERYTHING_SOURCE)
    return ModelFiles(config.name, config_to_text(config), files)
