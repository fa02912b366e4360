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
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from triton_sam.bench.counters import ClickCounters, ServerCounters, wait_until_quiet
from triton_sam.bench.harness import Served
from triton_sam.bench.memory import MemorySample, MemorySampler, process_tree_rss
from triton_sam.bench.soak_report import MIB, SoakReport, SoakSettings, write_report
from triton_sam.client.speculative import SpeculativeSAM2Client

__all__ = [  # the report's names too: callers import them from here
    "MIB",
    "MemorySample",
    "MemorySampler",
    "SoakReport",
    "SoakSettings",
    "process_tree_rss",
    "run_soak",
    "run_soak_on_server",
    "soak_images",
    "write_report",
]


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
    server: Served,
    images: list[np.ndarray],
    *,
    settings: SoakSettings = SoakSettings(),
    protocol: str = "grpc",
    progress: Callable[[str], None] | None = None,
) -> SoakReport:
    """Run the soak against ``server`` (see the module docstring).

    Args:
        server: its URL for ``protocol`` and family; its pid, to sample its memory (None:
            client only); its statistics and metrics endpoints, to count what its decoders
            executed (None: not counted). The report is named after its ``name``.
        images: the images to encode (``settings.images`` of them are used, cycling).
        settings: sessions, duration, ...
        protocol: ``"grpc"`` or ``"http"``.
        progress: called with a line of text at each phase.
    """
    say = progress or (lambda _: None)
    report = SoakReport(server.name, protocol, settings)
    n_images = settings.images or settings.sessions
    pictures = [images[i % len(images)] for i in range(n_images)]
    clients = [
        SpeculativeSAM2Client(
            server.url,
            model_type=server.family,
            protocol=protocol,
            timeout_s=settings.timeout_s,
            use_server_embeddings=settings.server_embeddings,
        )
        for _ in range(settings.sessions)
    ]
    try:
        with MemorySampler(server.pid, settings.sample_every_s) as sampler:
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
            if server.http_url and active:  # every client takes the same path: ask the first
                counters = await asyncio.to_thread(
                    ClickCounters.of_client, active[0][1], server.http_url, server.metrics_url
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


def run_soak_on_server(
    server: Served,
    *,
    settings: SoakSettings = SoakSettings(),
    protocol: str = "grpc",
    progress: Callable[[str], None] | None = None,
) -> SoakReport:
    """Blocking entry point: synthetic images, :func:`run_soak`."""
    images = soak_images(settings.images or settings.sessions)
    return asyncio.run(
        run_soak(server, images, settings=settings, protocol=protocol, progress=progress)
    )
