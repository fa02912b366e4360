"""The large-image model ``<family>_large``: its ``config.pbtxt`` and its artifact.

Written by ``triton-sam setup`` / ``export`` for the point-list families (SAM1, SAM2.1)
beside their session model (:func:`triton_sam.setup.pipeline.build_repository`), which it
calls over BLS for every tile. A python-backend model (``serving/large_model.py``), not
decoupled (one request, one JSON answer: HTTP, gRPC and curl alike), no batch dimension, one
``KIND_CPU`` instance on every target: its handles and upload spool live in that instance,
and the encoder and decoder it reaches through the session model run where their configs put
them. The contract is :mod:`triton_sam.serving.protocol.large`.
"""

from __future__ import annotations

from dataclasses import dataclass

from triton_sam.errors import InputValidationError
from triton_sam.models.spec import FamilySpec
from triton_sam.repository.checks import check_int, check_model_name
from triton_sam.repository.config import (
    ModelConfig,
    config_to_text,
    model_config_pb2,
    set_parameters,
)
from triton_sam.repository.shipping import shipped_files
from triton_sam.repository.writer import SERVING_DIR, ModelFiles
from triton_sam.serving.protocol import large as protocol

LARGE_SOURCE = SERVING_DIR / "large_model.py"
FAMILIES = ("sam1", "sam2")
_PIXEL_TYPES = {
    "uint8": model_config_pb2.TYPE_UINT8,
    "uint16": model_config_pb2.TYPE_UINT16,
    "float32": model_config_pb2.TYPE_FP32,
}


@dataclass(frozen=True)
class LargeOptions:
    """Bounds of the large model (see :class:`~triton_sam.serving.protocol.large.
    LargeSettings` for each; data roots are set at serve time, not here).

    Raises:
        InputValidationError: a value out of range, naming the field.
    """

    tile: int = protocol.DEFAULT_TILE
    halo: int = protocol.DEFAULT_HALO
    window: int = protocol.DEFAULT_WINDOW
    max_block: int = protocol.DEFAULT_MAX_BLOCK
    max_handles: int = protocol.DEFAULT_MAX_HANDLES
    max_upload_bytes: int = protocol.DEFAULT_MAX_UPLOAD_BYTES
    max_piece_pixels: int = protocol.DEFAULT_MAX_PIECE_PIXELS
    max_tiles_per_request: int = protocol.DEFAULT_MAX_TILES_PER_REQUEST
    sample_pixels: int = protocol.DEFAULT_SAMPLE_PIXELS
    max_request_bytes: int = protocol.DEFAULT_MAX_REQUEST_BYTES
    max_concurrent_opens: int = protocol.DEFAULT_MAX_CONCURRENT_OPENS
    max_waiting_opens: int = protocol.DEFAULT_MAX_WAITING_OPENS
    max_concurrent_puts: int = protocol.DEFAULT_MAX_CONCURRENT_PUTS
    max_waiting_puts: int = protocol.DEFAULT_MAX_WAITING_PUTS
    spool_dir: str = ""

    def __post_init__(self) -> None:
        check_int("tile", self.tile, minimum=protocol.MIN_TILE)
        check_int("halo", self.halo, minimum=0)
        check_int("max_block", self.max_block, minimum=self.tile + 2 * self.halo)
        check_int("window", self.window, minimum=protocol.MIN_TILE)
        if self.window > self.max_block:
            raise InputValidationError(
                "window", f"got {self.window}, expected at most max_block = {self.max_block}"
            )
        for name in ("max_handles", "max_upload_bytes", "max_piece_pixels"):
            check_int(name, getattr(self, name), minimum=1)
        for name in ("max_tiles_per_request", "sample_pixels", "max_request_bytes"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("max_concurrent_opens", self.max_concurrent_opens, minimum=1)
        check_int("max_waiting_opens", self.max_waiting_opens, minimum=0)
        check_int("max_concurrent_puts", self.max_concurrent_puts, minimum=1)
        check_int("max_waiting_puts", self.max_waiting_puts, minimum=0)


def serves_large(family: FamilySpec) -> bool:
    """Whether ``setup`` writes ``<family>_large``: SAM1 and SAM2.1, whose session model
    answers masks for prompts in pixels (point-list decoders) and whose parity with a small
    image and with micro-sam's tiles is tested."""
    return family.family in FAMILIES and family.prompt_layout == "point_list"


def build_large_config(family: FamilySpec, options: LargeOptions | None = None) -> ModelConfig:
    """The ``<family>_large`` model config as a protobuf message."""
    options = options or LargeOptions()
    name = protocol.model_name(family.session_model)
    check_model_name(name)
    config = ModelConfig(name=name, backend="python", max_batch_size=0)
    string = model_config_pb2.TYPE_STRING
    config.input.append(
        model_config_pb2.ModelInput(name=protocol.REQUEST, data_type=string, dims=[1])
    )
    for dtype, tensor in protocol.PIXEL_INPUTS.items():
        config.input.append(
            model_config_pb2.ModelInput(
                name=tensor, data_type=_PIXEL_TYPES[dtype], dims=[-1, -1, -1], optional=True
            )
        )
    config.output.append(
        model_config_pb2.ModelOutput(name=protocol.ANSWER, data_type=string, dims=[1])
    )
    config.output.append(  # a read's pixels (asked for by name)
        model_config_pb2.ModelOutput(
            name=protocol.RGB, data_type=model_config_pb2.TYPE_UINT8, dims=[-1, -1, 3]
        )
    )
    config.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    settings = protocol.LargeSettings(
        family=family.family,
        session_model=family.session_model,
        **{k: getattr(options, k) for k in LargeOptions.__dataclass_fields__},
    )
    set_parameters(config, settings, kind=protocol.KIND)
    return config


def large_artifact(family: FamilySpec, options: LargeOptions | None = None) -> ModelFiles:
    """The large model as one artifact of a repository build (written with the session
    model it calls, ``writer.write_models``)."""
    config = build_large_config(family, options)
    files = {"model.py": LARGE_SOURCE} | shipped_files(LARGE_SOURCE)
    return ModelFiles(config.name, config_to_text(config), files)
