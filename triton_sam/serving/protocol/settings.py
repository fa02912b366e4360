"""A python model's settings read from, and written to, its ``config.pbtxt`` with the model kind.

Each python model's protocol module declares its settings as a frozen dataclass whose field
names are its config parameter keys; :mod:`.parameters` is the one codec between such a
dataclass and Triton's string parameters. This module adds what the job, Lambda, concept and
tracker models need around it: the ``kind`` parameter the renderer heads the config with,
and the read from the model config that ``initialize`` is handed.
"""

from __future__ import annotations

from typing import Any, TypeVar

from . import KIND_PARAM, config_parameters
from .parameters import from_parameters
from .parameters import to_parameters as _field_parameters

T = TypeVar("T")


def to_parameters(settings: Any, *, kind: str | None = None) -> dict[str, str]:
    """Config parameters (key -> text) of a settings dataclass, headed by the model ``kind``
    (:data:`~triton_sam.serving.protocol.KIND_PARAM`) when given."""
    head = {} if kind is None else {KIND_PARAM: kind}
    return {**head, **_field_parameters(settings)}


def from_model_config(cls: type[T], model_config: dict) -> T:
    """The settings ``cls`` of a python model, read from the ``parameters`` of the model
    config its ``initialize`` is handed (``json.loads(args["model_config"])``).

    Raises:
        TypeError: a field without a default is missing.
        ParameterError: a value does not parse as its field's type (naming the field).
    """
    return from_parameters(cls, config_parameters(model_config))


__all__ = ["from_model_config", "from_parameters", "to_parameters"]
