"""``bench replicas`` end to end: the repository of ``model`` (exported, or a production one
served as its CPU twin), the scenario once against one server for reference, then behind
nginx with one replica killed mid-run, per protocol
(:func:`triton_sam.bench.replicas.run_replicas`).

``triton-sam bench replicas`` is this function with options; a notebook calls it directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from triton_sam.bench.harness import embedded
from triton_sam.bench.replicas import (
    ReplicaBenchOptions,
    ReplicaReport,
    bench_images,
    run_replicas,
    run_sessions,
)


def serve_and_bench_replicas(
    model: str,
    protocols: Sequence[str],
    options: ReplicaBenchOptions,
    *,
    repository: Path | None = None,
    progress: Callable[[str], None] = print,
) -> list[ReplicaReport]:
    """The replica benchmark of ``model`` for each of ``protocols`` (``"http"``, ``"grpc"``).

    Args:
        model: the variant (its family names the served models).
        protocols: the protocols to run behind nginx, in order.
        options: replicas, sessions, clicks, images, when a replica dies.
        repository: a production repository holding ``model``'s session model; None exports
            ``model`` (verified checkpoint, else random weights) into ``.bench-replicas``.
        progress: told which stage starts.

    Returns:
        One report per protocol, each compared with the single-server reference.
    """
    from triton_sam.models import get_model
    from triton_sam.repository.writer import embedded_repository
    from triton_sam.tools.demo import build_local_repository

    if repository is None:
        spec, repo, _ = build_local_repository(model, Path("checkpoints"), Path(".bench-replicas"))
    else:
        spec, repo = get_model(model), embedded_repository(repository)
    family = spec.family
    names = {
        "model_type": family.family,
        "encoder_model": family.encoder_model,
        "session_model": family.session_model,
    }
    progress("reference: the same sessions against one server")
    with embedded(repo) as server:
        reference = run_sessions(
            server.http_address, "http", bench_images(options), options, model_type=family.family
        )
    reports = []
    for protocol in protocols:
        progress(f"{protocol}: {options.replicas} replicas behind nginx")
        reports.append(run_replicas(repo, protocol, options, reference=reference, **names))
    return reports
