"""Clients: image in, masks out, over Triton's HTTP or gRPC protocol."""

from triton_sam.client.prediction import Prediction
from triton_sam.client.speculative import (
    SpeculativeSAM2Client,
    queue_multiple_requests,
    wait_for_latest_result,
)
from triton_sam.client.sync import SAM2TritonClient

__all__ = [
    "Prediction",
    "SAM2TritonClient",
    "SpeculativeSAM2Client",
    "queue_multiple_requests",
    "wait_for_latest_result",
]
