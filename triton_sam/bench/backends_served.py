"""``bench backends`` end to end: one repository of ``model`` built, served twice at once (on
Triton's onnxruntime backend and as its python-runner twin), and
:func:`triton_sam.bench.backends.compare_backends` over the two servers.

``triton-sam bench backends`` is this function with options; a notebook calls it directly.
"""

from __future__ import annotations

from pathlib import Path

from triton_sam.bench.backends import BackendComparison, compare_backends
from triton_sam.bench.harness import checkpoints_dir, embedded, protocol_url
from triton_sam.tools.sample import sample_image


def serve_and_compare_backends(
    model: str,
    *,
    protocol: str = "grpc",
    n_encode: int = 10,
    n_click: int = 50,
    work: Path = Path(".bench"),
) -> BackendComparison:
    """Encode and session-click latency of ``model`` on both backends, requests alternating.

    Args:
        model: the variant, exported into ``work`` (verified checkpoint, else random weights).
        protocol: ``"grpc"`` or ``"http"``.
        n_encode / n_click: timed requests per server.
        work: the export and both repositories.

    Returns:
        The comparison (:func:`triton_sam.bench.backends.write_report` writes it).
    """
    from triton_sam.repository.writer import embedded_repository
    from triton_sam.tools.demo import build_local_repository

    # Both servers run the graphs as exported (the runner has no fused CPU twin): like for like.
    spec, backend_repo, _ = build_local_repository(
        model, checkpoints_dir(), work, fuse_attention=False
    )
    runner_repo = embedded_repository(
        work / "model_repository", work / "model_repository_runner", target="python"
    )
    with embedded(backend_repo) as ort, embedded(runner_repo) as py:
        return compare_backends(
            {"onnxruntime": protocol_url(ort, protocol), "python": protocol_url(py, protocol)},
            spec.family,
            sample_image(),
            protocol=protocol,
            n_encode=n_encode,
            n_click=n_click,
            model_name=spec.name,
        )
