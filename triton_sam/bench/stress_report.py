"""The stress run's report: per mode, what the client sent and what the server's own counters
say ran, against the decoder time D of the same run (``stress.json``, ``stress.md``). The
run: :mod:`triton_sam.bench.stress`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from triton_sam.bench.bounds import at_least, check_bounds, positive
from triton_sam.bench.stats import percentiles


@dataclass(frozen=True)
class DragSettings:
    """Shape of the simulated interaction.

    Attributes:
        events: mouse events per drag.
        rate_hz: events per second.
        sessions: concurrent sessions (users), each dragging.
        repeats: drags per session, one after another.
    """

    events: int = at_least(1, default=50)
    rate_hz: float = positive(100.0)
    sessions: int = at_least(1, default=4)
    repeats: int = at_least(1, default=1)

    def __post_init__(self) -> None:
        check_bounds(self)

    @property
    def duration_s(self) -> float:
        """Nominal drag duration: first to last event."""
        return (self.events - 1) / self.rate_hz


@dataclass
class ModeResult:
    """What one mode did, client side and server side.

    Attributes:
        events: mouse events issued.
        requests_sent: decoder requests the client sent.
        refused: requests the server refused at once as overloaded (its click queue was
            full: the reference behaviour sends every event, more than it holds).
        cancelled_client: requests the client cancelled (``cancel``), or that the reference
            would have marked cancelled locally (``reference``: still running at drag end).
        superseded: events never sent (``latest``).
        server: the server's counters over the mode (``executed``, ``cancelled``...).
        last_event_to_mask_ms: per drag, from the last event to its mask.
        drag_ms: per drag, measured duration from its first to its last event.
        wall_s: the mode's duration.
    """

    mode: str
    events: int = 0
    requests_sent: int = 0
    cancelled_client: int = 0
    superseded: int = 0
    refused: int = 0
    server: dict[str, int] = field(default_factory=dict)
    last_event_to_mask_ms: list[float] = field(default_factory=list)
    drag_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    def latency(self) -> dict[str, float]:
        """p50/p95/p99/max of the last-event-to-mask times, in ms (NaN when none)."""
        return percentiles(self.last_event_to_mask_ms)


@dataclass
class StressReport:
    """A stress run: settings, the decoder time D of this run, and one result per mode.

    ``counted`` names the models whose counters fill ``ModeResult.server``: the decoders
    that ran the clicks, then the session model they went through (if any).
    """

    model: str
    protocol: str
    settings: DragSettings
    counted: list[str] = field(default_factory=list)
    decoder_ms: list[float] = field(default_factory=list)
    decoder_concurrent_ms: list[float] = field(default_factory=list)
    modes: dict[str, ModeResult] = field(default_factory=dict)

    @property
    def decoder_p50_ms(self) -> float:
        """D: median round trip of one isolated decoder request (same client, same run)."""
        return float(np.median(self.decoder_ms)) if self.decoder_ms else math.nan

    @property
    def decoder_concurrent_p50_ms(self) -> float:
        """D_S: median time for one request per session, all sent at once (= D for one
        session): what a decoder round trip costs when every session has one in flight."""
        if not self.decoder_concurrent_ms:
            return self.decoder_p50_ms
        return float(np.median(self.decoder_concurrent_ms))

    def execution_bound(self) -> int:
        """ceil(nominal drag duration / D) + 2: what latest-wins may execute per drag."""
        d_s = self.decoder_p50_ms / 1e3
        return math.ceil(self.settings.duration_s / d_s) + 2

    def table(self) -> list[dict[str, Any]]:
        """One row per mode (see :func:`write_report` for the columns)."""
        drags = self.settings.sessions * self.settings.repeats
        rows = []
        for name, r in self.modes.items():
            lat = r.latency()
            rows.append(
                {
                    "mode": name,
                    "events": r.events,
                    "requests_sent": r.requests_sent,
                    "superseded": r.superseded,
                    "refused": r.refused,
                    "cancelled_client": r.cancelled_client,
                    "executed": r.server.get("executed", 0),
                    "executed_per_drag": r.server.get("executed", 0) / drags,
                    "cancelled_server": r.server.get("cancelled", 0),
                    "dropped_by_triton": r.server.get("canceled", 0),
                    "skipped_by_runner": r.server.get("skipped", 0),
                    "unrun_by_session_model": r.server.get("session_cancelled", 0),
                    "model_executions": r.server.get("execution_count", 0),
                    "last_event_to_mask_p50_ms": lat["p50"],
                    "last_event_to_mask_p95_ms": lat["p95"],
                    "last_event_to_mask_p99_ms": lat["p99"],
                    "p95_over_D": lat["p95"] / self.decoder_p50_ms,
                    "p95_over_D_sessions": lat["p95"] / self.decoder_concurrent_p50_ms,
                }
            )
        return rows


def write_report(report: StressReport, out_dir: Path) -> dict[str, Path]:
    """Write ``stress.json`` and ``stress.md`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = report.table()
    d_ms = report.decoder_p50_ms
    s = report.settings
    payload = {
        "model": report.model,
        "protocol": report.protocol,
        "settings": asdict(s),
        "decoder_ms": {"samples": report.decoder_ms, "p50": d_ms},
        "decoder_at_sessions_ms": {
            "samples": report.decoder_concurrent_ms,
            "p50": report.decoder_concurrent_p50_ms,
        },
        "execution_bound_per_drag": report.execution_bound(),
        "counted_models": report.counted,
        "rows": rows,
        "modes": {k: asdict(v) for k, v in report.modes.items()},
    }
    paths = {"json": out_dir / "stress.json", "md": out_dir / "stress.md"}
    paths["json"].write_text(json.dumps(payload, indent=2))
    lines = [
        f"# Speculative decoding stress: {report.model} ({report.protocol})",
        "",
        f"{s.sessions} concurrent session(s) x {s.repeats} drag(s) of {s.events} events at "
        f"{s.rate_hz:g} Hz ({s.duration_s * 1e3:.0f} ms per drag). D = {d_ms:.0f} ms "
        f"(median isolated decoder round trip, this run); ceil(drag / D) + 2 = "
        f"{report.execution_bound()} per drag. D_S = {report.decoder_concurrent_p50_ms:.0f} ms "
        f"(one request per session, all at once).",
        "",
        "| mode | events | requests sent | superseded (never sent) | refused (overloaded) "
        "| cancelled by client "
        "| executed (server) | per drag | cancelled (server: dropped + skipped + unrun) "
        "| model executions | last event → mask p50 / p95 ms | p95 / D | p95 / D_S |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['events']} | {r['requests_sent']} | {r['superseded']} "
            f"| {r['refused']} | {r['cancelled_client']} | {r['executed']} "
            f"| {r['executed_per_drag']:.1f} "
            f"| {r['cancelled_server']} ({r['dropped_by_triton']} + {r['skipped_by_runner']} "
            f"+ {r['unrun_by_session_model']}) "
            f"| {r['model_executions']} | {r['last_event_to_mask_p50_ms']:.0f} / "
            f"{r['last_event_to_mask_p95_ms']:.0f} | {r['p95_over_D']:.2f} "
            f"| {r['p95_over_D_sessions']:.2f} |"
        )
    counted = ", ".join(f"`{m}`" for m in report.counted) or "none"
    lines += [
        "",
        f"Counted: {counted}. Executed = the `inference_count` (`/v2/models/<m>/stats`) of the "
        "decoders that ran the clicks (through the session model: the decoder its config "
        "names) minus the python-runner fallback's `triton_sam_cancelled_requests_skipped` "
        "(`/metrics`; 0 on the onnxruntime backend, which has no runner); "
        'dropped = `nv_inference_request_failure{reason="CANCELED"}` (decoders and session '
        "model); unrun = `triton_sam_session_cancelled_clicks` (clicks the session model "
        "answered unrun, cancelled while they waited for a decoder slot). For `reference`, "
        "'cancelled by client' counts the requests still running at drag end, which the "
        "reference only marks cancelled in a dict.",
    ]
    paths["md"].write_text("\n".join(lines) + "\n")
    return paths
