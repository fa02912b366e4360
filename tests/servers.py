"""A parity module's own embedded server.

The session-wide servers of ``tests/conftest.py`` serve the integration tier and are stopped
after their last user there. A parity module starts its own server over the same repository
instead of keeping a shared one alive to the end of the suite: the shared ones carry the
integration tier's soak and stress load (onnxruntime's arenas keep that peak, ~8 GB for
SAM2.1-tiny in CI), and holding every family's server at once got one OOM-killed on the
24 GB CI machine. A parity module runs with one server alive.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def module_server(repository: Path) -> Iterator[object]:
    """Yield an ``EmbeddedTriton`` (ready, free ports) over ``repository``; stop it after."""
    from triton_sam.server import EmbeddedTriton

    with EmbeddedTriton(repository, http_port=0, grpc_port=0, metrics_port=0) as server:
        yield server
