"""The one way a benchmark gets a server: the one at ``--url``, or an embedded one it starts.

Every measuring command (``triton-sam bench ...``, ``python -m triton_sam.bench.*``) and the
benchmarks' tests start their throwaway servers here, so the port choice (free ports, never
a fixed one that a running server holds), the repository build and what a report learns of
the server (its pid for memory sampling, its metrics URL for counters) are written once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from triton_sam.models.spec import ModelSpec
    from triton_sam.server import EmbeddedTriton

# Free ports for all three endpoints: a benchmark's server never collides with a running one.
FREE_PORTS = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}


@dataclass(frozen=True)
class Served:
    """The server a measuring command talks to.

    Attributes:
        url: the server for the chosen protocol as the clients take it (``host:port``).
        http_url / metrics_url: its HTTP and metrics endpoints when known (embedded).
        pid: the server process when embedded (memory sampling).
        family / name: the model family and variant served.
    """

    url: str
    http_url: str | None = None
    metrics_url: str | None = None
    pid: int | None = None
    family: str = "sam2"
    name: str = "sam2"

    @property
    def session_model(self) -> str:
        """The family's session model (``<family>_session``), the clients' default path."""
        return f"{self.family}_session"


def embedded(repository: str | Path, **options: Any) -> EmbeddedTriton:
    """An :class:`~triton_sam.server.EmbeddedTriton` over ``repository`` on free ports.

    Args:
        repository: the model repository to serve.
        **options: other ``EmbeddedTriton`` options (``model_control``, ``startup_timeout_s``,
            explicit ports to override the free ones...).

    Returns:
        The server, not started: use it as a context manager.
    """
    from triton_sam.server import EmbeddedTriton

    return EmbeddedTriton(repository, **(FREE_PORTS | options))


def protocol_url(server: EmbeddedTriton, protocol: str) -> str:
    """The URL of the embedded ``server`` for ``protocol`` (``"grpc"``, else HTTP)."""
    return server.grpc_url if protocol == "grpc" else server.http_url


def checkpoints_dir() -> Path:
    """``paths.checkpoints`` of the composed configuration (where ``download`` puts them)."""
    from triton_sam.setup.settings import load_config

    return Path(load_config().paths.checkpoints)


@contextmanager
def served(
    url: str | None, *, protocol: str, model: str, model_type: str, work: Path
) -> Iterator[Served]:
    """The server at ``url``, or an embedded one over the production repository of ``model``.

    The embedded one is exported into ``work`` as ``docker compose`` would serve it (Triton's
    onnxruntime backend for CPU) and runs for as long as the block does.

    Args:
        url: a running server (``host:port``), or None to start one.
        protocol: ``"grpc"`` or ``"http"``: which of the embedded server's URLs is ``url``.
        model: the variant to build when no ``url`` is given.
        model_type: the family of the server at ``url`` (unused when embedded).
        work: the folder the embedded repository is written to.

    Yields:
        The :class:`Served` server.
    """
    if url:
        yield Served(url, family=model_type, name=model_type)
        return
    from triton_sam.tools.demo import build_local_repository

    spec, repo, _ = build_local_repository(model, checkpoints_dir(), work)
    with embedded(repo) as server:
        yield Served(
            protocol_url(server, protocol),
            server.http_url,
            server.metrics_url,
            server.pid,
            spec.family.family,
            spec.name,
        )


def protocol_urls(
    server: EmbeddedTriton, protocols: Sequence[str] = ("http", "grpc")
) -> dict[str, str]:
    """``protocol -> URL`` of a running embedded ``server`` for each of ``protocols``."""
    by_protocol = {"http": server.http_url, "grpc": server.grpc_url}
    return {p: by_protocol[p] for p in protocols}


def setup_repository(
    spec: ModelSpec,
    repository: Path,
    *,
    checkpoint: Path | None = None,
    reuse_model: str | None = None,
    twin: bool = True,
    **build_options: Any,
) -> Path:
    """``repository`` written as ``triton-sam setup`` writes it, and what the embedded
    server serves of it.

    Args:
        spec: the variant.
        repository: where the production repository is written.
        checkpoint: the weights; None exports the official config's random initialisation.
        reuse_model: a model name: when ``repository`` already holds it, an earlier build
            finished and is reused (None: always built).
        twin: return the repository's CPU twin (:func:`~triton_sam.repository.writer.
            embedded_repository`, Triton's onnxruntime backend); False returns
            ``repository`` itself (a repository written for the python target).
        **build_options: more :func:`~triton_sam.setup.pipeline.build_repository` options
            (``everything``, ``export_options``, ``repository_options``...).

    Returns:
        The repository to give :func:`embedded`.
    """
    from triton_sam.repository.writer import embedded_repository
    from triton_sam.setup.pipeline import build_repository

    if reuse_model is None or not (repository / reuse_model).is_dir():
        build_repository(
            spec,
            repository,
            checkpoint=checkpoint,
            random_init=checkpoint is None,
            **build_options,
        )
    return embedded_repository(repository) if twin else repository
