"""Concurrent sessions through the image-affine proxy, with a replica killed mid-run.

The scenario (``triton-sam bench replicas``, and short in tests/integration/test_replicas.py):

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

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from triton_sam.bench.bounds import at_least, check_bounds
from triton_sam.bench.replicas_report import (
    ReplicaReport,
    compare_runs,
    counters,
    fill_report,
    owners,
    write_report,
)
from triton_sam.errors import InputValidationError, TritonSamError

__all__ = [
    "ReplicaBenchOptions",
    "ReplicaReport",
    "SessionRun",
    "bench_images",
    "click_script",
    "compare_runs",
    "run_replicas",
    "run_sessions",
    "write_report",
]


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

    replicas: int = at_least(1, default=3)
    sessions: int = at_least(1, default=16)
    clicks: int = at_least(1, default=6)
    images: int = at_least(1, default=6)
    kill_after: float = 0.4
    image_hw: tuple[int, int] = (240, 320)
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        check_bounds(self)
        if not 0.0 <= self.kill_after < 1.0:
            raise InputValidationError("kill_after", f"got {self.kill_after}, expected [0, 1)")
        if self.kill_after and self.replicas < 2:
            raise InputValidationError(
                "replicas", f"got {self.replicas}, expected >= 2 to survive a killed replica"
            )


@dataclass
class SessionRun:
    """What one session got: per click, the mask logits [M, H, W] (float32, original image
    size; ``> 0`` is the mask) and IoU scores [M] (None where the click failed)."""

    image: int
    masks: list[np.ndarray | None] = field(default_factory=list)
    scores: list[np.ndarray | None] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    click_ms: list[float] = field(default_factory=list)


def bench_images(options: ReplicaBenchOptions) -> list[np.ndarray]:
    """The scenario's images (the sample scene with different seeds), HxWx3 uint8."""
    from triton_sam.tools.sample import sample_image

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
                run.masks.append(prediction.masks[0])
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
    from triton_sam.scaleout.proxy import NginxProxy, read_access_log
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
        fill_report(report, runs, entries, kill, replicas, encoder_model, session_model)
        if reference is not None:
            comparison = compare_runs(runs, reference)
            report.mask_mismatches = comparison.mismatches
            report.max_score_diff = comparison.max_score_diff
            report.max_logit_diff = comparison.max_logit_diff
            report.sign_flips = comparison.sign_flips
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
        from triton_sam.scaleout.proxy import read_access_log

        entries = read_access_log(self.proxy.access_log)
        load = Counter(owners(entries, self.replicas).values())
        victim = max(self.replicas.alive(), key=lambda i: (load.get(i, 0), -i))
        for i in self.replicas.alive():
            self.counters_at_kill[i] = counters(self.replicas.servers[i], *self.models)
        self.replicas.kill(victim)
        self.victim = victim
        self.log_lines_at_kill = len(entries)


def _one_channel(url, protocol, images, replicas, proxy, model_type) -> int:
    """Replicas reached by one client (one connection) setting every image in turn."""
    from triton_sam import SAM2TritonClient
    from triton_sam.client.embedding_path import image_id
    from triton_sam.scaleout.proxy import read_access_log

    start = len(read_access_log(proxy.access_log))
    with SAM2TritonClient(url, model_type=model_type, protocol=protocol) as client:
        keys = {image_id(image, client.family, client.encoder_model) for image in images}
        for image in images:
            client.set_image(image)  # a probe (an embed where the image moved)
    entries = read_access_log(proxy.access_log)[start:]
    reached = {replicas.index_of(e.upstream) for e in entries if e.key in keys}
    return len(reached - {None})
