"""What a refused or failed session request is answered with, and what it counts.

Every error is a response of the one envelope (``serving/protocol``): ``triton_sam.<Code>:
<field>: <what was given>, expected <what>`` with the code's status. A request never takes
the stub (and its cache) down: anything unexpected is answered ``Internal``.
"""

from __future__ import annotations

from .. import bounds
from .. import protocol as envelope
from ..click_queue import QueueFull
from .embedder import EmbedCancelledWhileWaiting
from .predictor import CancelledWhileWaiting
from .store import EmbeddingMiss


def error_answer(pb_utils, error, metrics, *, embed):
    """The error response for ``error`` raised while answering a request (``embed``: the
    request carried an image), counting it in ``metrics`` where one is counted."""
    code, message = _code_and_message(error)
    counted = {
        QueueFull: "refused_embeds" if embed else None,
        EmbedCancelledWhileWaiting: "cancelled_embeds",
        CancelledWhileWaiting: "cancelled_clicks",
        EmbeddingMiss: "misses",
    }.get(type(error))
    if counted is not None:
        metrics.count(counted)
    return envelope.error_response(pb_utils, code, message)


def _code_and_message(error):
    if isinstance(error, bounds.RequestError):
        return envelope.ERR_INVALID_INPUT, str(error)
    if isinstance(error, envelope.ProtocolError):
        return error.code, str(error)
    if isinstance(error, QueueFull):
        return envelope.ERR_OVERLOADED, str(error)
    if isinstance(error, EmbedCancelledWhileWaiting):
        return envelope.ERR_CANCELLED, "request cancelled while waiting to be embedded"
    if isinstance(error, CancelledWhileWaiting):
        return envelope.ERR_CANCELLED, "request cancelled while waiting for the decoder"
    if isinstance(error, EmbeddingMiss):
        return envelope.ERR_EMBEDDING_NOT_FOUND, (
            f"{error} on this server (never embedded, evicted, or the server restarted); "
            "embed it again (send the image)"
        )
    return envelope.ERR_INTERNAL, f"{type(error).__name__}: {error}"
