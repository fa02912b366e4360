"""Triton model repository: ``config.pbtxt`` per target, atomic model writes, the python runner.

- :mod:`~triton_sam.repository.config`: render/parse configs from a family spec.
- :mod:`~triton_sam.repository.backend_checks`: what Triton's onnxruntime backend accepts.
- :mod:`~triton_sam.repository.writer`: write ``<repo>/<name>/{config.pbtxt, 1/...}``
  atomically; :mod:`~triton_sam.repository.artifacts`: exported graphs as models to write.
- :mod:`~triton_sam.repository.cpu_twin`: the CPU-twin policy (what a model becomes on a
  CPU host); :mod:`~triton_sam.repository.embedded`: the embedded server's repository.
- :mod:`~triton_sam.repository.onnx_check`: a config against its graph, by the rules of
  Triton's onnxruntime backend.
- ``serving/runner_model.py``: the python-backend ``model.py`` of the ``python`` target, the
  fallback for an embedded server without that backend (runs inside Triton's stub, never
  imported by triton_sam).
"""

from triton_sam.repository.artifacts import write_pair
from triton_sam.repository.config import (
    BATCHINGS,
    TARGETS,
    RepositoryOptions,
    build_config,
    parse_config,
    render_config,
    triton_dtype,
)
from triton_sam.repository.cpu_twin import to_cpu_twin, to_python_target
from triton_sam.repository.embedded import embedded_repository
from triton_sam.repository.writer import list_models, write_model

__all__ = [
    "BATCHINGS",
    "TARGETS",
    "RepositoryOptions",
    "build_config",
    "embedded_repository",
    "list_models",
    "parse_config",
    "render_config",
    "to_cpu_twin",
    "to_python_target",
    "triton_dtype",
    "write_model",
    "write_pair",
]
