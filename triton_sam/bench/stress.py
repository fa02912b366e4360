"""Simulated mouse drags against a running server: what speculative decoding really costs.

Each session drags: ``events`` prompts at ``rate_hz`` along a path over the image; when the
drag stops, the time until the mask of its last position arrives is what the user feels.
The same drags run in several modes, one after another, against the same server:

- ``reference``: the reference client's behaviour: every event is sent; stale requests are
  only "marked cancelled" locally, so every one of them still runs on the server.
- ``cancel``: every event is sent, and each new one really cancels the session's older
  requests (``cancel_session_requests``): Triton drops those still queued (the only
  cancellation on the onnxruntime backend; the python-runner fallback also skips those
  already batched).
- ``latest``: latest-wins (``track`` / ``latest``): one request in flight per session plus the
  newest event waiting; superseded events are never sent.

Executed and cancelled requests come from the server's own counters of the decoders that ran
the clicks and of the session model they went through (:class:`triton_sam.bench.counters.
ClickCounters`), read before and after each mode once the server is quiet.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from triton_sam.bench.counters import ClickCounters, ServerCounters, wait_until_quiet
from triton_sam.bench.stress_report import DragSettings, ModeResult, StressReport, write_report
from triton_sam.client import SpeculativeSAM2Client, wait_for_latest_result
from triton_sam.errors import InputValidationError, ServerOverloadedError

__all__ = [  # the report's names too: callers import them from here
    "MODES",
    "DragSettings",
    "ModeResult",
    "StressReport",
    "check_modes",
    "counter_urls",
    "drag_path",
    "measure_decoder",
    "run_stress",
    "run_stress_on_server",
    "write_report",
]

MODES: tuple[str, ...] = ("reference", "cancel", "latest")


def drag_path(n: int, orig_hw: tuple[int, int], *, index: int = 0) -> np.ndarray:
    """``n`` (X, Y) pixel positions along an arc inside the image; ``index`` varies the arc.

    Returns:
        float64 [n, 2], every point at least 15% of the size away from the borders.
    """
    h, w = orig_hw
    # half an ellipse around the centre; golden-ratio phases: a distinct arc for every index
    theta = 2 * np.pi * 0.61803398875 * index + np.pi * np.linspace(0.0, 1.0, n)
    x = 0.5 + 0.35 * np.cos(theta)
    y = 0.5 + 0.3 * np.sin(theta)
    return np.stack([x * w, y * h], axis=1)


async def measure_decoder(
    client: SpeculativeSAM2Client, n: int = 7, *, concurrency: int = 1
) -> list[float]:
    """Round trips (ms) of ``n`` decoder requests, after one warm-up: D.

    With ``concurrency`` > 1, each sample sends that many requests at once and times the
    slowest: the round trip when every session has one request in flight (D_S).
    """
    h, w = client.original_size
    samples = []
    for i in range(n + 1):
        t0 = time.perf_counter()
        tasks = [
            (await client.predict_async([[w / 2, h / 2]], [1], session_id=f"stress-D{k}"))[1]
            for k in range(concurrency)
        ]
        await asyncio.gather(*tasks)
        if i:
            samples.append((time.perf_counter() - t0) * 1e3)
    for k in range(concurrency):
        client.cleanup_session(f"stress-D{k}")
    return samples


async def run_stress(
    client: SpeculativeSAM2Client,
    *,
    settings: DragSettings = DragSettings(),
    modes: Sequence[str] = MODES,
    counters: Callable[[], ServerCounters] | None = None,
    n_decoder: int = 7,
) -> StressReport:
    """Measure D, then run the drags once per mode; the image must be set.

    Args:
        client: a ready client with its image set.
        settings: drags (events, rate, sessions, repeats).
        modes: any of :data:`MODES`, run in this order.
        counters: reads the server's counters of the clicks (a
            :class:`~triton_sam.bench.counters.ClickCounters`); None leaves
            ``ModeResult.server`` empty.
        n_decoder: isolated decoder round trips that measure D.
    """
    check_modes(modes)
    report = StressReport(client.model_type, client.endpoint.protocol, settings)
    if isinstance(counters, ClickCounters):
        report.counted = counters.models
    report.decoder_ms = await measure_decoder(client, n_decoder)
    if settings.sessions > 1:
        report.decoder_concurrent_ms = await measure_decoder(
            client, max(3, n_decoder // 2), concurrency=settings.sessions
        )
    quiet_s = max(0.5, 3 * report.decoder_p50_ms / 1e3)
    for mode in modes:
        before = await _quiet(counters, quiet_s)
        t0 = time.perf_counter()
        result = ModeResult(mode)
        await asyncio.gather(
            *(_session(client, mode, s, settings, result) for s in range(settings.sessions))
        )
        result.wall_s = time.perf_counter() - t0
        after = await _quiet(counters, quiet_s)
        if before is not None and after is not None:
            result.server = (after - before).as_dict()
        report.modes[mode] = result
    return report


def check_modes(modes: Sequence[str]) -> None:
    """Raise InputValidationError unless ``modes`` is a non-empty subset of :data:`MODES`."""
    if not modes or any(m not in MODES for m in modes):
        raise InputValidationError("modes", f"got {list(modes)}, expected some of {list(MODES)}")


async def _quiet(
    counters: Callable[[], ServerCounters] | None, quiet_s: float
) -> ServerCounters | None:
    if counters is None:
        return None
    return await asyncio.to_thread(wait_until_quiet, counters, quiet_s=quiet_s)


async def _session(
    client: SpeculativeSAM2Client,
    mode: str,
    index: int,
    settings: DragSettings,
    result: ModeResult,
) -> None:
    for repeat in range(settings.repeats):
        session_id = f"stress-{mode}-{index}-{repeat}"
        path = drag_path(settings.events, client.original_size, index=index * 997 + repeat)
        await _drag(client, mode, session_id, path, settings.rate_hz, result)
        status = client.get_session_status(session_id)
        result.requests_sent += sum(v for k, v in status.items() if k != "superseded")
        result.superseded += status["superseded"]
        if mode == "cancel":
            result.cancelled_client += status["cancelled"]
        client.cleanup_session(session_id)


async def _drag(
    client: SpeculativeSAM2Client,
    mode: str,
    session_id: str,
    path: np.ndarray,
    rate_hz: float,
    result: ModeResult,
) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks: list[tuple[str, asyncio.Task[Any]]] = []
    for i, (x, y) in enumerate(path):
        # On schedule; when the loop falls behind, events go out as soon as it can.
        await asyncio.sleep(max(0.0, start + i / rate_hz - loop.time()))
        if i == 0:
            t_first = time.perf_counter()
        if mode == "latest":
            client.track(session_id, [[x, y]], [1])
        else:
            tasks.append(await client.predict_async([[x, y]], [1], session_id=session_id))
            if mode == "cancel":
                client.cancel_session_requests(session_id, keep_latest=True)
    t_last = time.perf_counter()
    result.events += len(path)
    if mode == "latest":
        await client.latest(session_id)
    elif mode == "cancel":
        if await wait_for_latest_result(tasks, client, session_id) is None:
            raise RuntimeError(f"{session_id}: the last request was cancelled")
    else:
        # The reference marks these "cancelled" in a dict; the server runs every one it
        # admits and refuses the rest at once (its click queue is bounded).
        result.cancelled_client += sum(not task.done() for _, task in tasks[:-1])
        try:
            await tasks[-1][1]
        except ServerOverloadedError:
            pass  # counted below with the others; no mask, so no latency for this drag
        else:
            result.last_event_to_mask_ms.append((time.perf_counter() - t_last) * 1e3)
        outcomes = await asyncio.gather(*(task for _, task in tasks), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, ServerOverloadedError):
                result.refused += 1
            elif isinstance(outcome, BaseException):
                raise outcome
        result.drag_ms.append((t_last - t_first) * 1e3)
        return
    result.last_event_to_mask_ms.append((time.perf_counter() - t_last) * 1e3)
    result.drag_ms.append((t_last - t_first) * 1e3)


def counter_urls(
    url: str, http_url: str | None = None, metrics_url: str | None = None
) -> tuple[str, str]:
    """Statistics and metrics URLs of the server at ``url``: the ones given, else its host on
    Triton's default ports (8000, 8002), with the scheme of ``url`` (https stays https)."""
    scheme = "https" if url.startswith(("https://", "grpcs://")) else "http"
    address = url.split("://", 1)[-1].rstrip("/") or "localhost"
    bare = address.endswith("]") or ":" not in address  # no port (IPv6 literals in [])
    host = address if bare else address.rsplit(":", 1)[0]
    return (
        http_url or f"{scheme}://{host}:8000",
        metrics_url or f"{scheme}://{host}:8002",
    )


def run_stress_on_server(
    url: str,
    *,
    protocol: str = "grpc",
    http_url: str | None,
    metrics_url: str | None,
    image: Any,
    model_type: str = "sam2",
    settings: DragSettings = DragSettings(),
    modes: Sequence[str] = MODES,
    model_name: str = "",
) -> StressReport:
    """Blocking entry point: connect, set ``image``, :func:`run_stress`, close.

    Args:
        url: the server's gRPC (or HTTP, with ``protocol="http"``) URL.
        http_url / metrics_url: where the counters are read; None skips them.
        image: path, PIL image or HxWx3 uint8 array.
    """
    check_modes(modes)

    async def main() -> StressReport:
        async with SpeculativeSAM2Client(url, model_type=model_type, protocol=protocol) as client:
            await client.set_image_async(image)
            counters = None
            if http_url:
                counters = await asyncio.to_thread(
                    ClickCounters.of_client, client, http_url, metrics_url
                )
            report = await run_stress(client, settings=settings, modes=modes, counters=counters)
        report.model = model_name or report.model
        return report

    return asyncio.run(main())
