"""The replicas benchmark's report: what the proxy's log and the replicas' counters say.

:func:`fill_report` turns the access log (which replica answered each request, before and
after the kill) and each replica's own counters (encoder inferences, session-model misses,
read from the victim just before it died) into a :class:`ReplicaReport`;
:func:`compare_runs` compares the masks with a single-server run of the same scenario.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # replicas.py imports this module
    from triton_sam.bench.replicas import ReplicaBenchOptions, SessionRun


@dataclass
class ReplicaReport:
    """One run through the proxy (see the module docstring).

    Attributes:
        protocol: ``"http"`` or ``"grpc"``.
        clicks / failed_clicks: clicks sent, and those that raised (with their errors).
        requests_per_replica: session requests (with the routing header) answered by each
            replica, from the proxy's log; other_requests the same for requests without it.
        retried: requests the proxy re-sent to another replica (its first one failed).
        victim: the killed replica (None: no kill); moved: images whose owner changed;
            moved_from_survivors: images that changed owner although their owner survived
            (consistent hashing promises none).
        encodes_per_replica / misses_per_replica: encoder executions and session-model
            misses per replica (the victim's read just before the kill).
        reembeds: encodes on the survivors after the kill (images that moved, embedded anew).
        one_channel_replicas: replicas reached by one client on one connection walking
            every image (1 would mean the connection pinned it).
        mask_mismatches / max_logit_diff / max_score_diff / sign_flips: the comparison with
            the single-server run (:class:`MaskComparison`; None: not compared).
        click_ms: p50/p95/p99 click latency (ms); wall_s the run's duration.
        metric_names: metric families a surviving replica exports on /metrics at the end
            (what the dashboard and the autoscaler can query).
    """

    protocol: str
    clicks: int = 0
    failed_clicks: int = 0
    errors: list[str] = field(default_factory=list)
    requests_per_replica: dict[int, int] = field(default_factory=dict)
    other_requests: dict[int, int] = field(default_factory=dict)
    retried: int = 0
    victim: int | None = None
    killed_after_clicks: int = 0
    owners_before: dict[str, int] = field(default_factory=dict)
    owners_after: dict[str, int] = field(default_factory=dict)
    moved: list[str] = field(default_factory=list)
    moved_from_survivors: list[str] = field(default_factory=list)
    encodes_per_replica: dict[int, int] = field(default_factory=dict)
    misses_per_replica: dict[int, int] = field(default_factory=dict)
    reembeds: int = 0
    one_channel_replicas: int = 0
    mask_mismatches: int | None = None
    max_score_diff: float | None = None
    max_logit_diff: float | None = None
    sign_flips: int | None = None
    click_ms: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    metric_names: set[str] = field(default_factory=set)

    def summary(self) -> dict[str, Any]:
        """The report as plain JSON-able values."""
        return {
            "protocol": self.protocol,
            "clicks": self.clicks,
            "failed_clicks": self.failed_clicks,
            "requests_per_replica": self.requests_per_replica,
            "other_requests_per_replica": self.other_requests,
            "retried_by_proxy": self.retried,
            "victim": self.victim,
            "killed_after_clicks": self.killed_after_clicks,
            "images_per_replica_before": dict(Counter(self.owners_before.values())),
            "images_moved": len(self.moved),
            "moved_from_survivors": len(self.moved_from_survivors),
            "encodes_per_replica": self.encodes_per_replica,
            "session_misses_per_replica": self.misses_per_replica,
            "reembeds": self.reembeds,
            "one_channel_replicas": self.one_channel_replicas,
            "mask_mismatches": self.mask_mismatches,
            "max_score_diff": self.max_score_diff,
            "max_logit_diff": self.max_logit_diff,
            "near_zero_sign_flips": self.sign_flips,
            "click_ms": self.click_ms,
            "wall_s": round(self.wall_s, 1),
            "errors": self.errors[:10],
        }


def owners(entries: Sequence[Any], replicas: Any) -> dict[str, int]:
    """Replica that last answered each routing key (where the proxy routes it)."""
    owners: dict[str, int] = {}
    for entry in entries:
        index = replicas.index_of(entry.upstream) if entry.upstream else None
        # any answer counts (a miss too: it is where the key is routed), not a dead replica
        answered = entry.statuses and entry.statuses[-1] not in ("502", "504")
        if entry.key and index is not None and answered:
            owners[entry.key] = index
    return owners


def counters(server: Any, encoder_model: str, session_model: str) -> tuple[int, int]:
    """(encoder inferences, session-model misses) of one replica. The encodes are counted on
    the encoder the session model calls (its config says: on a CPU host a background copy of
    ``encoder_model``), where its embeds run."""
    from triton_sam.bench.counters import _get_text, parse_metrics, read_counters, session_encoder

    encoder = session_encoder(server.http_url, session_model) or encoder_model
    encodes = read_counters(server.http_url, None, encoder).inference_count
    metrics = parse_metrics(_get_text(f"{server.metrics_url}/metrics"), session_model)
    misses = int(sum(v for k, v in metrics.items() if k.startswith("triton_sam_session_misses")))
    return encodes, misses


def fill_report(report, runs, entries, kill, replicas, encoder_model, session_model) -> None:
    """Fill ``report`` from the session runs, the access log, the kill and the counters."""
    from triton_sam.bench.counters import _get_text

    clicks = [m for run in runs for m in run.masks]
    report.clicks = len(clicks)
    report.failed_clicks = sum(m is None for m in clicks)
    report.errors = [e for run in runs for e in run.errors]
    per, other = Counter(), Counter()
    for entry in entries:
        index = replicas.index_of(entry.upstream) if entry.upstream else None
        if index is None:
            continue
        (per if entry.key else other)[index] += 1
        report.retried += len(entry.upstreams) > 1
    report.requests_per_replica = dict(sorted(per.items()))
    report.other_requests = dict(sorted(other.items()))
    latencies = np.array([ms for run in runs for ms in run.click_ms])
    if latencies.size:
        report.click_ms = {
            f"p{q}": round(float(np.percentile(latencies, q)), 1) for q in (50, 95, 99)
        }
    report.victim = kill.victim
    report.killed_after_clicks = kill.clicks_at_kill if kill.victim is not None else 0
    cut = kill.log_lines_at_kill if kill.victim is not None else len(entries)
    report.owners_before = owners(entries[:cut], replicas)
    report.owners_after = owners(entries[cut:], replicas)
    for key, after in report.owners_after.items():
        before = report.owners_before.get(key)
        if before is not None and before != after:
            report.moved.append(key)
            if before != kill.victim:
                report.moved_from_survivors.append(key)
    for i in replicas.alive():
        report.encodes_per_replica[i], report.misses_per_replica[i] = counters(
            replicas.servers[i], encoder_model, session_model
        )
        if kill.victim is not None:
            report.reembeds += report.encodes_per_replica[i] - kill.counters_at_kill[i][0]
    survivor = replicas.servers[replicas.alive()[0]]
    text = _get_text(f"{survivor.metrics_url}/metrics")
    report.metric_names = set(re.findall(r"^# TYPE (\w+) ", text, re.M))
    if kill.victim is not None:
        victim = kill.victim
        # the victim's counters died with it: its last reading before the kill
        report.encodes_per_replica[victim], report.misses_per_replica[victim] = (
            kill.counters_at_kill[victim]
        )
        report.encodes_per_replica = dict(sorted(report.encodes_per_replica.items()))
        report.misses_per_replica = dict(sorted(report.misses_per_replica.items()))


# Two servers running the same graphs on the same inputs agree to float32 rounding, not
# bit for bit: onnxruntime's CPU kernels split work over threads, and the reassociated sums
# differ in the last bits (measured, 3 replicas vs one server, 96 clicks per protocol:
# mask logits within 3.6e-7, IoU scores within 6e-8; 1,440 clicks: see docs/deployment.md). A
# mask pixel whose logit is that close to 0 may take either side; that is not a different
# mask. LOGIT_TOLERANCE bounds the logits' difference well above that noise and far below
# any real change (a wrong image or prompt moves logits by whole units).
LOGIT_TOLERANCE = 1e-3


@dataclass(frozen=True)
class MaskComparison:
    """Two runs of the same scenario, click by click.

    Attributes:
        mismatches: clicks that failed on either side, or whose binary masks differ at a pixel
            whose reference logit is farther than LOGIT_TOLERANCE from 0, or whose logits
            differ by more than LOGIT_TOLERANCE.
        max_logit_diff / max_score_diff: largest absolute difference of the mask logits and
            of the IoU scores over the clicks both runs answered.
        sign_flips: pixels on different sides of 0 with |reference logit| <= LOGIT_TOLERANCE.
    """

    mismatches: int
    max_logit_diff: float
    max_score_diff: float
    sign_flips: int


def compare_runs(runs: Sequence[SessionRun], reference: Sequence[SessionRun]) -> MaskComparison:
    """Compare the mask logits and scores of two runs of the same scenario (see
    :class:`MaskComparison`)."""
    mismatches, flips, worst_logit, worst_score = 0, 0, 0.0, 0.0
    for run, ref in zip(runs, reference, strict=True):
        for logits, ref_logits, scores, ref_scores in zip(
            run.masks, ref.masks, run.scores, ref.scores, strict=True
        ):
            if logits is None or ref_logits is None or scores is None or ref_scores is None:
                mismatches += 1
                continue
            if logits.shape != ref_logits.shape:
                mismatches += 1
                continue
            diff = float(np.max(np.abs(logits - ref_logits)))
            flipped = (logits > 0) != (ref_logits > 0)
            far = flipped & (np.abs(ref_logits) > LOGIT_TOLERANCE)
            if diff > LOGIT_TOLERANCE or far.any():
                mismatches += 1
            flips += int(flipped.sum())
            worst_logit = max(worst_logit, diff)
            worst_score = max(worst_score, float(np.max(np.abs(scores - ref_scores))))
    return MaskComparison(mismatches, worst_logit, worst_score, flips)


def write_report(reports: Sequence[ReplicaReport], options: ReplicaBenchOptions, out_dir):
    """``replicas.json`` and ``replicas.md`` (one row per protocol) under ``out_dir``."""
    import json
    from dataclasses import asdict
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries = [r.summary() for r in reports]
    data = {"options": asdict(options), "runs": summaries}
    json_path = out / "replicas.json"
    json_path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    lines = [
        f"{options.replicas} replicas, {options.sessions} sessions x {options.clicks} clicks "
        f"on {options.images} images, replica killed after {options.kill_after:.0%} of clicks",
        "",
        "| protocol | failed clicks | session requests per replica | images per replica "
        "before | moved (from survivors) | re-embeds | one connection reached | mask "
        "mismatches (max logit diff) | click p50 / p95 / p99 ms | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        per = ", ".join(f"{k}: {v}" for k, v in s["requests_per_replica"].items())
        images = ", ".join(f"{k}: {v}" for k, v in sorted(s["images_per_replica_before"].items()))
        ms = s["click_ms"]
        diff = "-" if s["max_logit_diff"] is None else f"{s['max_logit_diff']:.1e}"
        lines.append(
            f"| {s['protocol']} | {s['failed_clicks']} / {s['clicks']} | {per} "
            f"(victim {s['victim']}) | {images} | {s['images_moved']} "
            f"({s['moved_from_survivors']}) | {s['reembeds']} | {s['one_channel_replicas']} | "
            f"{s['mask_mismatches']} ({diff}) | "
            f"{ms.get('p50')} / {ms.get('p95')} / {ms.get('p99')} | "
            f"{s['wall_s']} |"
        )
    md_path = out / "replicas.md"
    md_path.write_text("\n".join(lines) + "\n")
    return {"json": json_path, "md": md_path}
