"""Embed storm: many concurrent embeds of distinct images while other users click.

A storm is ``embeds`` requests sent at once to the session model, each an image file (a
distinct small PNG) the server has not seen. Meanwhile ``clickers`` users click on one
image embedded before (with a think time between clicks, as people do). Every answer is
classified: ok, a typed refusal (``ServerOverloadedError``: the session model's embed line
was full), or any other error (a transport error, a timeout, an untyped server error),
which must never happen. The server tree's memory (PSS of tritonserver and its stubs,
:func:`triton_sam.bench.memory.process_tree_rss`) is sampled throughout.

The same users first click with no storm (idle), so their latency during the storm is
compared with theirs from the same run. Each storm count runs twice with fresh images: the
second storm's peak must not exceed the first's (no growth).

The server's memory bound (the session model's admission and the encoder's memory
settings): :func:`memory_bound`.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from triton_sam.bench.harness import Served
from triton_sam.bench.memory import MemorySampler
from triton_sam.bench.stats import percentiles
from triton_sam.bench.storm_report import (
    MIB,
    SAM2_TINY_CPU_ENCODER_RUN,
    SAM2_TINY_EMBED,
    SAM2_TINY_FEATURES,
    StormReport,
    StormRun,
    StormSettings,
    Tally,
    memory_bound,
    sam2_cpu_bound,
    to_mib,
    write_report,
)
from triton_sam.errors import TritonSamError

__all__ = [  # the report's names too: callers import them from here
    "MIB",
    "SAM2_TINY_CPU_ENCODER_RUN",
    "SAM2_TINY_EMBED",
    "SAM2_TINY_FEATURES",
    "StormReport",
    "StormRun",
    "StormSettings",
    "Tally",
    "memory_bound",
    "percentiles",
    "run_storm",
    "run_storm_on_server",
    "sam2_cpu_bound",
    "storm_images",
    "write_report",
]
IMAGE_BYTES = "image_bytes"
IMAGE_ID = "image_id"


def storm_images(count: int, hw: tuple[int, int], *, seed: int) -> list[bytes]:
    """``count`` distinct PNG files of ``hw`` pixels (the sample scene, seeds from ``seed``)."""
    from PIL import Image

    from triton_sam.tools.sample import sample_image

    files = []
    for i in range(count):
        buffer = io.BytesIO()
        Image.fromarray(sample_image(hw[1], hw[0], seed=seed + i)).save(buffer, format="PNG")
        files.append(buffer.getvalue())
    return files


class _Users:
    """Clickers on one embedded image; each clicks, pauses, clicks until told to stop."""

    def __init__(self, transports: list[Any], model: str, image_id: str, think_s: float):
        self.transports, self.model, self.image_id = transports, model, image_id
        self.think_s = think_s
        self.rng = np.random.default_rng(0)

    async def click(self, transport: Any, tally: Tally) -> None:
        x, y = (float(v) for v in self.rng.uniform(100, 900, size=2))
        inputs = {
            IMAGE_ID: np.array([[self.image_id.encode()]], dtype=np.object_),
            "point_coords": np.array([[[x, y]]], np.float32),
            "point_labels": np.ones((1, 1), np.float32),
        }
        t0 = time.perf_counter()
        try:
            await transport.infer(self.model, inputs, ["masks", "iou_predictions"])
        except TritonSamError as e:
            tally.record(t0, e)
        else:
            tally.record(t0, None)

    async def run(self, tally: Tally, stop: asyncio.Event | None, clicks: int = 0) -> None:
        async def one(transport: Any) -> None:
            done = 0
            while not (stop is not None and stop.is_set()) and (not clicks or done < clicks):
                await self.click(transport, tally)
                done += 1
                pause = self.think_s * float(self.rng.uniform(0.5, 1.5))
                if stop is None:
                    await asyncio.sleep(pause)
                else:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), pause)

        await asyncio.gather(*(one(t) for t in self.transports))


async def _embed(transport: Any, model: str, png: bytes, tally: Tally) -> str | None:
    inputs = {IMAGE_BYTES: np.array([[png]], dtype=np.object_)}
    t0 = time.perf_counter()
    try:
        out = await transport.infer(model, inputs, [IMAGE_ID, "encoded"])
    except TritonSamError as e:
        tally.record(t0, e)
        return None
    tally.record(t0, None)
    value = out[IMAGE_ID].reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else str(value)


async def run_storm(
    server: Served,
    settings: StormSettings = StormSettings(),
    progress: Callable[[str], None] | None = None,
) -> StormReport:
    """Run the storm benchmark against ``server``'s session model over gRPC (``server.url``
    is its gRPC URL; its ``pid``, when known, is sampled for memory)."""
    from triton_sam.client.async_transport import AsyncTransport
    from triton_sam.client.retry import NO_RETRY
    from triton_sam.client.transport import resolve_endpoint

    say = progress or (lambda _: None)
    endpoint = resolve_endpoint(server.url, "grpc")
    model = server.session_model
    report = StormReport(model, settings)

    def transport() -> AsyncTransport:
        return AsyncTransport(endpoint, timeout_s=settings.timeout_s, retry=NO_RETRY)

    clickers = [transport() for _ in range(settings.clickers)]
    senders = [transport() for _ in range(8)]  # the storm's connections
    try:
        with MemorySampler(server.pid, settings.sample_every_s) as sampler:
            (png,) = storm_images(1, (480, 640), seed=10**6)
            setup = Tally()
            image_id = await _embed(senders[0], model, png, setup)
            if image_id is None:
                raise RuntimeError(f"the clickers' image was not embedded: {setup.error_samples}")
            users = _Users(clickers, model, image_id, settings.think_s)
            say(f"idle: {settings.clickers} users x {settings.idle_clicks} clicks")
            await users.run(report.idle, None, settings.idle_clicks)
            report.loaded_mib = to_mib(sampler.sample().server)
            seed = 0
            for n in settings.embeds:
                for round_ in (1, 2):
                    files = storm_images(n, settings.image_hw, seed=seed)
                    report.request_bytes = max(report.request_bytes, *map(len, files))
                    seed += n
                    run = StormRun(n, round_)
                    start = len(sampler.samples)
                    run.start_mib = to_mib(sampler.sample().server)
                    say(f"storm of {n} embeds (round {round_}) with {settings.clickers} users")
                    stop = asyncio.Event()
                    clicking = asyncio.ensure_future(users.run(run.clicks, stop))
                    t0 = time.perf_counter()
                    await asyncio.gather(
                        *(
                            _embed(senders[i % len(senders)], model, f, run.embed)
                            for i, f in enumerate(files)
                        )
                    )
                    run.wall_s = time.perf_counter() - t0
                    stop.set()
                    await clicking
                    sampler.sample()
                    await asyncio.sleep(settings.settle_s)
                    seen = [s.server for s in sampler.samples[start:] if s.server is not None]
                    run.peak_mib = to_mib(max(seen)) if seen else math.nan
                    report.runs.append(run)
    finally:
        for t in (*clickers, *senders):
            await t.close()
    return report


def run_storm_on_server(
    server: Served,
    settings: StormSettings = StormSettings(),
    progress: Callable[[str], None] | None = None,
) -> StormReport:
    """Blocking entry point of :func:`run_storm`."""
    return asyncio.run(run_storm(server, settings, progress))
