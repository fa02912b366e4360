"""The storm's report: answers tallied (ok, typed refusals, errors), the server's memory
against its documented bound (:func:`memory_bound`), the files written (``storm.json``,
``storm.md``). The run: :mod:`triton_sam.bench.storm`.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from triton_sam.bench.stats import percentiles, ratio
from triton_sam.errors import InputValidationError, ServerOverloadedError
from triton_sam.repository.cpu_twin import CPU_MAX_CONCURRENT_EMBEDS, CPU_MAX_WAITING_EMBEDS


@dataclass(frozen=True)
class StormSettings:
    """Shape of the storm benchmark.

    Attributes:
        embeds: storm sizes (concurrent embeds), each run twice with fresh images.
        clickers: users clicking on an embedded image meanwhile.
        think_s: each clicker's pause between clicks (uniform in 0.5x-1.5x).
        idle_clicks: clicks per clicker before any storm (their idle latency).
        image_hw: (height, width) of the storm's PNG images.
        timeout_s: per-request timeout.
        sample_every_s: memory sampling period.
        settle_s: pause after each storm (answers sent, buffers returned) before the next.
    """

    embeds: tuple[int, ...] = (64, 256)
    clickers: int = 16
    think_s: float = 0.5
    idle_clicks: int = 10
    image_hw: tuple[int, int] = (240, 320)
    timeout_s: float = 300.0
    sample_every_s: float = 0.5
    settle_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.embeds or any(n < 1 for n in self.embeds):
            raise InputValidationError("embeds", f"got {self.embeds}, expected counts >= 1")
        if self.clickers < 1 or self.idle_clicks < 1:
            raise InputValidationError("clickers", "expected >= 1 clicker and >= 1 idle click")


MIB = 2**20


@dataclass
class Tally:
    """Answers of one kind of request: ok, typed refusals, other errors (with samples)."""

    ok: int = 0
    refused: int = 0
    errors: int = 0
    latency_ms: list[float] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)

    def record(self, t0: float, error: BaseException | None) -> None:
        if error is None:
            self.ok += 1
            self.latency_ms.append((time.perf_counter() - t0) * 1e3)
        elif isinstance(error, ServerOverloadedError):
            self.refused += 1
        else:
            self.errors += 1
            if len(self.error_samples) < 5:
                self.error_samples.append(f"{type(error).__name__}: {error}")

    def summary(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "refused": self.refused,
            "errors": self.errors,
            **percentiles(self.latency_ms, digits=1),
            "error_samples": self.error_samples,
        }


@dataclass
class StormRun:
    """One storm: its embeds, the clicks made meanwhile, the server's memory."""

    embeds: int
    round: int
    embed: Tally = field(default_factory=Tally)
    clicks: Tally = field(default_factory=Tally)
    wall_s: float = 0.0
    start_mib: float = math.nan
    peak_mib: float = math.nan

    def summary(self) -> dict[str, Any]:
        return {
            "embeds": self.embeds,
            "round": self.round,
            "wall_s": round(self.wall_s, 2),
            "embed": self.embed.summary(),
            "clicks": self.clicks.summary(),
            "start_mib": round(self.start_mib, 1),
            "peak_mib": round(self.peak_mib, 1),
        }


@dataclass
class StormReport:
    """Everything one storm benchmark measured."""

    model: str
    settings: StormSettings
    idle: Tally = field(default_factory=Tally)
    runs: list[StormRun] = field(default_factory=list)
    loaded_mib: float = math.nan  # the server tree after the clickers' image was embedded
    request_bytes: int = 0  # the largest file the storms sent

    @property
    def sam2_tiny_cpu_bound_mib(self) -> float:
        """:func:`sam2_cpu_bound` from the loaded server (SAM2.1-tiny, CPU defaults)."""
        if math.isnan(self.loaded_mib):
            return math.nan
        bound = sam2_cpu_bound(self.loaded_mib * MIB, request_bytes=self.request_bytes)
        return bound / MIB

    @property
    def transport_errors(self) -> int:
        return self.idle.errors + sum(r.embed.errors + r.clicks.errors for r in self.runs)

    def growth_mib(self, embeds: int) -> float:
        """Second storm's peak minus the first's, for the storm of ``embeds``."""
        peaks = [r.peak_mib for r in self.runs if r.embeds == embeds]
        return peaks[-1] - peaks[0] if len(peaks) > 1 else math.nan

    def summary(self) -> dict[str, Any]:
        idle = percentiles(self.idle.latency_ms, digits=1)
        runs = []
        for run in self.runs:
            row = run.summary()
            storm = percentiles(run.clicks.latency_ms, digits=1)
            row["click_p95_over_idle_p95"] = ratio(storm["p95"], idle["p95"])
            runs.append(row)
        return {
            "model": self.model,
            "settings": asdict(self.settings),
            "loaded_mib": round(self.loaded_mib, 1),
            "sam2_tiny_cpu_bound_mib": round(self.sam2_tiny_cpu_bound_mib, 1),
            "idle_clicks": self.idle.summary(),
            "runs": runs,
            "growth_mib": {n: round(self.growth_mib(n), 1) for n in self.settings.embeds},
            "transport_errors": self.transport_errors,
        }


def memory_bound(
    *,
    base_bytes: int,
    encoder_bytes: int,
    max_concurrent_embeds: int,
    max_waiting_embeds: int,
    request_bytes: int,
    embed_bytes: int,
    cache_bytes: int,
) -> int:
    """The server tree's memory bound under any number of concurrent embeds (bytes).

    ``base + encoder + (max_concurrent_embeds + max_waiting_embeds) x request +
    max_concurrent_embeds x embed + cache``, where

    - ``base_bytes``: the server with its models loaded and warm (tritonserver, the
      stubs, the decoder's arena and the python backend's shared-memory pool at rest);
    - ``encoder_bytes``: the encoder's working memory for the largest batch it runs (its
      onnxruntime arena; without the arena, what one run allocates);
    - ``request_bytes``: what one embed request holds while it is admitted or waits (its
      file, at most ``max_image_bytes``; the storm's PNGs are far smaller);
    - ``embed_bytes``: what one admitted embed holds beyond its request (decoded pixels,
      the 1024 x 1024 x 3 float32 encoder input, twice: in the stub and in the shared-memory
      pool, and the features it receives, in the pool);
    - ``cache_bytes``: the session model's LRU (``max_bytes``, or ``max_images`` x one
      image's features).
    """
    admitted = max_concurrent_embeds + max_waiting_embeds
    return (
        base_bytes
        + encoder_bytes
        + admitted * request_bytes
        + max_concurrent_embeds * embed_bytes
        + cache_bytes
    )


# SAM2.1-tiny on the embedded (CPU) server, measured with this benchmark and an interleaved
# encoder-only run (2 shared cores, onnxruntime backend, the encoder at batch 1 with its arena,
# one embed at a time): the encoder's arena holds about 0.55 GiB from its first run on, and a
# run's peak stayed within 0.45 GiB above the loaded server; an admitted embed holds its
# 1024 x 1024 x 3 float32 input twice (12 MiB in the stub, 12 MiB in the shared-memory pool)
# and its 16 MiB of features.
SAM2_TINY_CPU_ENCODER_RUN = 2**30
SAM2_TINY_EMBED = 48 * MIB
SAM2_TINY_FEATURES = 16 * MIB


def sam2_cpu_bound(
    loaded_bytes: float,
    *,
    request_bytes: int = 64 * MIB,
    max_concurrent_embeds: int = CPU_MAX_CONCURRENT_EMBEDS,
    max_waiting_embeds: int = CPU_MAX_WAITING_EMBEDS,
    max_images: int = 16,
) -> int:
    """:func:`memory_bound` of SAM2.1-tiny on the embedded server, from the loaded server's
    memory (``loaded_bytes``) and the session model's settings (defaults: the CPU twin's
    admission, the default ``max_images``; ``request_bytes`` defaults to ``max_image_bytes``)."""
    return memory_bound(
        base_bytes=int(loaded_bytes),
        encoder_bytes=SAM2_TINY_CPU_ENCODER_RUN,
        max_concurrent_embeds=max_concurrent_embeds,
        max_waiting_embeds=max_waiting_embeds,
        request_bytes=request_bytes,
        embed_bytes=SAM2_TINY_EMBED,
        cache_bytes=max_images * SAM2_TINY_FEATURES,
    )


def to_mib(value: int | None) -> float:
    """Bytes as MiB; NaN for a sample that could not be read."""
    return math.nan if value is None else value / MIB


def write_report(report: StormReport, out_dir: Path) -> dict[str, Path]:
    """Write ``storm.json`` (everything) and ``storm.md`` (the table)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = report.summary()
    paths = {"json": out_dir / "storm.json", "md": out_dir / "storm.md"}
    paths["json"].write_text(json.dumps(summary, indent=2))
    idle = summary["idle_clicks"]
    s = report.settings
    lines = [
        f"# Embed storm: {report.model}",
        "",
        f"{s.clickers} users click (think time {s.think_s:g} s) on an embedded image while "
        f"the storm's embeds ({s.image_hw[1]}x{s.image_hw[0]} PNGs, all sent at once) run. "
        f"Idle clicks (same users, no storm): p50 {idle['p50']:.0f} ms, p95 {idle['p95']:.0f} "
        f"ms. Server tree (PSS) after load: {report.loaded_mib:.0f} MiB.",
        "",
        "| embeds | round | ok | refused (typed) | errors | wall s | click p50 / p95 ms "
        "| click p95 / idle p95 | clicks ok / errors | peak MiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary["runs"]:
        e, c = row["embed"], row["clicks"]
        lines.append(
            f"| {row['embeds']} | {row['round']} | {e['ok']} | {e['refused']} | {e['errors']} "
            f"| {row['wall_s']:.1f} | {c['p50']:.0f} / {c['p95']:.0f} "
            f"| {row['click_p95_over_idle_p95']:.2f}x | {c['ok']} / {c['errors']} "
            f"| {row['peak_mib']:.0f} |"
        )
    growth = ", ".join(f"{n}: {g:+.0f} MiB" for n, g in summary["growth_mib"].items())
    lines += [
        "",
        f"Peak growth, second storm minus first: {growth}. "
        f"Transport errors: {report.transport_errors}.",
        "",
        f"Memory bound (SAM2.1-tiny on the embedded server, its defaults; docs/"
        f"server-side-embeddings.md): {report.sam2_tiny_cpu_bound_mib:.0f} MiB from the "
        f"loaded server's {report.loaded_mib:.0f} MiB.",
    ]
    paths["md"].write_text("\n".join(lines) + "\n")
    return paths
