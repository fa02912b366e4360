"""The served segment-everything row: a job's wall time and the server's peak memory.

What a user of ``triton-sam everything`` waits for: one ``generate_masks`` call against the
``<family>_everything`` model (gRPC stream, progress included), timed on the client, while a
thread samples the memory of ``tritonserver`` and its python stubs
(:func:`~triton_sam.bench.memory.process_tree_rss`: PSS, so the shared-memory pool the
processes all map is counted once). The image is embedded once before the timed jobs (the
session model caches it), so a row is the everything-decoder batches plus the driver, the
cost a second job on the same image, or a job after ``set_image``, pays.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_sam.bench.memory import PeakMemory

__all__ = ["PeakMemory", "ServedRow", "served_rows"]


@dataclass(frozen=True)
class ServedRow:
    """One served job.

    Attributes:
        points_per_side: the grid of the job (other parameters: the family's defaults and
            ``params``).
        seconds: the job's wall time on the client.
        instances: instances found.
        batches: decoder batches the server reported.
        server_peak_bytes: peak memory of the server's process tree during the job (None:
            the server is not a local process).
    """

    points_per_side: int
    seconds: float
    instances: int
    batches: int
    server_peak_bytes: int | None


def served_rows(
    url: str,
    image: np.ndarray,
    points_per_side: Iterable[int],
    *,
    model_type: str = "sam2",
    server_pid: int | None = None,
    params: Mapping[str, Any] | None = None,
    sample_period_s: float = 0.2,
) -> list[ServedRow]:
    """Time one served job per grid size on ``image`` (HxWx3 uint8) at ``url`` (gRPC).

    Args:
        url: the server's gRPC address.
        points_per_side: the grids to time, in order.
        server_pid: the local ``tritonserver``'s pid, for its peak memory.
        params: other generator parameters, the same for every row.
    """
    from triton_sam.client import SAM2TritonClient

    rows = []
    with SAM2TritonClient(url, model_type=model_type, protocol="grpc") as client:
        client.generate_masks(image, points_per_side=1)  # embeds and caches the image
        for n in points_per_side:
            steps: list[int] = [0]
            with PeakMemory(server_pid, sample_period_s) as peak:
                t0 = time.perf_counter()
                result = client.generate_masks(
                    image,
                    progress=lambda done, total, seen=steps: seen.append(total),
                    **{**dict(params or {}), "points_per_side": n},
                )
                seconds = time.perf_counter() - t0
            rows.append(ServedRow(n, seconds, len(result), steps[-1], peak.bytes))
    return rows


def main(argv: list[str] | None = None) -> None:
    """``python -m triton_sam.bench.everything_served``: a random-init repository written as
    ``setup`` writes it (once, into ``--work``), an embedded server over it, the served rows."""
    import argparse
    import json
    from dataclasses import asdict
    from pathlib import Path

    from triton_sam.bench.harness import embedded, setup_repository
    from triton_sam.models import get_model
    from triton_sam.tools.sample import sample_image

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--model", default="sam2.1_hiera_tiny", help="sam1_vit_b, sam2.1_...")
    parser.add_argument("--points-per-side", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--params", default="{}", help="JSON object of further overrides")
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=427)
    parser.add_argument("--work", type=Path, default=Path(".bench/everything_served"))
    args = parser.parse_args(argv)
    spec = get_model(args.model)
    repo = setup_repository(
        spec,
        args.work / args.model / "model_repository",
        reuse_model=f"{spec.family.family}_everything",
        everything=True,
    )
    image = sample_image(args.width, args.height)
    with embedded(repo) as s:
        rows = served_rows(
            s.grpc_url,
            image,
            args.points_per_side,
            model_type=spec.family.family,
            server_pid=s.pid,
            params=json.loads(args.params),
        )
    for row in rows:
        print(json.dumps(asdict(row)))


if __name__ == "__main__":
    main()
