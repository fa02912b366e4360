"""The embedded tritonserver process: start, stop, backends, health watchdog, admin key.

``EmbeddedTriton`` (``embedded``) runs the ``tritonserver`` binary that the nvidia-pytriton
wheel ships (no Docker, CPU or GPU), as a child process (``process``) with the backends it
needs (``backends``); ``health`` reloads a model whose python stub died; ``admin_key`` makes
the per-install secret that guards Triton's admin APIs.
"""

from triton_sam.server.backends import (
    ORT_BACKEND_ENV,
    ORT_BACKEND_LIBRARY,
    find_onnxruntime_backend,
    find_tritonserver,
    onnxruntime_backend_candidates,
    required_backends,
)
from triton_sam.server.embedded import MODEL_CONTROLS, EmbeddedTriton

__all__ = [
    "MODEL_CONTROLS",
    "ORT_BACKEND_ENV",
    "ORT_BACKEND_LIBRARY",
    "EmbeddedTriton",
    "find_onnxruntime_backend",
    "find_tritonserver",
    "onnxruntime_backend_candidates",
    "required_backends",
]
