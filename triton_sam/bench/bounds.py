"""A benchmark's settings declare each field's bounds with the field; one check reads them.

``sessions: int = at_least(1, default=16)`` says what the check enforces where the field is
declared, and :func:`check_bounds` (called from the settings' ``__post_init__``) refuses a
value outside them with an :class:`~triton_sam.errors.InputValidationError` naming the field.
"""

from __future__ import annotations

from dataclasses import field, fields
from typing import Any

from triton_sam.errors import InputValidationError

_AT_LEAST = "at_least"
_POSITIVE = "positive"


def at_least(minimum: int, *, default: int) -> Any:
    """A count: an integer (a bool is not one) >= ``minimum``."""
    return field(default=default, metadata={_AT_LEAST: minimum})


def positive(default: float) -> Any:
    """A number > 0 (a duration, a rate)."""
    return field(default=default, metadata={_POSITIVE: True})


def check_bounds(settings: Any) -> None:
    """Check every field of the dataclass ``settings`` declared with :func:`at_least` or
    :func:`positive`.

    Raises:
        InputValidationError: the first field outside its bounds, with the value given.
    """
    for f in fields(settings):
        value = getattr(settings, f.name)
        if _AT_LEAST in f.metadata:
            low = f.metadata[_AT_LEAST]
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise InputValidationError(f.name, f"got {value!r}, expected an integer >= {low}")
        elif f.metadata.get(_POSITIVE) and not value > 0:
            raise InputValidationError(f.name, f"got {value!r}, expected > 0")
