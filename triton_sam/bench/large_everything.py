"""Segment everything on a large image: the server's tiled jobs against micro-sam's
``TiledAutomaticMaskGenerator``, in one run, on the same SAM1 weights, image, tile, halo and
generator parameters (``triton-sam bench everything-large``).

- **ours**: one everything job per tile on the server (the job reads its block from the
  ``<family>_large`` model, embeds it and runs the official generator), the pieces of objects
  that cross tile edges joined into one instance by the client
  (:func:`~triton_sam.client.everything_tiled.segment_large`); the time from the first job to
  the joined result;
- **micro-sam**: ``util.precompute_image_embeddings`` over every tile, then
  ``TiledAutomaticMaskGenerator.initialize`` + ``generate`` in this process, with its
  defaults where we have no counterpart (``with_background``: its largest instance is
  dropped; its instances are cut where tiles meet and merged only by crop NMS).

Counts are checked, not assumed: our encoder runs (Triton's statistics) must equal the tiles,
and micro-sam's embedded tiles the same tiles. The goal the issue set is ours at most 0.5x
micro-sam's time.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from triton_sam.bench.large import encoder_runs
from triton_sam.bench.stats import ratio

# micro-sam's generate() defaults, sent to ours as the official generator's parameters
THRESHOLDS = {"pred_iou_thresh": 0.88, "stability_score_thresh": 0.95, "box_nms_thresh": 0.7}


@dataclass(frozen=True)
class EverythingRow:
    """One image's run: seconds, instances and tiles of both sides."""

    side: tuple[int, int]
    tile: tuple[int, int]
    halo: tuple[int, int]
    points_per_side: int
    tiles: int
    ours_s: float
    ours_instances: int
    ours_joined: int  # instances made of pieces from more than one tile
    micro_sam_s: float
    micro_sam_instances: int
    ratio: float  # ours_s / micro_sam_s (the goal: at most 0.5)


def ours(image, http_url: str, grpc_url: str | None, points_per_side: int,
         points_per_batch: int, thresholds: dict[str, float]) -> dict[str, Any]:  # fmt: skip
    """Everything on an open :class:`~triton_sam.client.large_image.LargeImage`."""
    before = encoder_runs(http_url)
    t0 = time.perf_counter()
    result = image.segment_everything(
        grpc_url=grpc_url,
        points_per_side=points_per_side,
        points_per_batch=points_per_batch,
        **thresholds,
    )
    seconds = time.perf_counter() - t0
    ran = encoder_runs(http_url) - before
    if ran != result.tiles:
        raise AssertionError(f"the server's encoders ran {ran} times for {result.tiles} tiles")
    joined = sum(len(inst.pieces) > 1 for inst in result.instances)
    return {"s": seconds, "instances": len(result), "tiles": result.tiles, "joined": joined}


def micro_sams(predictor, image: np.ndarray, tile, halo, points_per_side, points_per_batch,
               thresholds: dict[str, float]):  # fmt: skip
    """micro-sam's tiled automatic segmentation of ``image`` (all in memory, as its API
    takes it): seconds, instances, tiles embedded."""
    from triton_sam.bench.micro_sam_ref import micro_sam, tiled_generator

    util = micro_sam().util
    t0 = time.perf_counter()
    embeddings = util.precompute_image_embeddings(
        predictor, image, tile_shape=tuple(tile), halo=tuple(halo), verbose=False
    )
    generator = tiled_generator()(
        predictor, points_per_side=points_per_side, points_per_batch=points_per_batch
    )
    generator.initialize(image, embeddings, tile_shape=tuple(tile), halo=tuple(halo))
    labels = generator.generate(**thresholds)
    seconds = time.perf_counter() - t0
    found = np.unique(np.asarray(labels))
    tiles = sum(1 for _ in embeddings["features"].array_keys())  # one array per tile
    return {"s": seconds, "instances": int(np.count_nonzero(found)), "tiles": tiles}


def everything_row(
    image, pixels: np.ndarray, predictor, http_url: str, *, grpc_url: str | None = None,
    points_per_side: int, points_per_batch: int = 64, thresholds: dict[str, float] | None = None,
) -> EverythingRow:  # fmt: skip
    """Both sides on the same image: ``image`` (opened on the server with the mapping
    ``tile_minmax``, micro-sam's) and ``pixels`` (its uint8 array, for micro-sam); the
    server's statistics at ``http_url``, its jobs streamed over ``grpc_url``. ``thresholds``:
    the generator's filters, the same for both (None: micro-sam's defaults)."""
    tile, halo = tuple(image.tile), tuple(image.halo)
    thresholds = dict(THRESHOLDS if thresholds is None else thresholds)
    grid = (points_per_side, points_per_batch, thresholds)
    served = ours(image, http_url, grpc_url, *grid)
    reference = micro_sams(predictor, pixels, tile, halo, *grid)
    if reference["tiles"] != served["tiles"]:
        raise AssertionError(f"micro-sam embedded {reference['tiles']} tiles, ours {served}")
    return EverythingRow(
        side=tuple(int(s) for s in pixels.shape[:2]),
        tile=tile,
        halo=halo,
        points_per_side=points_per_side,
        tiles=served["tiles"],
        ours_s=round(served["s"], 2),
        ours_instances=served["instances"],
        ours_joined=served["joined"],
        micro_sam_s=round(reference["s"], 2),
        micro_sam_instances=reference["instances"],
        ratio=ratio(served["s"], reference["s"]),
    )


def markdown(row: EverythingRow) -> str:
    """The row as docs/large-images.md's table."""
    rows, cols = row.side
    return "\n".join(
        [
            f"Segment everything on {rows:,} x {cols:,} ({row.tiles} tiles of {row.tile[0]} + "
            f"halo {row.halo[0]}, {row.points_per_side}² points per tile):",
            "",
            "| | seconds | instances | joined across tiles |",
            "|---|---|---|---|",
            f"| micro-sam TiledAutomaticMaskGenerator | {row.micro_sam_s} | "
            f"{row.micro_sam_instances} | - |",
            f"| served (tiled jobs, joined) | {row.ours_s} | {row.ours_instances} | "
            f"{row.ours_joined} |",
            f"| ratio (goal ≤ 0.5) | {row.ratio} | | |",
            "",
        ]
    )


def write_report(row: EverythingRow, out: Path) -> dict[str, Path]:
    """``everything_large.json``, ``.md`` and ``.png`` (seconds of both sides) in ``out``."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = {kind: out / f"everything_large.{kind}" for kind in ("json", "md", "png")}
    paths["json"].write_text(json.dumps(asdict(row), indent=2))
    paths["md"].write_text(markdown(row))
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar([0, 1], [row.micro_sam_s, row.ours_s])
    ax.set_xticks([0, 1], ["micro-sam tiled AMG", "served, tiled + joined"])
    ax.set_ylabel("seconds")
    ax.set_title(f"everything on {row.side[0]:,}²: ratio {row.ratio}")
    fig.tight_layout()
    fig.savefig(paths["png"], dpi=100)
    plt.close(fig)
    return paths
