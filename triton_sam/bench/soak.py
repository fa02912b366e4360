"""Soak: many concurrent interactive sessions for a while; nothing may fail, memory must hold.

Each session is one user with its own connection (a :class:`SpeculativeSAM2Client`): it
encodes its image once, then clicks, drags boxes and refines masks back to back until the
time is up (optionally re-encoding every ``encode_every`` prompts). Every request's latency
and every failure is recorded; the resident memory of this process (the clients) and of the
server (tritonserver plus its python-backend stub processes) is sampled throughout.

Where the server's statistics endpoint is known, what its decoders executed for the clicks
(:class:`triton_sam.bench.counters.ClickCounters`) is reported beside the answers the clients
got: every click answered ran once.

Distinct images cost one encoder run each (seconds on a CPU); ``images`` < ``sessions`` makes
sessions share the embeddings of fewer images (:meth:`set_image_embedding`), which keeps a
short run's time on the decoder, where interactive load is.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from triton_sam.bench.counters import ClickCounters, ServerCounters, wait_until_quiet
from triton_sam.client.speculative import SpeculativeSAM2Client
from triton_sam.errors import InputValidationError

MIB = 2**20


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

    sessions: int = 16
    duration_s: float = 60.0
    images: int = 0
    encode_every: int = 0
    sample_every_s: float = 0.5
    timeout_s: float = 120.0
    server_embeddings: bool = True
    warmup_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("sessions",):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputValidationError(name, f"got {value!r}, expected an integer >= 1")
        for name in ("images", "encode_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InputValidationError(name, f"got {value!r}, expected an integer >= 0")
        for name in ("duration_s", "sample_every_s", "timeout_s"):
            if not getattr(self, name) > 0:
                raise InputValidationError(name, f"got {getattr(self, name)!r}, expected > 0")


@dataclass
class MemorySample:
    """Resident memory at one time (bytes); ``server`` is None when it cannot be seen."""

    t_s: float
    client: int
    server: int | None


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

    @staticmethod
    def percentiles(values: list[float]) -> dict[str, float]:
        """p50/p95/p99/max of ``values`` (NaN when empty)."""
        if not values:
            return dict.fromkeys(("p50", "p95", "p99", "max"), math.nan)
        a = np.asarray(values)
        return {
            "p50": float(np.percentile(a, 50)),
            "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)),
            "max": float(a.max()),
        }

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


def process_tree_rss(pid: int) -> int | None:
    """Memory of ``pid`` and all its descendants (bytes), None if it is gone.

    Proportional set size (PSS) where the kernel reports it: tritonserver and its stubs map
    the same shared-memory regions, which plain RSS would count once per process.
    """
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for proc in procs:
        try:
            info = proc.memory_full_info()
            total += getattr(info, "pss", info.rss)
        except psutil.Error:  # a stub exiting while we read
            continue
    return total


class MemorySampler:
    """Samples this process's RSS and the server's (tree) RSS on a background thread."""

    def __init__(self, server_pid: int | None, period_s: float) -> None:
        self.server_pid, self.period_s = server_pid, period_s
        self.samples: list[MemorySample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-memory", daemon=True)
        self._t0 = time.monotonic()

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> MemorySample:
        """Take one sample now (also recorded)."""
        import psutil

        server = process_tree_rss(self.server_pid) if self.server_pid else None
        sample = MemorySample(
            time.monotonic() - self._t0, psutil.Process().memory_info().rss, server
        )
        self.samples.append(sample)
        return sample

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()


def _prompt(rng: np.random.Generator, hw: tuple[int, int], i: int, previous: Any) -> dict:
    """A varied prompt: clicks, a box, box + click, multimask, and mask refinement."""
    h, w = hw
    x, y = rng.uniform(0.1, 0.9) * w, rng.uniform(0.1, 0.9) * h
    kind = i % 5
    if kind == 0:
        return {"point_coords": [[x, y]], "point_labels": [1]}
    if kind == 1:
        return {"point_coords": [[x, y], [w - x, h - y]], "point_labels": [1, 0]}
    if kind == 2:
        return {"box": [min(x, w - x), min(y, h - y), max(x, w - x), max(y, h - y)]}
    if kind == 3:
        return {"point_coords": [[x, y]], "point_labels": [1], "multimask_output": True}
    return {"point_coords": [[x, y]], "point_labels": [1], "mask_input": previous}


async def _session(
    index: int,
    client: SpeculativeSAM2Client,
    image: np.ndarray,
    settings: SoakSettings,
    deadline: float,
    report: SoakReport,
) -> None:
    rng = np.random.default_rng(index)
    previous = None
    i = 0
    while time.monotonic() < deadline:
        if settings.encode_every and i and i % settings.encode_every == 0:
            t0 = time.perf_counter()
            try:
                await _record(report, client.set_image_async(image))
                report.encode_ms.append((time.perf_counter() - t0) * 1e3)
            except _Failed:
                pass  # counted; the session goes on with its previous embeddings
        prompt = _prompt(rng, client.original_size, i, previous)
        t0 = time.perf_counter()
        try:
            _, task = await client.predict_async(**prompt, session_id=f"soak-{index}")
            masks, _ = await _record(report, task)
        except _Failed:
            masks = None
        else:
            report.decode_ms.append((time.perf_counter() - t0) * 1e3)
        i += 1
        if masks is not None and previous is None:
            # a mask_input of the decoder's low-res size, for the refinement prompts
            size = client.family.preprocessing.mask_size
            previous = np.zeros((size, size), np.float32)
        if i % 50 == 0:
            client.cleanup_session(f"soak-{index}")  # forget finished records


class _Failed(Exception):
    pass


async def _record(report: SoakReport, awaitable: Any) -> Any:
    report.requests += 1
    try:
        return await awaitable
    except asyncio.CancelledError:
        raise
    except Exception as e:
        report.failures += 1
        if len(report.errors) < 20:
            report.errors.append(f"{type(e).__name__}: {e}")
        raise _Failed from e


async def run_soak(
    url: str,
    images: list[np.ndarray],
    *,
    settings: SoakSettings = SoakSettings(),
    protocol: str = "grpc",
    model_type: str = "sam2",
    server_pid: int | None = None,
    progress: Callable[[str], None] | None = None,
    http_url: str | None = None,
    metrics_url: str | None = None,
) -> SoakReport:
    """Run the soak against the server at ``url`` (see the module docstring).

    Args:
        url: the server's gRPC (or HTTP, with ``protocol="http"``) URL.
        images: the images to encode (``settings.images`` of them are used, cycling).
        settings: sessions, duration, ...
        protocol: ``"grpc"`` or ``"http"``.
        model_type: model family of the served models.
        server_pid: tritonserver's pid, to sample its memory (None: client only).
        progress: called with a line of text at each phase.
        http_url / metrics_url: the server's statistics and metrics endpoints, to count
            what its decoders executed (None: not counted).
    """
    say = progress or (lambda _: None)
    report = SoakReport(model_type, protocol, settings)
    n_images = settings.images or settings.sessions
    pictures = [images[i % len(images)] for i in range(n_images)]
    clients = [
        SpeculativeSAM2Client(
            url,
            model_type=model_type,
            protocol=protocol,
            timeout_s=settings.timeout_s,
            use_server_embeddings=settings.server_embeddings,
        )
        for _ in range(settings.sessions)
    ]
    try:
        with MemorySampler(server_pid, settings.sample_every_s) as sampler:
            say(f"encoding {n_images} image(s) for {settings.sessions} session(s)")
            # at most a batch of encodes at once, as a few users opening images would
            gate = asyncio.Semaphore(4)
            embeddings = await asyncio.gather(
                *(_encode(clients[i], pictures[i], report, gate) for i in range(n_images))
            )
            for i in range(n_images, settings.sessions):
                k = i % n_images
                if embeddings[k] is None:
                    continue
                # (asked of the settings: a client that has not connected yet does not know
                # whether the server offers the session model)
                if settings.server_embeddings:  # the server has it: a probe, no upload
                    await _encode(clients[i], pictures[k], report, gate)
                else:
                    clients[i].set_image_embedding(embeddings[k], pictures[k].shape[:2])
            # a session whose image failed to encode (a counted failure) cannot prompt
            active = [(i, c) for i, c in enumerate(clients) if c.is_image_set]
            counters = None
            if http_url and active:  # every client takes the same path: ask the first
                counters = await asyncio.to_thread(
                    ClickCounters.of_client, active[0][1], http_url, metrics_url
                )
                report.counted = counters.models
            before = await _quiet(counters)
            say(f"prompting for {settings.warmup_s:g} + {settings.duration_s:g} s")
            sampler.samples.clear()  # growth is measured over the prompting phase
            sampler.sample()
            t0 = time.monotonic()
            end = t0 + settings.warmup_s + settings.duration_s

            async def after_warmup() -> None:
                await asyncio.sleep(settings.warmup_s)
                sampler.samples.clear()
                sampler.sample()

            await asyncio.gather(
                after_warmup(),
                *(_session(i, c, pictures[i % n_images], settings, end, report) for i, c in active),
            )
            report.prompts_s = time.monotonic() - t0
            sampler.sample()
            after = await _quiet(counters)
            if before is not None and after is not None:
                report.server = (after - before).as_dict()
        report.memory = list(sampler.samples)
    finally:
        for client in clients:
            await client.aclose()
    return report


async def _quiet(counters: ClickCounters | None) -> ServerCounters | None:
    """The counters once the server has settled (requests still running counted)."""
    if counters is None:
        return None
    return await asyncio.to_thread(wait_until_quiet, counters, quiet_s=1.0)


async def _encode(
    client: SpeculativeSAM2Client, image: np.ndarray, report: SoakReport, gate: asyncio.Semaphore
) -> dict | None:
    async with gate:
        t0 = time.perf_counter()
        try:
            embedding = await _record(report, client.set_image_async(image))
        except _Failed:
            return None
        report.encode_ms.append((time.perf_counter() - t0) * 1e3)
        return embedding


def soak_images(count: int, size_hw: tuple[int, int] = (427, 640)) -> list[np.ndarray]:
    """``count`` distinct synthetic images (the sample scene with different seeds)."""
    from triton_sam.tools.sample import sample_image

    h, w = size_hw
    return [sample_image(w, h, seed=i) for i in range(count)]


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


def run_soak_on_server(
    url: str,
    *,
    settings: SoakSettings = SoakSettings(),
    protocol: str = "grpc",
    model_type: str = "sam2",
    server_pid: int | None = None,
    model_name: str = "",
    progress: Callable[[str], None] | None = None,
    http_url: str | None = None,
    metrics_url: str | None = None,
) -> SoakReport:
    """Blocking entry point: synthetic images, :func:`run_soak`."""
    images = soak_images(settings.images or settings.sessions)
    report = asyncio.run(
        run_soak(
            url,
            images,
            settings=settings,
            protocol=protocol,
            model_type=model_type,
            server_pid=server_pid,
            progress=progress,
            http_url=http_url,
            metrics_url=metrics_url,
        )
    )
    report.model = model_name or report.model
    return report
