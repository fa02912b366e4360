"""Concurrent sessions through the image-affine proxy, with a replica killed mid-run.

The scenario (``triton-sam bench-replicas``, and short in tests/integration/test_replicas.py):

1. ``sessions`` threads, each with its own client (the sync ``SAM2TritonClient`` on the
   session model, as an annotation tool uses it), embed one of ``images`` images (several
   sessions share an image, as users annotating the same data set do) and wait for each other;
2. each then sends ``clicks`` prompts (clicks, a box, refinements with the previous
   low-res logits, which go by reference to the logits the server kept);
3. once ``kill_after`` of all clicks are done, the replica holding the most images is
   SIGKILLed; the clicks in flight there are re-sent by the proxy to the next replica on
   the hash ring, which answers "not embedded", and the clients re-embed there;
4. one more client walks every image on one connection: the proxy must spread it.

What is reported comes from the proxy's access log (requests per replica, owner of every
image before and after the kill) and the replicas' own counters (encodes, session misses);
the masks are compared, click by click, with the same script run against a single server.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from triton_sam.errors import InputValidationError, TritonSamError


@dataclass(frozen=True)
class ReplicaBenchOptions:
    """The scenario's size.

    Attributes:
        replicas: Triton replicas behind the proxy.
        sessions: concurrent sessions (threads, one client each).
        clicks: prompts per session.
        images: distinct images (session i works on image ``i % images``).
        kill_after: fraction of all clicks done before one replica is killed (0: no kill).
        image_hw: (H, W) of the synthetic images.
        timeout_s: per-request client timeout.
    """

    replicas: int = 3
    sessions: int = 16
    clicks: int = 6
    images: int = 6
    kill_after: float = 0.4
    image_hw: tuple[int, int] = (240, 320)
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        for name in ("replicas", "sessions", "clicks", "images"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InputValidationError(name, f"got {value!r}, expected an integer >= 1")
        if not 0.0 <= self.kill_after < 1.0:
            raise InputValidationError("kill_after", f"got {self.kill_after}, expected [0, 1)")
        if self.kill_after and self.replicas < 2:
            raise InputValidationError(
                "replicas", f"got {self.replicas}, expected >= 2 to survive a killed replica"
            )


@dataclass
class SessionRun:
    """What one session got: per click, the binary masks and scores (None where it failed)."""

    image: int
    masks: list[np.ndarray | None] = field(default_factory=list)
    scores: list[np.ndarray | None] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    click_ms: list[float] = field(default_factory=list)


def bench_images(options: ReplicaBenchOptions) -> list[np.ndarray]:
    """The scenario's images (the sample scene with different seeds), HxWx3 uint8."""
    from triton_sam.sample import sample_image

    h, w = options.image_hw
    return [sample_image(w, h, seed=i) for i in range(options.images)]


def click_script(session: int, clicks: int, hw: tuple[int, int]) -> list[dict[str, Any]]:
    """The prompts of one session (deterministic in ``session``), in original pixels.

    ``"refine": True`` asks for the previous click's best low-res logits as ``mask_input``.
    """
    rng = np.random.default_rng(1000 + session)
    h, w = hw
    script = []
    for k in range(clicks):
        x, y = float(rng.uniform(0.15, 0.85) * w), float(rng.uniform(0.15, 0.85) * h)
        kind = k % 3
        if kind == 0:
            script.append({"point_coords": [[x, y]], "point_labels": [1]})
        elif kind == 1:
            script.append(
                {"point_coords": [[x, y], [w - x, h - y]], "point_labels": [1, 0], "refine": True}
            )
        else:
            x0, y0 = min(x, w - x), min(y, h - y)
            script.append({"box": [x0, y0, max(x, w - x), max(y, h - y)]})
    return script


def run_sessions(
    url: str,
    protocol: str,
    images: Sequence[np.ndarray],
    options: ReplicaBenchOptions,
    *,
    model_type: str = "sam2",
    on_click: Callable[[int], None] | None = None,
) -> list[SessionRun]:
    """Run every session of the scenario against ``url`` (a proxy or one server).

    Args:
        on_click: called (from the session threads) with the number of clicks done so far.

    Returns:
        One :class:`SessionRun` per session. A failed set_image fails all of its clicks.
    """
    from triton_sam import SAM2TritonClient

    runs = [SessionRun(image=i % len(images)) for i in range(options.sessions)]
    barrier = threading.Barrier(options.sessions)
    lock, done = threading.Lock(), [0]

    def session(index: int) -> None:
        run = runs[index]
        image = images[run.image]
        script = click_script(index, options.clicks, image.shape[:2])
        client = None
        try:
            client = SAM2TritonClient(
                url, model_type=model_type, protocol=protocol, timeout_s=options.timeout_s
            )
            client.set_image(image)
        except TritonSamError as e:
            run.errors.append(f"set_image: {type(e).__name__}: {e}")
        finally:
            barrier.wait()  # every session embedded (or failed) before the first click
        previous = None
        for prompt in script:
            prompt = dict(prompt)
            if prompt.pop("refine", False) and previous is not None:
                prompt["mask_input"] = previous
            t0 = time.perf_counter()
            try:
                if client is None:
                    raise TritonSamError("no client (set_image failed)")
                prediction = client.predict_full(**prompt)
            except TritonSamError as e:
                run.errors.append(f"click: {type(e).__name__}: {e}")
                run.masks.append(None)
                run.scores.append(None)
            else:
                run.click_ms.append((time.perf_counter() - t0) * 1e3)
                run.masks.append(prediction.masks[0] > 0)
                run.scores.append(prediction.iou_predictions[0])
                best = int(np.argmax(prediction.iou_predictions[0]))
                previous = prediction.low_res_logits[0, best]
            with lock:
                done[0] += 1
                count = done[0]
            if on_click is not None:
                on_click(count)
        if client is not None:
            client.close()

    threads = [threading.Thread(target=session, args=(i,)) for i in range(options.sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return runs


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
        mask_mismatches: clicks whose masks differ from the reference run (None: not
            compared); max_score_diff the largest IoU-score difference.
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
            "click_ms": self.click_ms,
            "wall_s": round(self.wall_s, 1),
            "errors": self.errors[:10],
        }


def run_replicas(
    repository: Any,
    protocol: str,
    options: ReplicaBenchOptions,
    *,
    reference: list[SessionRun] | None = None,
    model_type: str = "sam2",
    encoder_model: str = "sam2_encoder",
    session_model: str = "sam2_session",
    replica_set: Any = None,
) -> ReplicaReport:
    """Start ``options.replicas`` replicas of ``repository`` behind nginx and run the scenario.

    Args:
        repository: a repository the embedded server serves (``embedded_repository``).
        protocol: ``"http"`` or ``"grpc"``.
        reference: the same scenario's runs against one server (:func:`run_sessions`), to
            compare the masks with; None skips the comparison.
        replica_set: a started :class:`~triton_sam.scaleout.replicas.ReplicaSet` to use
            instead of starting one (it is not stopped here).
    """
    from triton_sam.scaleout.nginx import NginxProxy, read_access_log
    from triton_sam.scaleout.replicas import ReplicaSet

    images = bench_images(options)
    own = replica_set is None
    replicas = ReplicaSet(repository, options.replicas) if own else replica_set
    if own:
        replicas.start()
    try:
        report = ReplicaReport(protocol=protocol)
        with NginxProxy(
            replicas.addresses("http"), replicas.addresses("grpc"), fail_timeout_s=10
        ) as proxy:
            url = proxy.http_address if protocol == "http" else proxy.grpc_address
            kill = _Killer(replicas, proxy, options, encoder_model, session_model)
            t0 = time.perf_counter()
            runs = run_sessions(
                url, protocol, images, options, model_type=model_type, on_click=kill.maybe
            )
            report.wall_s = time.perf_counter() - t0
            kill.join()
            report.one_channel_replicas = _one_channel(
                url, protocol, images, replicas, proxy, model_type
            )
            entries = read_access_log(proxy.access_log)
        _fill(report, runs, entries, kill, replicas, encoder_model, session_model)
        if reference is not None:
            report.mask_mismatches, report.max_score_diff = compare_runs(runs, reference)
        return report
    finally:
        if own:
            replicas.stop()


class _Killer:
    """Kills the replica holding the most images once enough clicks are done (once)."""

    def __init__(self, replicas, proxy, options, encoder_model, session_model) -> None:
        self.replicas, self.proxy, self.options = replicas, proxy, options
        self.models = (encoder_model, session_model)
        total = options.sessions * options.clicks
        self.at = int(total * options.kill_after) if options.kill_after else None
        self.victim: int | None = None
        self.log_lines_at_kill = 0
        self.clicks_at_kill = 0
        self.counters_at_kill: dict[int, tuple[int, int]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def maybe(self, done: int) -> None:
        with self._lock:
            if self.at is None or done < self.at or self._thread is not None:
                return
            self.clicks_at_kill = done
            # kill from another thread: the session that crossed the mark keeps clicking
            self._thread = threading.Thread(target=self._kill)
            self._thread.start()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def _kill(self) -> None:
        from triton_sam.scaleout.nginx import read_access_log

        entries = read_access_log(self.proxy.access_log)
        owners = _owners(entries, self.replicas)
        load = Counter(owners.values())
        victim = max(self.replicas.alive(), key=lambda i: (load.get(i, 0), -i))
        for i in self.replicas.alive():
            self.counters_at_kill[i] = _counters(self.replicas.servers[i], *self.models)
        self.replicas.kill(victim)
        self.victim = victim
        self.log_lines_at_kill = len(entries)


def _owners(entries: Sequence[Any], replicas: Any) -> dict[str, int]:
    """Replica that last answered each routing key (where the proxy routes it)."""
    owners: dict[str, int] = {}
    for entry in entries:
        index = replicas.index_of(entry.upstream) if entry.upstream else None
        # any answer counts (a miss too: it is where the key is routed), not a dead replica
        answered = entry.statuses and entry.statuses[-1] not in ("502", "504")
        if entry.key and index is not None and answered:
            owners[entry.key] = index
    return owners


def _counters(server: Any, encoder_model: str, session_model: str) -> tuple[int, int]:
    """(encoder inferences, session-model misses) of one replica."""
    from triton_sam.bench.counters import _get_text, parse_metrics, read_counters

    encodes = read_counters(server.http_url, None, encoder_model).inference_count
    metrics = parse_metrics(_get_text(f"{server.metrics_url}/metrics"), session_model)
    misses = int(sum(v for k, v in metrics.items() if k.startswith("triton_sam_session_misses")))
    return encodes, misses


def _fill(report, runs, entries, kill, replicas, encoder_model, session_model) -> None:
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
    report.owners_before = _owners(entries[:cut], replicas)
    report.owners_after = _owners(entries[cut:], replicas)
    for key, after in report.owners_after.items():
        before = report.owners_before.get(key)
        if before is not None and before != after:
            report.moved.append(key)
            if before != kill.victim:
                report.moved_from_survivors.append(key)
    for i in replicas.alive():
        report.encodes_per_replica[i], report.misses_per_replica[i] = _counters(
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


def _one_channel(url, protocol, images, replicas, proxy, model_type) -> int:
    """Replicas reached by one client (one connection) setting every image in turn."""
    from triton_sam import SAM2TritonClient
    from triton_sam.client.session_path import image_id
    from triton_sam.scaleout.nginx import read_access_log

    start = len(read_access_log(proxy.access_log))
    with SAM2TritonClient(url, model_type=model_type, protocol=protocol) as client:
        keys = {image_id(image, client.family, client.encoder_model) for image in images}
        for image in images:
            client.set_image(image)  # a probe (an embed where the image moved)
    entries = read_access_log(proxy.access_log)[start:]
    reached = {replicas.index_of(e.upstream) for e in entries if e.key in keys}
    return len(reached - {None})


def compare_runs(runs: Sequence[SessionRun], reference: Sequence[SessionRun]) -> tuple[int, float]:
    """(clicks whose binary masks differ, largest IoU-score difference) between two runs of
    the same scenario; a click that failed on either side counts as differing."""
    mismatches, worst = 0, 0.0
    for run, ref in zip(runs, reference, strict=True):
        for masks, ref_masks, scores, ref_scores in zip(
            run.masks, ref.masks, run.scores, ref.scores, strict=True
        ):
            if masks is None or ref_masks is None or scores is None or ref_scores is None:
                mismatches += 1
                continue
            if masks.shape != ref_masks.shape or not np.array_equal(masks, ref_masks):
                mismatches += 1
            worst = max(worst, float(np.max(np.abs(scores - ref_scores))))
    return mismatches, worst


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
        "mismatches | click p50 / p95 / p99 ms | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        per = ", ".join(f"{k}: {v}" for k, v in s["requests_per_replica"].items())
        images = ", ".join(f"{k}: {v}" for k, v in sorted(s["images_per_replica_before"].items()))
        ms = s["click_ms"]
        lines.append(
            f"| {s['protocol']} | {s['failed_clicks']} / {s['clicks']} | {per} "
            f"(victim {s['victim']}) | {images} | {s['images_moved']} "
            f"({s['moved_from_survivors']}) | {s['reembeds']} | {s['one_channel_replicas']} | "
            f"{s['mask_mismatches']} | {ms.get('p50')} / {ms.get('p95')} / {ms.get('p99')} | "
            f"{s['wall_s']} |"
        )
    md_path = out / "replicas.md"
    md_path.write_text("\n".join(lines) + "\n")
    return {"json": json_path, "md": md_path}
