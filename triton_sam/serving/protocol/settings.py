"""A served model's settings: one dataclass, written to ``config.pbtxt`` and read back in it.

Each python model's protocol module declares its settings as a frozen dataclass whose field
names are its config parameter keys. The renderer in ``triton_sam.repository`` builds one and
writes :func:`to_parameters`; the model's ``initialize`` reads it back with
:func:`from_parameters`. One declaration, so the two sides cannot drift apart field by field.

Text forms (Triton's parameters are strings): ``int``/``float``/``str`` as ``str()`` writes
them, a ``tuple[str, ...]`` comma-separated. A key left out or empty takes the field's default.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from . import KIND_PARAM, config_parameters

T = TypeVar("T")


def to_parameters(settings: Any, *, kind: str | None = None) -> dict[str, str]:
    """Config parameters (key -> text) of a settings dataclass, headed by the model ``kind``
    (:data:`~triton_sam.serving.protocol.KIND_PARAM`) when given."""
    out = {} if kind is None else {KIND_PARAM: kind}
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        out[field.name] = ",".join(value) if isinstance(value, tuple) else str(value)
    return out


def from_parameters(cls: type[T], params: dict[str, str]) -> T:
    """The settings ``cls`` read from config parameters (as :func:`config_parameters` gives).

    Raises:
        TypeError: a field without a default is missing; ValueError: a value does not parse.
    """
    values = {}
    for field in dataclasses.fields(cls):
        text = params.get(field.name, "")
        if text != "":
            values[field.name] = _parse(field.type, text)
    return cls(**values)


def from_model_config(cls: type[T], model_config: dict) -> T:
    """The settings ``cls`` of a python model, read from the ``parameters`` of the model
    config its ``initialize`` is handed (``json.loads(args["model_config"])``).

    Raises:
        TypeError / ValueError: as :func:`from_parameters`.
    """
    return from_parameters(cls, config_parameters(model_config))


def _parse(kind: Any, text: str) -> Any:
    kind = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    if kind.startswith("tuple"):
        return tuple(item for item in text.split(",") if item)
    return {"int": int, "float": float}.get(kind, str)(text)
