"""Config parameters <-> a settings dataclass, one loop each way (standard library only).

A python-backend model's settings are one frozen dataclass shared by its renderer in
``triton_sam.repository`` (which fills it and writes :func:`to_parameters` into the
``parameters`` of ``config.pbtxt``) and the model itself (which reads them back with
:func:`from_parameters` in ``initialize``). Each field is one parameter named as the field,
its value a string:

=====================  ==============================  ==============================
field type             written                         read back
=====================  ==============================  ==============================
``int``                ``str(value)``                  ``int(text)``
``float | None``       ``repr(float(value))``, None ""  ``float(text)``, "" is None
``bool``               ``"true"`` / ``"false"``        the same two words
``str``                as it is                        as it is
``tuple[str, ...]``    comma-separated                 split at commas, empty items dropped
=====================  ==============================  ==============================

A parameter that is absent or empty reads as the field's default (configs written before the
parameter existed). A field whose metadata says ``rendered: False`` is read but never
written by the renderer: another writer (the CPU twin's) sets it on a config when it needs it.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

NOT_RENDERED = {"rendered": False}  # field metadata: read back, written by another tool


class ParameterError(ValueError):
    """A settings value (or the config parameter it was read from) out of its type or range.

    Attributes:
        name: the field, which is also the parameter's name.
        reason: what was given and what is expected.
    """

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"{name}: {reason}")


def to_parameters(settings: Any) -> dict[str, str]:
    """The config parameters of a settings dataclass instance: field name -> text."""
    hints = typing.get_type_hints(type(settings))
    out = {}
    for field in dataclasses.fields(settings):
        if field.metadata.get("rendered", True):
            out[field.name] = _write(hints[field.name], getattr(settings, field.name))
    return out


def from_parameters(cls: type, parameters: Mapping[str, str]) -> Any:
    """An instance of the settings dataclass ``cls`` read from config ``parameters``.

    Parameters that name no field are ignored (the model kind, other tools' keys).

    Raises:
        ParameterError: naming the parameter whose text does not parse as its field's type
            (or whose value the dataclass's own checks refuse).
    """
    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        text = parameters.get(field.name, "")
        if text != "":
            values[field.name] = _read(field.name, hints[field.name], text)
    return cls(**values)


def _write(kind: Any, value: Any) -> str:
    if kind is bool:
        return "true" if value else "false"
    if kind == (float | None):
        return "" if value is None else repr(float(value))
    if kind == tuple[str, ...]:
        return ",".join(value)
    return str(value)


def _read(name: str, kind: Any, text: str) -> Any:
    if kind is str:
        return text
    if kind == tuple[str, ...]:
        return tuple(item for item in text.split(",") if item)
    if kind is bool:
        if text not in ("true", "false"):
            raise ParameterError(name, f"got {text!r}, expected 'true' or 'false'")
        return text == "true"
    convert, what = (int, "an integer") if kind is int else (float, "a number")
    if kind not in (int, float | None):
        raise TypeError(f"{name}: no parameter codec for {kind}")
    try:
        return convert(text)
    except ValueError:
        raise ParameterError(name, f"got {text!r}, expected {what}") from None
