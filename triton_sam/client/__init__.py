"""Clients: image in, masks out, over Triton's HTTP or gRPC protocol."""

from triton_sam.client.concepts import ConceptPrediction
from triton_sam.client.endpoint import TlsOptions
from triton_sam.client.everything import EverythingResult
from triton_sam.client.prediction import Prediction
from triton_sam.client.retry import DEFAULT_RETRY, NO_RETRY, RetryPolicy
from triton_sam.client.speculative import (
    SpeculativeSAM2Client,
    queue_multiple_requests,
    wait_for_latest_result,
)
from triton_sam.client.sync import SAM2TritonClient
from triton_sam.client.video import SAM2VideoTritonClient

__all__ = [
    "ConceptPrediction",
    "DEFAULT_RETRY",
    "EverythingResult",
    "NO_RETRY",
    "Prediction",
    "RetryPolicy",
    "SAM2TritonClient",
    "SAM2VideoTritonClient",
    "SpeculativeSAM2Client",
    "TlsOptions",
    "queue_multiple_requests",
    "wait_for_latest_result",
]
