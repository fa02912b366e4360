"""Where a session click's time goes, over a grid of session-model settings.

For each (feature store, decoder sizing) of the session model: a copy of the variant's
embedded repository so configured, an embedded server over it, :func:`breakdown.run_breakdown`
(and, when asked, :func:`breakdown.click_throughput`), the host's load average beside the
figures; all the grid's reports in one JSON file. ``triton-sam bench click`` is this function
with options; a notebook calls it directly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from triton_sam.bench import breakdown
from triton_sam.bench.harness import embedded, protocol_url
from triton_sam.bench.paths import ort_sessions
from triton_sam.bench.users import prepare_model
from triton_sam.tools.sample import sample_image

#: One decoder sizing: (instances, intra-op threads), or None for what the writer chose.
Sizing = tuple[int, int] | None


def grid_label(store: str, sizing: Sizing) -> str:
    """The grid cell's name: ``process`` or ``shared_memory-2x1``."""
    return store if sizing is None else f"{store}-{sizing[0]}x{sizing[1]}"


def run_click_grid(
    model: str,
    *,
    work_dir: Path,
    output: Path,
    n: int = 50,
    protocol: str = "grpc",
    stores: Sequence[str] = ("process", "shared_memory"),
    sizings: Sequence[Sizing] = (None,),
    concurrency: int = 0,
    progress: Callable[[str, breakdown.ClickBreakdown], None] | None = None,
) -> Path:
    """Time ``n`` clicks of ``model`` per grid cell and write the reports.

    Args:
        model: the variant, exported once into ``work_dir`` (reused).
        work_dir: exports and the grid's repository copies.
        output: the report directory; the JSON is ``<output>/<model>.json``.
        n: timed clicks per cell.
        protocol: ``"grpc"`` or ``"http"``.
        stores: the session model's feature stores (``process``, ``shared_memory``).
        sizings: decoder sizings, (instances, threads) or None for the host's default.
        concurrency: also time clicks per second with this many callers (0: no).
        progress: called with each cell's label and report as soon as it is measured.

    Returns:
        The JSON file: label -> :meth:`ClickBreakdown.as_dict` (settings include the feature
        store, the sizing, the CPU count and the load average after the cell).
    """
    served = prepare_model(model, work_dir, runner=False)
    family = served.spec.family
    sessions = ort_sessions(served.repository, family)
    image = sample_image()
    output.mkdir(parents=True, exist_ok=True)
    reports = {}
    for store, sizing in ((st, sz) for st in stores for sz in sizings):
        label = grid_label(store, sizing)
        repo = breakdown.variant_repository(
            served.repository, work_dir / model / f"click-{label}", family,
            cpu_features=store, decoder_sizing=sizing,
        )  # fmt: skip
        with embedded(repo) as server:
            urls = {"grpc": server.grpc_url, "http": server.http_url,
                    "stats": server.http_url, "metrics": server.metrics_url}  # fmt: skip
            report = breakdown.run_breakdown(family, urls, sessions, image, protocol=protocol, n=n)
            if concurrency:
                report.throughput = breakdown.click_throughput(
                    family, protocol_url(server, protocol), sessions, image, protocol=protocol,
                    concurrency=concurrency, n=max(n, 4 * concurrency),
                )  # fmt: skip
        report.settings |= {
            "cpu_features": store,
            "cpu_count": os.cpu_count(),
            "decoder_sizing": label.removeprefix(store).lstrip("-") or "default",
            "load_average": list(os.getloadavg()),
        }
        reports[label] = report.as_dict()
        if progress is not None:
            progress(label, report)
    path = output / f"{model}.json"
    path.write_text(json.dumps(reports, indent=1))
    return path
