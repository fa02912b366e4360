"""One error hierarchy for the whole package.

Every error a user can act on has its own subclass; messages name the field, what was given
and what was expected, and say what to do next. Library errors (tritonclient, grpc, onnx,
requests) are translated at one place per layer and chained with ``from e``.
"""

from __future__ import annotations


class TritonSamError(Exception):
    """Base class of every error raised by triton_sam."""


class InputValidationError(TritonSamError, ValueError):
    """A user-supplied argument has the wrong type, shape or range.

    Attributes:
        field: name of the offending argument (e.g. ``"point_coords"``).
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class UnsupportedModelError(TritonSamError, KeyError):
    """An unknown model family, variant or model_type was requested."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class ConfigError(TritonSamError):
    """A configuration file or override is malformed."""


class CheckpointError(TritonSamError):
    """A checkpoint is missing, corrupt or fails its integrity check."""


class DownloadError(CheckpointError):
    """A checkpoint could not be downloaded (offline, HTTP error, interrupted)."""


class IntegrityError(CheckpointError):
    """A file's sha256 does not match the recorded or published value."""


class ExportError(TritonSamError):
    """Building or exporting a model to ONNX failed."""


class ExportValidationError(ExportError):
    """The exported ONNX graph disagrees with the torch model beyond tolerance.

    Attributes:
        mismatches: one line per output that failed, with its max abs/rel error.
    """

    def __init__(self, model: str, mismatches: list[str]) -> None:
        self.mismatches = mismatches
        lines = "\n  ".join(mismatches)
        super().__init__(f"ONNX export of {model} does not match torch:\n  {lines}")


class RepositoryError(TritonSamError):
    """The Triton model repository is missing a model or holds an invalid config."""


class ServerError(TritonSamError):
    """The server answered with an error (bad request, model failure)."""


class EmbeddingNotFoundError(ServerError):
    """The server-side session model holds no features for this image id (never embedded,
    evicted by its LRU bound, or the server restarted). The clients re-embed and retry once."""


class ServerUnavailableError(ServerError):
    """The server cannot be reached, is not live, or a model is not ready."""


class ServerStartError(ServerUnavailableError):
    """The embedded tritonserver failed to start or to become ready."""


class BackendNotFoundError(ServerStartError):
    """A Triton backend the model repository needs is not available to the embedded server
    (e.g. the onnxruntime backend); the message says where it looked and how to get one."""


class ModelNotReadyError(ServerUnavailableError):
    """The server answers, but the named model is unknown, unloaded or not ready.

    Attributes:
        model: the Triton model name.
    """

    def __init__(self, model: str, message: str) -> None:
        self.model = model
        super().__init__(message)


class ServerOverloadedError(ServerUnavailableError):
    """The server rejected a request because its queue is full or the request waited in it
    longer than the model's queue timeout (Triton's ``default_queue_policy``)."""


class InvalidRequestError(ServerError, ValueError):
    """The server refused a request as malformed: an unknown, missing or extra input, or a
    tensor of the wrong shape or datatype (the message is the server's, naming the input)."""


class InferenceTimeoutError(ServerError, TimeoutError):
    """A request did not complete within its timeout."""


class RequestCancelledError(TritonSamError):
    """A request was cancelled before it completed (never raised for asyncio cancellation)."""


class ImageNotSetError(TritonSamError):
    """``predict`` was called before ``set_image``."""


class TrackingSessionNotFoundError(ServerError):
    """The server holds no tracking session of yours under this id (never issued, issued to
    another tenant, closed, evicted after it sat idle, or the server restarted).
    ``SAM2VideoTritonClient`` re-creates it transparently when it still has the video."""


class HandleNotFoundError(ServerError):
    """The server holds no large image of yours under this handle (never issued, issued to
    another tenant, closed, evicted as its tenant's least recently used, or the server
    restarted): open the dataset or send the array again (``open_dataset`` / ``open_array``)."""


class ExemplarNotFoundError(ServerError):
    """The server holds no concept exemplar of yours under this id (never issued, issued to
    another tenant, evicted as its tenant's least recently used, or the server restarted):
    draw the exemplar boxes again on an image (``predict_concepts(boxes=...)``) for a new id.
    Not retried: the exemplar's image is not the current one, so resending pixels cannot help."""


class FrameIndexError(InputValidationError, IndexError):
    """A frame index outside the video (or a frame the server was never sent)."""


class ObjectNotFoundError(TritonSamError, KeyError):
    """An object id that was never added to the tracking session."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class NoPromptsError(TritonSamError, RuntimeError):
    """Propagation asked for before any object got points, a box or a mask."""


class TrackingLimitError(ServerOverloadedError):
    """A tracking session would exceed the server's bounds (frames, bytes, objects)."""


class ImageFetchError(InputValidationError):
    """An image named by URL (a Label Studio task's) was not fetched: the URL is refused by
    the fetch policy, the answer is too large, or the fetch failed or timed out. The message
    names the field that held the URL, never a credential."""


class ImageUrlRefusedError(ImageFetchError):
    """A URL outside what the fetcher may reach: not http(s), or another origin than the
    configured one (and its allow-list), directly or through a redirect."""


class ImageTooLargeError(ImageFetchError):
    """A fetched image over the byte bound (Content-Length or bytes received) or the pixel
    bound (from its header, before decoding)."""
