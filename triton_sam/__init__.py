"""triton-sam: Segment Anything (SAM1, SAM2.1, SAM3 tracker and concepts) on NVIDIA Triton.

Public API: the clients and the error hierarchy. Heavy dependencies (torch, sam2,
onnxruntime) are imported only by the export and serving modules that need them.
"""

from triton_sam.client import (
    ConceptPrediction,
    Prediction,
    RetryPolicy,
    SAM2TritonClient,
    SpeculativeSAM2Client,
    TlsOptions,
    queue_multiple_requests,
    wait_for_latest_result,
)
from triton_sam.errors import (
    BackendNotFoundError,
    CheckpointError,
    ConfigError,
    DownloadError,
    ExportError,
    ExportValidationError,
    ImageNotSetError,
    InferenceTimeoutError,
    InputValidationError,
    IntegrityError,
    InvalidRequestError,
    ModelNotReadyError,
    RepositoryError,
    RequestCancelledError,
    ServerError,
    ServerOverloadedError,
    ServerStartError,
    ServerUnavailableError,
    TritonSamError,
    UnsupportedModelError,
)

__version__ = "0.1.0"

__all__ = [
    "BackendNotFoundError",
    "CheckpointError",
    "ConceptPrediction",
    "ConfigError",
    "DownloadError",
    "ExportError",
    "ExportValidationError",
    "ImageNotSetError",
    "InferenceTimeoutError",
    "InputValidationError",
    "IntegrityError",
    "InvalidRequestError",
    "ModelNotReadyError",
    "Prediction",
    "RepositoryError",
    "RequestCancelledError",
    "RetryPolicy",
    "SAM2TritonClient",
    "ServerError",
    "ServerOverloadedError",
    "ServerStartError",
    "ServerUnavailableError",
    "SpeculativeSAM2Client",
    "TlsOptions",
    "TritonSamError",
    "UnsupportedModelError",
    "__version__",
    "queue_multiple_requests",
    "wait_for_latest_result",
]
