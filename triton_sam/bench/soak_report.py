"""The soak's report: its figures (latency percentiles, memory growth, server counts) and
the files written from them (``soak.json``, ``soak.md``). The run: :mod:`triton_sam.bench.soak`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from triton_sam.bench.bounds import at_least, check_bounds, positive
from triton_sam.bench.memory import MemorySample
from triton_sam.bench.stats import percentiles


@dataclass(frozen=True)
class SoakSettings:
    """Shape of the soak.

    Attributes:
        sessions: concurrent sessions (users), each with its own connection.
        duration_s: how long the sessions prompt, after every image is encoded.
        images: distinct images encoded (0 = one per session).
        encode_every: re-encode the session's image after this many prompts (0 = never).
        sample_every_s: memory sampling period.
        timeout_s: per-request timeout of the clients.
        warmup_s: prompting before memory growth is measured (pools and arenas of the
            server grow to the load's batch sizes first); counted in the requests.
        server_embeddings: keep the embeddings on the server (the ``<family>_session``
            model, the clients' default) where the server offers it; False measures the
            stateless path, where each request carries the embeddings.
    """

    sessions: int = at_least(1, default=16)
    duration_s: float = positive(60.0)
    images: int = at_least(0, default=0)
    encode_every: int = at_least(0, default=0)
    sample_every_s: float = positive(0.5)
    timeout_s: float = positive(120.0)
    server_embeddings: bool = True
    warmup_s: float = 0.0

    def __post_init__(self) -> None:
        check_bounds(self)


MIB = 2**20


@dataclass
class SoakReport:
    """What a soak did. Latencies in ms; memory in bytes.

    ``server`` holds the server's counters of the clicks over the prompting phase
    (``executed``, ``cancelled``...; empty when its statistics endpoint is not known), read
    from the models named in ``counted``.
    """

    model: str
    protocol: str
    settings: SoakSettings
    server: dict[str, int] = field(default_factory=dict)
    counted: list[str] = field(default_factory=list)
    requests: int = 0
    failures: int = 0
    errors: list[str] = field(default_factory=list)
    decode_ms: list[float] = field(default_factory=list)
    encode_ms: list[float] = field(default_factory=list)
    prompts_s: float = 0.0
    memory: list[MemorySample] = field(default_factory=list)

    percentiles = staticmethod(percentiles)  # p50/p95/p99/max (NaN when empty)

    @property
    def throughput(self) -> float:
        """Decoder requests per second over the prompting phase."""
        return len(self.decode_ms) / self.prompts_s if self.prompts_s else math.nan

    def memory_summary(self, who: str) -> dict[str, float]:
        """``who`` = "client" | "server": max, and growth from the first to the last third
        of the prompting phase (medians, so one spike is not growth), in MiB."""
        values = [getattr(s, who) for s in self.memory if getattr(s, who) is not None]
        if not values:
            return {"max_mib": math.nan, "start_mib": math.nan, "end_mib": math.nan}
        third = max(1, len(values) // 3)
        start, end = float(np.median(values[:third])), float(np.median(values[-third:]))
        return {
            "max_mib": max(values) / MIB,
            "start_mib": start / MIB,
            "end_mib": end / MIB,
            "growth_mib": (end - start) / MIB,
        }

    def summary(self) -> dict[str, Any]:
        """The headline figures (what the JSON and markdown reports lead with)."""
        return {
            "requests": self.requests,
            "failures": self.failures,
            "executed_server": self.server.get("executed"),
            "decode_ms": self.percentiles(self.decode_ms),
            "encode_ms": self.percentiles(self.encode_ms),
            "decode_per_s": self.throughput,
            "client_rss": self.memory_summary("client"),
            "server_rss": self.memory_summary("server"),
        }


def write_report(report: SoakReport, out_dir: Path) -> dict[str, Path]:
    """Write ``soak.json`` (everything, samples included) and ``soak.md`` (the summary)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = report.summary()
    payload = {
        "model": report.model,
        "protocol": report.protocol,
        "settings": asdict(report.settings),
        "summary": summary,
        "errors": report.errors,
        "memory": [asdict(s) for s in report.memory],
        "decode_ms": report.decode_ms,
        "encode_ms": report.encode_ms,
    }
    paths = {"json": out_dir / "soak.json", "md": out_dir / "soak.md"}
    paths["json"].write_text(json.dumps(payload, indent=2))
    s, dec, enc = report.settings, summary["decode_ms"], summary["encode_ms"]
    cli, srv = summary["client_rss"], summary["server_rss"]
    executed = "-" if summary["executed_server"] is None else summary["executed_server"]
    lines = [
        f"# Soak: {report.model} ({report.protocol})",
        "",
        f"{s.sessions} concurrent sessions for {report.prompts_s:.0f} s "
        f"({s.images or s.sessions} image(s) encoded"
        + (f", re-encoded every {s.encode_every} prompts" if s.encode_every else "")
        + ").",
        "",
        "| requests | failures | decodes executed (server) | decode p50 / p95 / p99 / max ms "
        "| decodes/s | encode p50 / p95 ms | client RSS max (growth) MiB "
        "| server RSS max (growth) MiB |",
        "|---|---|---|---|---|---|---|---|",
        f"| {report.requests} | {report.failures} | {executed} "
        f"| {dec['p50']:.0f} / {dec['p95']:.0f} / "
        f"{dec['p99']:.0f} / {dec['max']:.0f} | {report.throughput:.1f} | "
        f"{enc['p50']:.0f} / {enc['p95']:.0f} | {cli['max_mib']:.0f} "
        f"({cli.get('growth_mib', math.nan):+.0f}) | {srv['max_mib']:.0f} "
        f"({srv.get('growth_mib', math.nan):+.0f}) |",
        "",
        "Server RSS = PSS of tritonserver + its python-backend stub processes (shared memory "
        "counted once); growth = median of "
        "the last third of the samples minus the median of the first third. Decodes "
        "executed = the `inference_count` of the decoders that ran the clicks ("
        + (", ".join(f"`{m}`" for m in report.counted) or "not read")
        + "), over the prompting phase.",
    ]
    if report.errors:
        lines += ["", "Errors (first ones):", *[f"- {e}" for e in report.errors]]
    paths["md"].write_text("\n".join(lines) + "\n")
    return paths
