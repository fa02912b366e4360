"""triton-sam: Segment Anything (SAM1, SAM2.1, SAM3 tracker and concepts) on NVIDIA Triton.

Public API: the clients and the error hierarchy. Heavy dependencies (torch, sam2,
onnxruntime) are imported only by the export and serving modules that need them.
"""

from triton_sam import _moved
from triton_sam.client import (
    ConceptPrediction,
    EverythingResult,
    Prediction,
    RetryPolicy,
    SAM2TritonClient,
    SAM2VideoTritonClient,
    SpeculativeSAM2Client,
    TlsOptions,
    queue_multiple_requests,
    wait_for_latest_result,
)
from triton_sam.client.catalog import ServedModel, served_models
from triton_sam.client.large_image import LargeImage, PredictAnswer
from triton_sam.client.large_transfer import PrecomputeResult

# Applications over the public API (the napari plugin, notebooks) need two things besides the
# clients: which models a server offers, to show only the tools it can run (served_models),
# and the server's own intensity mapping for pixels they hold in memory, so a 16-bit or float
# slice they embed whole reads exactly as the server's tiled path reads the same image
# (resolve_pixel_mapping, to_sam_rgb).
from triton_sam.client.pixel_mapping import resolve_pixel_mapping, to_sam_rgb
from triton_sam.client.sparse_mask import SparseMask
from triton_sam.errors import (
    BackendNotFoundError,
    CheckpointError,
    ConfigError,
    DownloadError,
    ExemplarNotFoundError,
    ExportError,
    ExportValidationError,
    FrameIndexError,
    HandleNotFoundError,
    ImageNotSetError,
    InferenceTimeoutError,
    InputValidationError,
    IntegrityError,
    InvalidRequestError,
    ModelNotReadyError,
    NoPromptsError,
    ObjectNotFoundError,
    RepositoryError,
    RequestCancelledError,
    ServerError,
    ServerOverloadedError,
    ServerStartError,
    ServerUnavailableError,
    TrackingLimitError,
    TrackingSessionNotFoundError,
    TritonSamError,
    UnsupportedModelError,
)

__version__ = "0.1.0"

# Modules that moved into the stage folders keep their old import paths for one release.
_moved.install()

__all__ = [
    "BackendNotFoundError",
    "CheckpointError",
    "ConceptPrediction",
    "ConfigError",
    "DownloadError",
    "EverythingResult",
    "ExemplarNotFoundError",
    "ExportError",
    "ExportValidationError",
    "FrameIndexError",
    "HandleNotFoundError",
    "ImageNotSetError",
    "InferenceTimeoutError",
    "InputValidationError",
    "IntegrityError",
    "InvalidRequestError",
    "LargeImage",
    "ModelNotReadyError",
    "NoPromptsError",
    "ObjectNotFoundError",
    "PrecomputeResult",
    "PredictAnswer",
    "Prediction",
    "RepositoryError",
    "RequestCancelledError",
    "RetryPolicy",
    "SAM2TritonClient",
    "SAM2VideoTritonClient",
    "ServedModel",
    "ServerError",
    "ServerOverloadedError",
    "ServerStartError",
    "ServerUnavailableError",
    "SparseMask",
    "SpeculativeSAM2Client",
    "TlsOptions",
    "TrackingLimitError",
    "TrackingSessionNotFoundError",
    "TritonSamError",
    "UnsupportedModelError",
    "__version__",
    "queue_multiple_requests",
    "resolve_pixel_mapping",
    "served_models",
    "to_sam_rgb",
    "wait_for_latest_result",
]
