"""The protocol of triton_sam's server-side models: the one definition of their contract.

Standard library only. The repository writer ships this package beside every server-side
``model.py`` (see :mod:`triton_sam.serving`), the config renderers write the parameters it
names, and the clients build their requests and read the answers from it. One submodule per
model, what they share here:

- :mod:`.embedding_cache`: ``<family>_session``, image features kept on the server;
- :mod:`.concept`: ``sam3_concept``, text prompts to instances;
- :mod:`.tracker`: ``sam2_tracker`` and the five video graphs it calls;
- :mod:`.concept_video`: ``sam3_concept_video`` (designed; its per-frame answer and settings);
- :mod:`.runner`: the python-target runner of an ONNX graph;
- :mod:`.lambda_json`: ``sam2``, the Lambda seed's JSON contract over the session model;
- :mod:`.everything`: ``<family>_everything``, segment everything over the session model;
- :mod:`.settings`: each python model's settings dataclass to config parameters and back.

Model kinds: every python-backend model the writer renders carries its kind in the config
parameter :data:`KIND_PARAM`, so tools recognise it by what it says it is, not by sniffing
other parameters. ONNX graphs are recognised by their own ``platform``.

Errors (one envelope for every model): a refused request answers Triton's error with a status
(:data:`ERROR_STATUS`) and a message ``triton_sam.<Code>: <field>: <what was given>, expected
<what>``. Measured on Triton 2.51, the python backend's status reaches the client as:

=================  ==========  ==============================
TritonError code   HTTP        gRPC
=================  ==========  ==============================
INVALID_ARG        400         StatusCode.INVALID_ARGUMENT
NOT_FOUND          404         StatusCode.NOT_FOUND
INTERNAL           500         StatusCode.INTERNAL
CANCELLED          400         StatusCode.CANCELLED
=================  ==========  ==============================

Triton itself answers NOT_FOUND (404) for an unknown model too, so a client decodes an error
with :func:`parse_error`: the status AND the code in the message must agree.
"""

# -- model kinds (config parameter KIND_PARAM) ---------------------------------------------------
KIND_PARAM = "triton_sam.kind"
KIND_EMBEDDING_CACHE = "embedding_cache"  # <family>_session
KIND_CONCEPT = "concept"  # sam3_concept
KIND_TRACKER = "tracker"  # sam2_tracker
KIND_LAMBDA_JSON = "lambda_json"  # sam2: the Lambda seed's JSON contract
KIND_EVERYTHING = "everything"  # <family>_everything: segment everything
KIND_LARGE_IMAGE = "large_image"  # <family>_large: images larger than SAM's input, tiled
KIND_CONCEPT_VIDEO = "concept_video"  # sam3_concept_video: concepts tracked through a video
KINDS = (
    KIND_EMBEDDING_CACHE,
    KIND_CONCEPT,
    KIND_TRACKER,
    KIND_LAMBDA_JSON,
    KIND_EVERYTHING,
    KIND_LARGE_IMAGE,
    KIND_CONCEPT_VIDEO,
)
KIND_RUNNER = "onnx_runner"  # an ONNX graph on the python target (runner_model.py)
# The top-level name the package is shipped under beside model.py: unique, so nothing on the
# stub's sys.path (which holds the server interpreter's site-packages) can shadow it.
SHIPPED_PACKAGE = "triton_sam_serving"

# -- errors --------------------------------------------------------------------------------------
ERROR_PREFIX = "triton_sam."
ERR_INVALID_INPUT = "InvalidInput"  # a request the protocol refuses; names the field
ERR_EMBEDDING_NOT_FOUND = "EmbeddingNotFound"  # image id (or kept logits) not cached: resend
ERR_SESSION_NOT_FOUND = "SessionNotFound"  # unknown or evicted tracking session: re-create
ERR_FRAME_OUT_OF_RANGE = "FrameOutOfRange"
ERR_FRAME_MISSING = "FrameNotUploaded"
ERR_OBJECT_NOT_FOUND = "ObjectNotFound"
ERR_LIMIT = "LimitExceeded"  # larger than the server's bounds: not retried, it would fail again
ERR_NO_PROMPTS = "NoPrompts"  # propagation before any prompt
ERR_CANCELLED = "Cancelled"  # cancelled while queued: answered unrun
# a full queue: retry later (its message says "exceeds maximum queue size", as Triton's does)
ERR_OVERLOADED = "Overloaded"
ERR_INTERNAL = "Internal"
ERR_HANDLE_NOT_FOUND = "HandleNotFound"  # a large image's handle unknown, evicted or another's
# an exemplar id the concept model does not hold for the tenant: resending the image would not
# help (the exemplar was drawn on another image), so it is not EmbeddingNotFound
ERR_EXEMPLAR_NOT_FOUND = "ExemplarNotFound"
# code -> the python backend's TritonError code it is answered with
ERROR_STATUS = {
    ERR_INVALID_INPUT: "INVALID_ARG",
    ERR_EMBEDDING_NOT_FOUND: "NOT_FOUND",
    ERR_SESSION_NOT_FOUND: "NOT_FOUND",
    ERR_FRAME_OUT_OF_RANGE: "INVALID_ARG",
    ERR_FRAME_MISSING: "INVALID_ARG",
    ERR_OBJECT_NOT_FOUND: "NOT_FOUND",
    ERR_LIMIT: "INVALID_ARG",
    ERR_NO_PROMPTS: "INVALID_ARG",
    ERR_CANCELLED: "CANCELLED",
    ERR_OVERLOADED: "UNAVAILABLE",
    ERR_INTERNAL: "INTERNAL",
    ERR_HANDLE_NOT_FOUND: "NOT_FOUND",
    ERR_EXEMPLAR_NOT_FOUND: "NOT_FOUND",
}
# how a client library reports each TritonError code (tritonclient's status(): the HTTP status
# code, or str(grpc.StatusCode))
TRANSPORT_STATUS = {
    "INVALID_ARG": ("400", "StatusCode.INVALID_ARGUMENT"),
    "NOT_FOUND": ("404", "StatusCode.NOT_FOUND"),
    "INTERNAL": ("500", "StatusCode.INTERNAL"),
    "CANCELLED": ("400", "StatusCode.CANCELLED"),
    "UNAVAILABLE": ("503", "StatusCode.UNAVAILABLE"),
}


class ProtocolError(Exception):
    """A request a server model refuses, with its protocol code.

    Attributes:
        code: one of the ``ERR_*`` codes (a key of :data:`ERROR_STATUS`).
        field: the input it concerns, when there is one.
    """

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        self.code = code
        self.field = field
        super().__init__(message)

    @property
    def status(self) -> str:
        """The TritonError code the model answers it with."""
        return ERROR_STATUS.get(self.code, "INTERNAL")

    def wire_message(self) -> str:
        """The message as the model answers it (``triton_sam.<code>: ...``)."""
        return error_message(self.code, str(self))


def config_parameters(model_config: dict) -> dict[str, str]:
    """The ``parameters`` of a model config (as the python backend hands it over: the JSON
    form, each value under ``string_value``), by key; an empty string where a value is unset."""
    parameters = model_config.get("parameters", {})
    return {key: value.get("string_value", "") for key, value in parameters.items()}


def error_message(code: str, message: str) -> str:
    """The text of a protocol error: ``triton_sam.<code>: <message>``."""
    return f"{ERROR_PREFIX}{code}: {message}"


def error_response(pb_utils, code: str, message: str):
    """The python backend's error response for protocol ``code``: its status, and the code
    heading the message (unless the message already carries one).

    Args:
        pb_utils: ``triton_python_backend_utils`` (passed in: this package never imports
            Triton, so the clients can import it).
        code: one of the ``ERR_*`` codes.
        message: what went wrong, naming the field when there is one.
    """
    if not message.startswith(ERROR_PREFIX):
        message = error_message(code, message)
    # TritonError codes arrived in Triton 23.10; older stubs only take the message.
    status = getattr(pb_utils.TritonError, ERROR_STATUS.get(code, "INTERNAL"), None)
    error = (
        pb_utils.TritonError(message, status)
        if status is not None
        else pb_utils.TritonError(message)
    )
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


def error_code(message: str) -> str | None:
    """The code in a protocol error message (None when it is not one), wherever the client
    library put the message (``str()`` of tritonclient's exception prefixes the status)."""
    start = message.find(ERROR_PREFIX)
    if start < 0:
        return None
    code = message[start + len(ERROR_PREFIX) :].split(":", 1)[0]
    return code if code in ERROR_STATUS else None


def parse_error(status: str, message: str) -> tuple[str, str] | None:
    """``(code, text)`` of an error a triton_sam model answered, or None.

    Structural: the message carries a known code's header (``triton_sam.<Code>: ``, where the
    client library put it) and the transport status is the one that code is answered with,
    so Triton's own NOT_FOUND for an unknown model is never taken for a miss.

    Args:
        status: tritonclient's ``status()`` (``"404"``, ``"StatusCode.NOT_FOUND"``...).
        message: tritonclient's ``message()``.
    """
    code = error_code(message)
    if code is None or status not in TRANSPORT_STATUS.get(ERROR_STATUS[code], ()):
        return None
    header = f"{ERROR_PREFIX}{code}: "
    return code, message[message.find(header) + len(header) :]
