"""What users run, timed in one run: every serving path, every operation, several models.

For each model the same image and prompts go through (see :mod:`triton_sam.bench.paths`):

- ``official``: the family's official predictor in this process (PyTorch, CPU), c=1 only (a
  predictor holds one image; it is what a user runs instead of a server);
- ``onnxruntime``: onnxruntime in this process on the served ONNX files (the baseline: the
  cost of the graphs with no serving at all);
- ``session-<protocol>``: ``SAM2TritonClient`` with server-side embeddings (the client's
  default) against the embedded server on Triton's onnxruntime backend;
- ``stateless-<protocol>``: the same client sending the features with every click;
- ``session-<protocol>-runner``: the session path on the python-runner twins of the same
  repository (the fallback for a server without the onnxruntime backend);
- ``onnxruntime-<variant>`` / ``session-<protocol>-<variant>``: ``encode`` only, on an
  encoder export variant (``fused``: onnxruntime's fused attention, ``int8``: int8 weights;
  see :mod:`triton_sam.export.optimize`), with the variant's measured agreement against the
  fp32 encoder on the benchmark image (:func:`encoder_agreement`).

Operations: ``encode``, ``click``, ``box``, ``refine`` (chained refinement; by reference on
the session path), and ``click-during-encode``: a session click on a cached image sent while
another caller's encode of a new image is running (the goal: "a click never waits for
another image's encode"). Every encode gets an image no server has seen (one pixel differs),
so the session path really encodes. Clicks run on an image encoded (untimed) per caller, one
image per caller, so concurrent callers never evict each other's kept logits. Ratios compare
p50s within the run: ``x_ort`` against ``onnxruntime`` at the same concurrency,
``x_official`` against the official predictor at c=1.

Memory: :func:`run_user_benchmark` measures each model in its own child process (spawned,
so it inherits nothing), one embedded server at a time within it, and merges the series: the
baselines of a model are measured in the same process as its served rows, and one model's
predictor, ORT sessions and servers are gone before the next model starts. The report's
settings carry each child's peak memory.

This module runs the benchmark; :mod:`~triton_sam.bench.users_models` exports the models,
:mod:`~triton_sam.bench.users_timing` times their cells, :mod:`~triton_sam.bench.users_report`
turns the series into ratios, goals and files (their names import from here too).
"""

from __future__ import annotations

import gc
import os
import resource
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from triton_sam.bench.harness import embedded, protocol_urls
from triton_sam.bench.latency import Series
from triton_sam.bench.memory import TreePeaks
from triton_sam.bench.users_models import (
    BASE_VARIANT,
    ENCODER_VARIANTS,
    ServedModel,
    encoder_agreement,
    prepare_encoder_variant,
    prepare_model,
    variant_tolerance,
)
from triton_sam.bench.users_report import (
    DURING_ENCODE,
    GOALS,
    OFFICIAL,
    ORT,
    UserReport,
    goals_markdown,
    markdown,
    summary_markdown,
    write_report,
)
from triton_sam.bench.users_timing import (
    bench_encoder_variant,
    bench_model,
    click_during_encode,
    image_variants,
)

__all__ = [  # the models', timing's and report's names too: callers import them from here
    "BASE_VARIANT",
    "DURING_ENCODE",
    "ENCODER_VARIANTS",
    "GOALS",
    "OFFICIAL",
    "ORT",
    "BenchSettings",
    "ServedModel",
    "UserReport",
    "bench_encoder_variant",
    "bench_model",
    "bench_one_model",
    "click_during_encode",
    "encoder_agreement",
    "goals_markdown",
    "image_variants",
    "markdown",
    "prepare_encoder_variant",
    "prepare_model",
    "run_user_benchmark",
    "served",
    "summary_markdown",
    "variant_tolerance",
    "write_report",
]


@contextmanager
def served(repository: Path, protocols: Sequence[str]) -> Iterator[dict[str, str]]:
    """Start one embedded server on ``repository``; yields protocol -> URL."""
    with embedded(repository) as server:
        yield protocol_urls(server, protocols)


@dataclass(frozen=True)
class BenchSettings:
    """What :func:`bench_one_model` times (see :func:`run_user_benchmark`)."""

    protocols: tuple[str, ...] = ("grpc", "http")
    concurrency: tuple[int, ...] = (1, 4)
    n_encode: int = 3
    n_decode: int = 30
    official: bool = True
    during_encode: bool = True


def bench_one_model(
    model: ServedModel, image: np.ndarray, settings: BenchSettings
) -> dict[str, object]:
    """Every series of one model, one embedded server at a time: the backend repository
    (official, ORT, session and stateless paths, click-during-encode), then the runner twins,
    then each encoder variant (encode only, plus its agreement with fp32).

    Returns:
        ``{"series": [Series], "agreement": {variant: ...}, "memory": {...}, "wall_s": s}``;
        ``memory`` (MiB): ``bench_process`` = this process's highest sampled RSS;
        ``servers_peak`` = the highest sampled PSS of its descendants (tritonserver and its
        stubs) together; ``tree_peak`` = the highest sampled PSS of this process plus all its
        descendants at once. Sampled every 2 s. (The kernel's high-water marks are not used:
        ``ru_maxrss`` of a process spawned for one model keeps its parent's mark from the
        fork, and a server forked from this process inherits this one's.)
    """
    t0 = time.perf_counter()
    series: list[Series] = []
    agreement: dict[str, dict[str, object]] = {}
    common = {"n_encode": settings.n_encode, "n_decode": settings.n_decode}
    with TreePeaks(2.0) as sampler:
        with served(model.repository, settings.protocols) as urls:
            series += bench_model(model, {"onnxruntime": urls}, image,
                                  concurrency=settings.concurrency, official=settings.official,
                                  during_encode=settings.during_encode, **common)  # fmt: skip
        gc.collect()
        if model.runner_repository is not None:
            with served(model.runner_repository, settings.protocols[:1]) as urls:
                series += bench_model(model, {"python": urls}, image,
                                      concurrency=settings.concurrency, official=False,
                                      baseline=False, during_encode=False, **common)  # fmt: skip
            gc.collect()
        for variant, repository in model.encoder_variants.items():
            agreement[variant] = encoder_agreement(
                model.repository, repository, model, image, variant_tolerance(variant)
            )
            with served(repository, settings.protocols[:1]) as urls:
                series += bench_encoder_variant(
                    model, variant, urls, image, n_encode=settings.n_encode
                )
            gc.collect()
    peak = sampler.peaks
    memory = {
        "bench_process": peak["own"] / 2**20,
        "servers_peak": peak["servers"] / 2**20,
        "tree_peak": peak["tree"] / 2**20,
    }
    return {"series": series, "agreement": agreement, "memory": memory,
            "wall_s": time.perf_counter() - t0}  # fmt: skip


def run_user_benchmark(
    models: Sequence[ServedModel],
    image: np.ndarray,
    settings: BenchSettings = BenchSettings(),
    *,
    encoder_variants: Sequence[str] = (BASE_VARIANT,),
    isolate: bool = True,
) -> UserReport:
    """:func:`bench_one_model` for each model, each in a fresh (spawned) child process when
    ``isolate``: a model's predictor, ORT sessions and servers are freed, by the process
    ending, before the next model starts. A child that dies (e.g. OOM-killed) is reported in
    ``settings["failed"]`` and the run goes on with the next model.

    ``settings["peak_rss_mib"]``: per model the child's figures (see
    :func:`bench_one_model`), and ``run`` = the highest ``tree_peak`` of any model (the
    run's peak: the children run one after the other) and this process's own peak RSS.
    """
    report = UserReport()
    report.settings = {"protocols": list(settings.protocols),
                       "concurrency": list(settings.concurrency),
                       "n_encode": settings.n_encode, "n_decode": settings.n_decode,
                       "encoder_variants": list(encoder_variants),
                       "image_hw": list(image.shape[:2]), "cpu_count": os.cpu_count(),
                       "isolated": isolate,
                       "load_average_before": list(os.getloadavg())}  # fmt: skip
    memory: dict[str, dict[str, float]] = {}
    failed: dict[str, str] = {}
    skipped = {m.spec.name: dict(m.skipped_variants) for m in models if m.skipped_variants}
    for model in models:
        name = model.spec.name
        try:
            if isolate:
                import multiprocessing

                spawn = multiprocessing.get_context("spawn")
                with ProcessPoolExecutor(1, mp_context=spawn) as pool:
                    result = pool.submit(bench_one_model, model, image, settings).result()
            else:
                result = bench_one_model(model, image, settings)
        except BrokenProcessPool as e:
            failed[name] = f"the benchmark process died (OOM-killed?): {e}"
            continue
        report.series[name] = result["series"]  # type: ignore[assignment]
        if result["agreement"]:
            report.agreement[name] = result["agreement"]  # type: ignore[assignment]
        memory[name] = {k: round(v, 1) for k, v in result["memory"].items()}  # type: ignore[attr-defined]
        memory[name]["wall_s"] = round(float(result["wall_s"]), 1)  # type: ignore[arg-type]
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    memory["run"] = {
        "tree_peak": max((m["tree_peak"] for m in memory.values()), default=0.0),
        "parent_process": round(own, 1),
    }
    report.settings["peak_rss_mib"] = memory
    if skipped:
        report.settings["skipped_variants"] = skipped
    if failed:
        report.settings["failed"] = failed
    report.settings["load_average_after"] = list(os.getloadavg())
    return report
