"""How the user benchmark times a model's paths: every (level, operation) cell, each path in
turn, the click sent during another image's encode, and the encoder variants' encodes.
"""

from __future__ import annotations

import gc
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from triton_sam.bench import paths as bench_paths
from triton_sam.bench.latency import Series, measure
from triton_sam.bench.users_models import ServedModel
from triton_sam.bench.users_report import DURING_ENCODE, OFFICIAL, ORT


def image_variants(image: np.ndarray) -> Iterator[np.ndarray]:
    """``image`` with its first pixel set from a counter: a new content id (the session
    model's cache key) at the same preprocessing cost; 2**24 distinct images."""
    for k in itertools.count(1):
        variant = image.copy()
        variant[0, 0] = ((k >> 16) & 255, (k >> 8) & 255, k & 255)
        yield variant


def bench_model(
    model: ServedModel,
    urls: Mapping[str, Mapping[str, str]],
    image: np.ndarray,
    *,
    concurrency: Sequence[int] = (1, 4),
    n_encode: int = 3,
    n_decode: int = 30,
    official: bool = True,
    baseline: bool = True,
    during_encode: bool = True,
) -> list[Series]:
    """Time every operation of every path of one model.

    Args:
        model: what to serve and compare (see :class:`ServedModel`).
        urls: server -> protocol -> URL; server ``"onnxruntime"`` (the backend repository)
            and/or ``"python"`` (the runner twins; its first protocol only).
        image: HxWx3 uint8 RGB.
        concurrency: concurrent callers per level (encode: the first level only, see below).
        n_encode: timed encodes per series; n_decode: timed prompt calls per caller (a
            series at concurrency c makes ``n_decode * c``).
        official: include the official predictor (c=1).
        baseline: include in-process onnxruntime (the ``x_ort`` baseline).
        during_encode: add a ``click-during-encode`` series per session protocol of the
            ``"onnxruntime"`` server (``max(n_encode, 3)`` clicks, see
            :func:`click_during_encode`).

    Encodes are timed at the first concurrency level only: the encoder saturates every core
    at c=1, so more callers only queue (and each SAM1 ViT-B encode takes seconds here).
    """
    family = model.spec.family
    name = family.family
    factories: dict[str, Callable[[], bench_paths.Path]] = {}
    if official:
        factories[OFFICIAL] = lambda: bench_paths.OfficialPath(model.spec, model.checkpoint)
    sessions: list[object] = []

    def ort() -> bench_paths.Path:
        if not sessions:
            sessions.extend(bench_paths.ort_sessions(model.repository, family))
        return bench_paths.OrtPath((sessions[0], sessions[1]), family)

    if baseline:
        factories[ORT] = ort
    for protocol, url in urls.get("onnxruntime", {}).items():
        for kind, session in (("session", True), ("stateless", False)):
            factories[f"{kind}-{protocol}"] = lambda u=url, p=protocol, s=session: (
                bench_paths.ClientPath(u, p, name, session=s)
            )
    if urls.get("python"):
        protocol, url = next(iter(urls["python"].items()))
        factories[f"session-{protocol}-runner"] = lambda: bench_paths.ClientPath(
            url, protocol, name, session=True
        )
    variants = image_variants(image)
    out = _bench_paths(factories, variants, concurrency, n_encode, n_decode, name)
    sessions.clear()  # the ORT sessions (and their arenas) go with the last OrtPath
    if during_encode:
        for protocol, url in urls.get("onnxruntime", {}).items():
            path = f"session-{protocol}"
            encode = next(s for s in out if (s.graph, s.path) == ("encode", path))

            def client(u: str = url, p: str = protocol) -> bench_paths.ClientPath:
                return bench_paths.ClientPath(u, p, name, session=True)

            # A tenth of the encode's p50: well inside an encode even when the shared
            # machine's load makes encodes vary several-fold between samples.
            lead_s = 0.1 * encode.summary()["p50"] / 1e3
            out.append(click_during_encode(client, variants, max(n_encode, 3), lead_s, path))
    return out


def click_during_encode(
    client: Callable[[], bench_paths.Path],
    variants: Iterator[np.ndarray],
    n: int,
    lead_s: float,
    path: str,
) -> Series:
    """A click on a cached image, sent while another caller encodes a new image.

    Caller A encodes an image (untimed) and clicks once (warm-up). Then, ``n`` times: caller
    B starts encoding an image no one has seen on its own thread; ``lead_s`` later (a fraction
    of the encode's p50, see the caller) A clicks, and the click's latency is one sample.
    A sample counts only if B's encode was still running when the click was sent; otherwise
    it is retried (``4 * n`` tries in all), so every sample is a click that *could* have
    waited for the encode. A click that waits shows up as about the encode's remaining time.

    Returns:
        ``Series("click-during-encode", path, 1, ...)``; ``wall_s`` = the summed click time.
    """
    clicker, encoder = client(), client()
    try:
        clicker.encode(next(variants))
        clicker.click()
        samples: list[float] = []
        for _ in range(4 * n):
            if len(samples) == n:
                break
            encode = threading.Thread(
                target=encoder.encode, args=(next(variants),), name="bench-encode"
            )
            encode.start()
            time.sleep(lead_s)
            overlapped = encode.is_alive()
            t0 = time.perf_counter()
            clicker.click()
            ms = (time.perf_counter() - t0) * 1e3
            encode.join()
            if overlapped:
                samples.append(ms)
        if not samples:
            raise RuntimeError(f"{path}: every encode ended within {lead_s:.3f} s, before a click")
        return Series(DURING_ENCODE, path, 1, samples, sum(samples) / 1e3, clicker.request_bytes())
    finally:
        clicker.close()
        encoder.close()


def bench_encoder_variant(
    model: ServedModel,
    variant: str,
    urls: Mapping[str, str],
    image: np.ndarray,
    *,
    n_encode: int = 3,
) -> list[Series]:
    """``encode`` (c=1) on one encoder export variant: in-process onnxruntime
    (``onnxruntime-<variant>``) and the session path of each protocol in ``urls`` (a server
    on ``model.encoder_variants[variant]``; ``session-<protocol>-<variant>``)."""
    family = model.spec.family
    repository = model.encoder_variants[variant]
    factories: dict[str, Callable[[], bench_paths.Path]] = {
        f"{ORT}-{variant}": lambda: bench_paths.OrtPath(
            bench_paths.ort_sessions(repository, family), family
        )
    }
    for protocol, url in urls.items():
        factories[f"session-{protocol}-{variant}"] = lambda u=url, p=protocol: (
            bench_paths.ClientPath(u, p, family.family, session=True)
        )
    return _bench_paths(
        factories, image_variants(image), (1,), n_encode, 1, model.spec.name, ops=("encode",)
    )


def _bench_paths(
    factories: Mapping[str, Callable[[], bench_paths.Path]],
    variants: Iterator[np.ndarray],
    levels: Sequence[int],
    n_encode: int,
    n_decode: int,
    model: str,
    ops: Sequence[str] = bench_paths.OPERATIONS,
) -> list[Series]:
    """Every (level, operation) cell, each path in turn within it: compared cells are timed
    minutes apart at most, not a whole path's sweep apart, on a machine others load.

    One path object (connection, predictor) per caller; ``official`` has one caller and is
    closed and dropped after the first level (its only one), so the predictor's memory is
    not held through the concurrent levels. Before its first prompts each caller encodes its
    own image once (untimed); before ``refine`` each caller clicks once (untimed), so every
    timed refinement refines the caller's previous mask (by reference on the session path)
    and none is a first click.
    """
    widest = max(levels)
    callers: dict[str, list[bench_paths.Path]] = {}
    holding: set[int] = set()  # id() of callers that hold an image of their own
    out: list[Series] = []
    try:
        for path, factory in factories.items():
            callers[path] = [factory() for _ in range(1 if path == OFFICIAL else widest)]
        for c in levels:
            active = {p: cs[:c] for p, cs in callers.items() if p != OFFICIAL or c == 1}
            level_ops = ops if c == levels[0] else [op for op in ops if op != "encode"]
            prepared = False
            for op in level_ops:
                for path, group in active.items():
                    if op == "encode":
                        call = _encode_call(group, variants)
                        n = max(n_encode, c)
                        holding.add(id(group[0]))  # the warm-up call encodes at least
                    else:
                        if not prepared:  # callers new at this level get an image
                            for caller in itertools.chain.from_iterable(active.values()):
                                if id(caller) not in holding:
                                    caller.encode(next(variants))
                                    holding.add(id(caller))
                            prepared = True
                        if op == "refine":
                            for caller in group:
                                caller.click()
                        call = _prompt_call(group, op)
                        # n_decode calls per caller: a throughput over 4 callers needs a
                        # window longer than the ramp-up and tail (40 calls at c=4 read
                        # 0.74x where 100 read 0.92x, same server, minutes apart).
                        n = n_decode * c
                    samples, wall = measure(call, n, c, f"{model} {op} {path} c={c}")
                    out.append(Series(op, path, c, samples, wall, group[0].request_bytes()))
            if OFFICIAL in callers:  # c=1 only: free the predictor before the next level
                for caller in callers.pop(OFFICIAL):
                    caller.close()
                gc.collect()
    finally:
        for caller in itertools.chain.from_iterable(callers.values()):
            caller.close()
    return out


def _encode_call(
    callers: Sequence[bench_paths.Path], variants: Iterator[np.ndarray]
) -> Callable[[int], object]:
    """Caller i encodes an image no one has encoded before (callers run in threads when
    the first level is concurrent: the generator is advanced under a lock)."""
    lock = threading.Lock()

    def call(i: int) -> object:
        with lock:
            image = next(variants)
        return callers[i].encode(image)

    return call


def _prompt_call(callers: Sequence[bench_paths.Path], op: str) -> Callable[[int], object]:
    """``callers[i].<op>()`` as a function of the caller index."""
    return lambda i: getattr(callers[i], op)()
