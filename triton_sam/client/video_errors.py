"""Tracking errors by protocol code -> the package's typed errors (one place)."""

from __future__ import annotations

from triton_sam.errors import (
    FrameIndexError,
    InputValidationError,
    NoPromptsError,
    ObjectNotFoundError,
    ServerError,
    ServerOverloadedError,
    TrackingLimitError,
    TrackingSessionNotFoundError,
    TritonSamError,
)
from triton_sam.serving.protocol import tracker as protocol


def tracking_error(code: str | None, message: str, field: str | None = None) -> TritonSamError:
    """The typed error for a tracking error ``code`` (``protocol.ERR_*``) and its message.

    ``field`` is the input the error concerns; when None it is read from the message's
    ``<field>: ...`` start, the convention of every tracker message.
    """
    if field is None:
        head = message.split(":", 1)[0].strip()
        field = head if head.isidentifier() else "request"
    text = message.split(": ", 1)[1] if message.startswith(f"{field}: ") else message
    if code == protocol.ERR_SESSION_NOT_FOUND:
        return TrackingSessionNotFoundError(message)
    if code in (protocol.ERR_FRAME_OUT_OF_RANGE, protocol.ERR_FRAME_MISSING):
        return FrameIndexError(field, text)
    if code == protocol.ERR_OBJECT_NOT_FOUND:
        return ObjectNotFoundError(message)
    if code == protocol.ERR_NO_PROMPTS:
        return NoPromptsError(message)
    if code == protocol.ERR_OVERLOADED:
        return ServerOverloadedError(message)
    if code == protocol.ERR_LIMIT:
        return TrackingLimitError(message)
    if code == protocol.ERR_INVALID_INPUT:
        return InputValidationError(field, text)
    return ServerError(message)


def typed_error(e: TritonSamError) -> TritonSamError:
    """The tracking error a server message carries (by its code), else ``e`` as it is."""
    message = str(e)
    code = protocol.error_code(message)
    if code is None:
        return e
    start = message.find(protocol.ERROR_PREFIX) + len(protocol.ERROR_PREFIX) + len(code) + 2
    return tracking_error(code, message[start:])
