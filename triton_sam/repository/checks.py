"""Checks of the values a repository is written with: model names, bounds, choices.

Each raises ``InputValidationError`` naming the field, what was given and what is expected.
"""

from __future__ import annotations

from triton_sam.errors import InputValidationError


def check_model_name(name: str) -> None:
    """Refuse names Triton cannot use as a repository directory.

    Raises:
        InputValidationError: empty, hidden, or containing a path separator.
    """
    if not name or name.startswith(".") or "/" in name or "\\" in name or name != name.strip():
        raise InputValidationError(
            "name", f"got {name!r}, expected a plain directory name (no '/', not hidden)"
        )


def check_int(field: str, value: object, *, minimum: int) -> None:
    """Refuse anything but an integer of at least ``minimum``.

    Raises:
        InputValidationError: not an int (a bool included), or below ``minimum``.
    """
    # bool is an int subclass; `max_batch_size=True` is a mistake, not 1.
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InputValidationError(field, f"got {value!r}, expected an integer >= {minimum}")


def check_choice(field: str, value: object, choices: tuple[object, ...]) -> None:
    """Refuse a value not among ``choices`` (None, where allowed, goes unnamed).

    Raises:
        InputValidationError: ``value`` is not one of ``choices``.
    """
    if value not in choices:
        shown = [c for c in choices if c is not None]
        raise InputValidationError(field, f"got {value!r}, expected one of {shown}")
