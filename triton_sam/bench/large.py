"""Large images, measured in one run: open and first mask, clicks, precompute, memory.

What a lab user of a 20,000 px EM section waits for, against the same things on a 1,024 px
image on the same server in the same run (``triton-sam bench large``):

- **open + first mask**: ``open_dataset`` (nothing is embedded; a percentile mapping reads a
  bounded sample) and the first click (it embeds the one tile it needs), for the small and
  the large image, with the bytes the click sent and received;
- **clicks**: a click on a held tile of the large image (``mode="tile"``) against a click on
  the small image through the session model (``set_image`` + ``predict``), interleaved so
  load falls on both alike; p50/p95 and their ratio (the goal is at most 1.3x). The Python
  client sends a click on a held tile straight to the session model; the same click through
  the large model (as the page and curl send it) is a third row;
- **precompute**: tiles per second of ``precompute`` over a region, against the encoder
  alone (distinct 1,024 px images embedded through the session model, the same encoder at
  the same size); the goal is at least 0.9x;
- **memory**: the peak of the server's process tree (PSS) and of this client process.

Every count is the server's: the encoder runs each row caused are read from Triton's
statistics and must equal what the row says it embedded (a row whose count differs fails).

Both images are synthetic uint8 zarr arrays written chunk by chunk under a data root the
embedded server is given (never allocated whole), smooth enough to compress to a few MB.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from triton_sam.bench.stats import percentiles, ratio

CHUNK = 1024
ROOT = "bench"  # the data root's name the datasets are opened under


@dataclass(frozen=True)
class LargeBenchSettings:
    """What one run measures.

    Attributes:
        small, large: sides of the two square images (pixels).
        clicks: timed clicks per row (after one warm click each).
        precompute_tiles: tiles the precompute row embeds (and images the encoder row does).
    """

    small: int = 1024
    large: int = 20_000
    clicks: int = 30
    precompute_tiles: int = 8


@dataclass
class LargeReport:
    """The run's rows (see the module doc); times in milliseconds, rates per second."""

    settings: dict[str, Any]
    open_first: list[dict[str, Any]] = field(default_factory=list)
    clicks: dict[str, Any] = field(default_factory=dict)
    precompute: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)


def datasets(folder: Path, sides) -> Path:
    """``folder`` holding ``<side>.zarr`` for each side (written once; kept for later runs)."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    for side in sides:
        final = folder / f"{side}.zarr"
        if not final.exists():  # written aside and renamed: an interrupted write is no dataset
            partial = folder / f".{side}.zarr.partial"
            shutil.rmtree(partial, ignore_errors=True)
            write_dataset(partial, side)
            partial.rename(final)
    return folder


def write_dataset(path: Path, side: int, *, seed: int = 0):
    """A ``side`` x ``side`` uint8 zarr array of smooth blobs, written chunk by chunk."""
    import zarr

    array = zarr.open_array(
        str(path), mode="w", shape=(side, side), chunks=(CHUNK, CHUNK), dtype="uint8"
    )
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0, side, (max(4, side * side // 200_000), 2))
    for r0 in range(0, side, CHUNK):
        for c0 in range(0, side, CHUNK):
            rows = np.arange(r0, min(r0 + CHUNK, side))[:, None]
            cols = np.arange(c0, min(c0 + CHUNK, side))[None, :]
            near = centres[
                (np.abs(centres[:, 0] - (r0 + CHUNK / 2)) < 2 * CHUNK)
                & (np.abs(centres[:, 1] - (c0 + CHUNK / 2)) < 2 * CHUNK)
            ]
            block = np.full((rows.size, cols.size), 40.0)
            for cr, cc in near:
                block += 160 * np.exp(-((rows - cr) ** 2 + (cols - cc) ** 2) / (2 * 60.0**2))
            array[r0 : r0 + rows.size, c0 : c0 + cols.size] = np.clip(block, 0, 255)
    return array


def encoder_runs(http_url: str) -> int:
    """Inferences the server's encoder models ran (Triton's statistics)."""
    import urllib.request

    with urllib.request.urlopen(f"{http_url}/v2/models/stats", timeout=10) as r:
        stats = json.load(r)["model_stats"]
    return sum(int(m.get("inference_count", 0)) for m in stats if "encoder" in m["name"])


def _timed(call):
    t0 = time.perf_counter()
    value = call()
    return value, (time.perf_counter() - t0) * 1e3


def open_and_first_mask(client, http_url: str, side: int) -> dict[str, Any]:
    """Open ``bench/<side>.zarr`` and click at its centre (embeds one tile)."""
    before = encoder_runs(http_url)
    image, open_ms = _timed(lambda: client.open_dataset(f"{ROOT}/{side}.zarr"))
    point = [list(held_tile_centre(image))]
    masks, first_ms = _timed(
        lambda: image.predict(point_coords=point, point_labels=[1], mode="tile")
    )
    embedded = image.last_answer.embedded
    runs = encoder_runs(http_url) - before
    if runs != embedded:
        raise AssertionError(f"{side}: the server ran the encoder {runs} times, said {embedded}")
    answer_bytes = sum(len(m.counts) for m in masks)
    return {
        "side": side,
        "open_ms": round(open_ms, 1),
        "first_mask_ms": round(first_ms, 1),
        "encoder_runs": runs,
        "request_bytes": len(
            json.dumps({"op": "predict", "points": point, "labels": [1], "mode": "tile"})
        ),  # fmt: skip
        "mask_bytes": answer_bytes,
        "image": image,
    }


def held_tile_centre(image) -> tuple[int, int]:
    """(X, Y) of the centre of the core of the tile holding the image's centre: the first
    click lands there, and the timed clicks around it stay in that tile."""
    rows, cols = image.image_size
    tile = image.tile
    r0, c0 = (rows // 2) // tile[0] * tile[0], (cols // 2) // tile[1] * tile[1]
    return (c0 + min(tile[1], cols - c0) // 2, r0 + min(tile[0], rows - r0) // 2)


def interleaved_clicks(large_image, small_client, n: int, rng) -> dict[str, Any]:
    """``n`` clicks on a held tile of the large image, the same through the large model, and
    on the small image, in turn.

    ``large``: the Python client's click (``predict``; on a held tile it goes straight to the
    session model, client/large_clicks.py). ``via_large_model``: the same request as the page
    and curl send it, answered by the large model (one more hop, over BLS)."""
    x, y = held_tile_centre(large_image)
    spread = max(1, min(60, *large_image.tile) // 4)  # inside the held tile's core
    times: dict[str, list[float]] = {"large": [], "via_large_model": [], "small": []}
    for _ in range(n):
        dx, dy = rng.integers(-spread, spread, 2)
        point = [[x + int(dx), y + int(dy)]]
        # mode "tile": the held tile answers (auto would move a cut mask to a window, which
        # embeds: that is a first click's cost, measured in the open + first mask row)
        _, ms = _timed(
            lambda p=point: large_image.predict(point_coords=p, point_labels=[1], mode="tile")
        )
        if large_image.last_answer.embedded:
            raise AssertionError("a click on a held tile ran the encoder")
        times["large"].append(ms)
        answer, ms = _timed(
            lambda p=point: large_image.request("predict", points=p, labels=[1], mode="tile")
        )
        if answer["embedded"]:
            raise AssertionError("a click on a held tile ran the encoder")
        times["via_large_model"].append(ms)
        small = [[512 + int(dx), 512 + int(dy)]]
        _, ms = _timed(lambda p=small: small_client.predict(p, [1]))
        times["small"].append(ms)
    found = {name: percentiles(values, digits=2) for name, values in times.items()}
    small_p = found["small"]
    return {
        **found,
        "ratio_p50": ratio(found["large"]["p50"], small_p["p50"]),
        "ratio_p95": ratio(found["large"]["p95"], small_p["p95"]),
        "via_large_model_ratio_p50": ratio(found["via_large_model"]["p50"], small_p["p50"]),
        "via_large_model_ratio_p95": ratio(found["via_large_model"]["p95"], small_p["p95"]),
    }


def precompute_rate(large_image, small_client, http_url: str, tiles: int, rng) -> dict:
    """Tiles per second of ``precompute`` against distinct images through the encoder."""
    tile = large_image.tile
    count = min(tiles, large_image.grid[1])
    # the second row of tiles, from the left: none of them was embedded by a click before
    region = (tile[0], 0, 2 * tile[0], tile[1] * count)
    before = encoder_runs(http_url)
    result, ms = _timed(lambda: large_image.precompute(region=region, progress=False))
    runs = encoder_runs(http_url) - before
    if runs != result.embedded:
        raise AssertionError(f"precompute: {runs} encoder runs, the answers said {result.embedded}")
    images = [rng.integers(0, 256, (1024, 1024, 3), dtype=np.uint8) for _ in range(tiles)]
    before = encoder_runs(http_url)
    t0 = time.perf_counter()
    for image in images:
        small_client.set_image(image)
    encoder_s = time.perf_counter() - t0
    if encoder_runs(http_url) - before != tiles:
        raise AssertionError("the encoder row did not embed each image once")
    ours = result.embedded / (ms / 1e3)
    alone = tiles / encoder_s
    return {
        "tiles": result.embedded,
        "tiles_per_s": round(ours, 3),
        "encoder_images_per_s": round(alone, 3),
        "ratio": ratio(ours, alone),
    }


def run_large_benchmark(url: str, http_url: str, settings: LargeBenchSettings, *,
                        server_pid: int | None, model_type: str) -> LargeReport:  # fmt: skip
    """One run against a server whose data root ``bench`` holds ``<side>.zarr`` for both
    sides (:func:`write_dataset`)."""
    from triton_sam.bench.memory import PeakMemory, process_tree_rss
    from triton_sam.client import SAM2TritonClient

    rng = np.random.default_rng(0)
    report = LargeReport(asdict(settings))
    # what this process held before (an export in the same process, the datasets written):
    # the client's cost is what it grows by during the run
    # (this process alone: an embedded server is its child, and is measured as the server)
    baseline = process_tree_rss(_own_pid(), children=False) or 0
    with (
        PeakMemory(server_pid, 0.2) as server_peak,
        PeakMemory(_own_pid(), 0.2, children=False) as client_peak,
        SAM2TritonClient(url, model_type=model_type) as client,
    ):
        rows = []
        for side in (settings.small, settings.large):
            # the server's peak while it opens the image and embeds and answers a click on
            # it: the same for both sizes when nothing holds the image in memory
            with PeakMemory(server_pid, 0.1) as opening:
                rows.append(open_and_first_mask(client, http_url, side))
            rows[-1]["server_peak_bytes"] = opening.bytes
        large_image = rows[-1].pop("image")
        rows[0].pop("image").close()
        report.open_first = rows
        client.set_image(rng.integers(0, 256, (1024, 1024, 3), dtype=np.uint8))
        client.predict([[512, 512]], [1])  # warm
        report.clicks = interleaved_clicks(large_image, client, settings.clicks, rng)
        report.precompute = precompute_rate(
            large_image, client, http_url, settings.precompute_tiles, rng
        )
        large_image.close()
    report.memory = {
        "server_peak_bytes": server_peak.bytes,
        "client_peak_bytes": client_peak.bytes,
        "client_growth_bytes": max(0, (client_peak.bytes or 0) - baseline),
    }
    return report


def markdown(report: LargeReport) -> str:
    """The report as the tables of docs/large-images.md."""
    lines = ["| image | open (ms) | first mask (ms) | encoder runs | request B | mask B "
             "| server peak (MiB) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in report.open_first:
        peak = row.get("server_peak_bytes")
        lines.append(
            f"| {row['side']:,}² | {row['open_ms']} | {row['first_mask_ms']} | "
            f"{row['encoder_runs']} | {row['request_bytes']} | {row['mask_bytes']} | "
            f"{'-' if peak is None else round(peak / 2**20)} |"
        )
    c = report.clicks
    lines += [
        "",
        "| click | p50 (ms) | p95 (ms) |",
        "|---|---|---|",
        f"| {report.settings['small']:,}² (session model) | {c['small']['p50']} | "
        f"{c['small']['p95']} |",
        f"| {report.settings['large']:,}², tile held | {c['large']['p50']} | {c['large']['p95']} |",
        f"| ratio | {c['ratio_p50']} | {c['ratio_p95']} |",
    ]
    if "via_large_model" in c:  # the page's and curl's path: through the large model
        v = c["via_large_model"]
        lines += [
            f"| {report.settings['large']:,}², tile held, through the large model (page, curl) "
            f"| {v['p50']} | {v['p95']} |",
            f"| its ratio | {c['via_large_model_ratio_p50']} | {c['via_large_model_ratio_p95']} |",
        ]
    p = report.precompute
    lines += [
        "",
        "| | per second | ratio |",
        "|---|---|---|",
        f"| encoder alone (1,024² images) | {p['encoder_images_per_s']} | 1 |",
        f"| precompute ({p['tiles']} tiles) | {p['tiles_per_s']} | {p['ratio']} |",
    ]
    m = report.memory
    lines += ["", "| process | peak (MiB) |", "|---|---|"]
    rows = (
        ("server", "server_peak_bytes"),
        ("client (growth during the run)", "client_growth_bytes"),
    )
    for name, key in rows:
        value = m.get(key)
        lines.append(f"| {name} | {'-' if value is None else round(value / 2**20)} |")
    return "\n".join(lines) + "\n"


def write_report(report: LargeReport, out: Path) -> dict[str, Path]:
    """``large.json``, ``large.md`` and ``large.png`` (clicks and precompute) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {kind: out / f"large.{kind}" for kind in ("json", "md", "png")}
    paths["json"].write_text(json.dumps(asdict(report), indent=2))
    paths["md"].write_text(markdown(report))
    _plot(report, paths["png"])
    return paths


def _plot(report: LargeReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (clicks, rates) = plt.subplots(1, 2, figsize=(9, 3.4))
    c, s = report.clicks, report.settings
    names = [n for n in ("small", "large", "via_large_model") if n in c]
    labels = {"small": f"{s['small']:,}²", "large": f"{s['large']:,}² held",
              "via_large_model": "via large model"}  # fmt: skip
    for offset, key in ((-0.2, "p50"), (0.2, "p95")):
        values = [c[n][key] for n in names]
        clicks.bar(np.arange(len(names)) + offset, values, width=0.4, label=key)
    clicks.set_xticks(range(len(names)), [labels[n] for n in names])
    clicks.set_ylabel("ms")
    clicks.set_title(f"click: ratio p50 {c['ratio_p50']}, p95 {c['ratio_p95']}")
    clicks.legend()
    p = report.precompute
    rates.bar([0, 1], [p["encoder_images_per_s"], p["tiles_per_s"]])
    rates.set_xticks([0, 1], ["encoder alone", "precompute"])
    rates.set_ylabel("tiles (images) per second")
    rates.set_title(f"precompute: ratio {p['ratio']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _own_pid() -> int:
    import os

    return os.getpid()
