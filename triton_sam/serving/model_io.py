"""Reading a python model's request inputs and answering its refusals: one way for every model.

Used by the ``*_model.py`` files inside Triton's stub. Triton's ``triton_python_backend_utils``
is passed in (``pb_utils``), never imported: this package stays importable by the clients.
Every refusal is a :class:`~.bounds.RequestError` (the serving package's one request error:
``<field>: <what was given>, expected <what>``), answered ``triton_sam.InvalidInput``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import protocol as envelope
from .bounds import RequestError


def tensor(pb_utils, request, name: str):
    """Input ``name`` of ``request`` as a ``pb_utils.Tensor``, or None when it was left out."""
    return pb_utils.get_input_tensor_by_name(request, name)


def one_value(pb_utils, request, name: str) -> Any:
    """The value of an optional one-value input, or None when the request leaves it out.

    Raises:
        RequestError: (``name``) more or fewer than one value.
    """
    given = tensor(pb_utils, request, name)
    if given is None:
        return None
    values = given.as_numpy().reshape(-1)
    if values.size != 1:
        raise RequestError(name, f"got {values.size} values, expected 1")
    return values[0]


def as_bytes(value: Any) -> bytes:
    """A BYTES tensor element as bytes (numpy hands them over as bytes or as str)."""
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def utf8(value: Any, field: str) -> str:
    """A BYTES element as text.

    Raises:
        RequestError: (``field``) not valid UTF-8.
    """
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(field, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None


def string(pb_utils, request, name: str) -> str | None:
    """An optional one-value BYTES input as text, or None when the request leaves it out."""
    value = one_value(pb_utils, request, name)
    return None if value is None else utf8(value, name)


def single(array: np.ndarray, field: str) -> np.ndarray:
    """The one item of a batch-1 input (a request is one image).

    Raises:
        RequestError: (``field``) a batch other than 1.
    """
    if array.shape[0] != 1:
        raise RequestError(field, f"batch {array.shape[0]}, expected 1 (one image per request)")
    return array[0]


def requested_outputs(request) -> list[str]:
    """The outputs the client asked for ([] when the stub cannot say: then all)."""
    if hasattr(request, "requested_output_names"):
        return list(request.requested_output_names())
    return []


def cancelled(request) -> bool:
    """Whether the client cancelled ``request`` while it waited (False on stubs too old to
    tell)."""
    return hasattr(request, "is_cancelled") and request.is_cancelled()


def error_answer(pb_utils, error: Exception):
    """The error response for what ``error`` refused: a request error is ``InvalidInput``, a
    protocol error (the session model's, relayed, included) answers its own code, anything
    else is ``Internal`` with the exception's type (one request never takes the stub down).
    """
    if isinstance(error, RequestError):
        code, text = envelope.ERR_INVALID_INPUT, str(error)
    elif isinstance(error, envelope.ProtocolError):
        code, text = error.code, str(error)
    else:
        code, text = envelope.ERR_INTERNAL, f"{type(error).__name__}: {error}"
    return envelope.error_response(pb_utils, code, text)
