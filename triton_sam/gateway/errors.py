"""The gateway's answers to what it refuses: typed JSON naming the field.

Body: ``{"code": ..., "field": ..., "message": ...}``, where ``code`` is one of the protocol's
error codes (:mod:`triton_sam.serving.protocol`: ``InvalidInput``, ``LimitExceeded``,
``Overloaded``, ``SessionNotFound``...) or ``Unavailable`` / ``Upstream`` / ``Timeout`` for
what Triton answered, and the message starts with the field, as the server's do.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

from triton_sam import errors
from triton_sam.serving.protocol import (
    ERR_INVALID_INPUT,
    ERR_LIMIT,
    ERR_OVERLOADED,
    ERR_SESSION_NOT_FOUND,
)

__all__ = [
    "ERR_INVALID_INPUT",
    "ERR_LIMIT",
    "ERR_OVERLOADED",
    "ERR_SESSION_NOT_FOUND",
    "GatewayError",
    "from_client_error",
]


class GatewayError(Exception):
    """A refusal: HTTP ``status`` with a typed JSON body."""

    def __init__(
        self, status: int, code: str, field: str, message: str, *, retry_after_s: int = 0
    ) -> None:
        super().__init__(f"{field}: {message}")
        self.status, self.code, self.field = status, code, field
        self.retry_after_s = retry_after_s

    def response(self) -> JSONResponse:
        """The JSON answer."""
        headers = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s else None
        body = {"code": self.code, "field": self.field, "message": str(self)}
        return JSONResponse(body, status_code=self.status, headers=headers)


def invalid(field: str, message: str) -> GatewayError:
    """400 ``InvalidInput`` naming ``field``."""
    return GatewayError(400, ERR_INVALID_INPUT, field, message)


def from_client_error(e: errors.TritonSamError, field: str = "image") -> GatewayError:
    """What our client raised, as an answer (``field``: the input a refusal is about when the
    error names none)."""
    if isinstance(e, errors.InputValidationError):
        name = getattr(e, "field", field) or field
        return GatewayError(400, ERR_INVALID_INPUT, name, str(e).removeprefix(f"{name}: "))
    if isinstance(e, errors.ServerOverloadedError):
        return GatewayError(503, ERR_OVERLOADED, "triton", str(e), retry_after_s=1)
    if isinstance(e, errors.ServerUnavailableError):
        return GatewayError(503, "Unavailable", "triton", str(e), retry_after_s=5)
    if isinstance(e, errors.InferenceTimeoutError):
        return GatewayError(504, "Timeout", "triton", str(e))
    return GatewayError(502, "Upstream", "triton", str(e))
