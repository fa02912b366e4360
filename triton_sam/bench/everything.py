"""Segment-everything benchmark: the official generator vs our graph + batching, in-process.

Rows, same weights, image and parameters, timed alternately (official, ours, official, ...)
so load from others on a shared machine falls on both alike:

- ``official``: ``SamAutomaticMaskGenerator`` / ``SAM2AutomaticMaskGenerator`` (torch, what a
  user would pick), ``output_mode="uncompressed_rle"`` (no pycocotools needed; our records
  carry compressed RLE, the extra encoding is counted against us);
- ``onnxruntime``: :class:`~triton_sam.tools.everything_local.LocalEverything`: the exported encoder
  and everything-decoder in onnxruntime, driven by ``serving/everything.py``.

- ``served`` (``--served``): ``SAM2TritonClient.generate_masks`` against the
  ``<family>_everything`` model of a repository written from the same checkpoint, on the
  embedded server (what ``triton-sam everything`` waits for). Each served run sends the image
  with one pixel changed, so the server encodes it as the in-process rows do (a repeat of the
  same image would reuse the session model's cached features); the server's peak memory
  (``tritonserver`` and its stubs, PSS) is reported beside it.

Parameters: random-init weights predict noise masks (logits ~0.1, predicted IoU ~0.45 / ~0),
so the defaults would keep nothing and, worse, let our graph skip the upsampling of masks the
predicted-IoU filter drops first (the official generator upsamples all of them). The default
here keeps every candidate through the upsampling and the stability score: pred_iou_thresh 0,
stability offset 0.02 / threshold 0.3, i.e. the full per-mask work of trained weights with
permissive thresholds. Pass ``--params`` to time others.

Example::

    python -m triton_sam.bench.everything --model sam2.1_hiera_tiny --points-per-side 8
"""

from __future__ import annotations

import contextlib
import itertools
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from triton_sam.serving import everything as ev

NOISE_PARAMS = {
    "pred_iou_thresh": 0.0,
    "stability_score_offset": 0.02,
    "stability_score_thresh": 0.3,
}


@dataclass(frozen=True)
class Row:
    """One way of generating, timed (its figures computed once, by :func:`bench_rows`).

    Attributes:
        name: ``official``, ``onnxruntime``, ...; seconds: each run's wall time;
        instances: instances of the last run; speedup: official median / this median;
        median_s: the median of ``seconds``.
    """

    name: str
    seconds: list[float]
    instances: int
    speedup: float
    median_s: float


def official_generator(family: str, model: Any, overrides: dict) -> Callable[[np.ndarray], list]:
    """The official generator of ``family`` on a built model, with ``overrides``."""
    kwargs = dict(overrides)
    if family == "sam1":
        from segment_anything import SamAutomaticMaskGenerator

        model.mask_threshold = kwargs.pop("mask_threshold", 0.0)
        gen = SamAutomaticMaskGenerator(model, output_mode="uncompressed_rle", **kwargs)
    else:
        from sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator

        gen = SAM2AutomaticMaskGenerator(model, output_mode="uncompressed_rle", **kwargs)
    return gen.generate


def bench_rows(
    runners: dict[str, Callable[[np.ndarray], list]],
    image: np.ndarray,
    *,
    repeats: int = 3,
    warmup: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> list[Row]:
    """Time each runner ``repeats`` times on ``image``, interleaved, after one untimed warm-up
    each (unless ``warmup`` is false: long runs, where the first call's set-up is noise);
    the first runner is the baseline of ``speedup``. ``clock`` is injectable so the loop's
    arithmetic is testable without wall-clock timing."""
    for run in runners.values() if warmup else ():
        run(image)
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    counts: dict[str, int] = {}
    for _ in range(repeats):
        for name, run in runners.items():
            start = clock()
            out = run(image)
            seconds[name].append(clock() - start)
            counts[name] = len(out)
    medians = {name: statistics.median(seconds[name]) for name in runners}
    baseline = next(iter(medians.values()))
    return [
        Row(name, seconds[name], counts[name], baseline / medians[name], medians[name])
        for name in runners
    ]


def prepare(model_name: str, work: Path, *, seed: int = 1) -> tuple[Any, Any, Path, Path]:
    """(spec, official model, encoder onnx, everything-decoder onnx) for a random-init model
    of ``model_name`` (seeded), exported once into ``work`` and reused from there."""
    from triton_sam.export import ExportOptions, export_model, exporter_for, save_random_checkpoint
    from triton_sam.export.everything import export_for_spec
    from triton_sam.models import get_model

    spec = get_model(model_name)
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = work / f"{model_name}.random{seed}.pt"
    if not checkpoint.exists():
        save_random_checkpoint(spec, checkpoint, seed=seed)
    encoder = work / "onnx" / "encoder.onnx"
    if not encoder.exists():
        result = export_model(spec, checkpoint, work / "onnx", ExportOptions(verify=False))
        encoder = result.encoder
    decoder = work / "onnx" / f"{ev.graph_name(spec.family.family)}.onnx"
    if not decoder.exists():
        decoder = export_for_spec(spec, checkpoint, work / "onnx")
    model = exporter_for(spec).build_model(spec, checkpoint)
    return spec, model, encoder, decoder


def run(
    model_name: str,
    work: Path,
    *,
    width: int = 640,
    height: int = 480,
    overrides: dict | None = None,
    repeats: int = 3,
    warmup: bool = True,
    served: bool = False,
) -> dict:
    """The rows for one model and parameter set (see the module docstring); ``served`` adds
    the served row."""
    from triton_sam.tools.everything_local import LocalEverything
    from triton_sam.tools.sample import sample_image

    spec, model, encoder, decoder = prepare(model_name, work)
    family = spec.family.family
    overrides = {**NOISE_PARAMS, **(overrides or {})}
    params = ev.parse_params(family, overrides)
    image = sample_image(width, height)
    ours = LocalEverything.from_onnx(family, encoder, decoder, spec.family.preprocessing)
    runners = {
        "official": official_generator(family, model, overrides),
        "onnxruntime": lambda img: ours.generate(img, params),
    }
    with contextlib.ExitStack() as stack:
        peak = None
        if served:
            served_run, peak = stack.enter_context(_served(spec, work, overrides))
            runners["served"] = served_run
        rows = bench_rows(runners, image, repeats=repeats, warmup=warmup)
    report = {
        "model": model_name,
        "image_wh": [width, height],
        "params": overrides,
        "rows": [asdict(r) for r in rows],
    }
    if peak is not None:
        report["served_peak_bytes"] = peak.bytes
    return report


@contextlib.contextmanager
def _served(spec: Any, work: Path, overrides: dict):
    """(runner, peak-memory sampler) of the served row: an embedded server over a repository
    written from :func:`prepare`'s checkpoint, as ``setup`` writes it."""
    from triton_sam.bench.everything_served import PeakMemory
    from triton_sam.bench.harness import embedded, setup_repository
    from triton_sam.client import SAM2TritonClient

    repo = setup_repository(
        spec,
        work / "model_repository",
        checkpoint=work / f"{spec.name}.random1.pt",
        reuse_model=f"{spec.family.family}_everything",
        everything=True,
    )
    with (
        embedded(repo) as s,
        SAM2TritonClient(s.grpc_url, model_type=spec.family.family, protocol="grpc") as client,
        PeakMemory(s.pid, 0.2) as peak,
    ):
        calls = itertools.count()

        def run(image: np.ndarray) -> list:
            fresh = image.copy()  # a new image each run: the server encodes it, as ours do
            fresh[0, 0, 0] ^= 1 + next(calls) % 255
            return client.generate_masks(fresh, **overrides).instances

        yield run, peak


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m triton_sam.bench.everything",
        description="Segment everything in-process: official generator vs onnxruntime + our "
        "batching (random-init weights, seeded).",
    )
    parser.add_argument("--model", default="sam2.1_hiera_tiny", help="sam1_vit_b, sam2.1_...")
    parser.add_argument("--points-per-side", type=int, default=32)
    parser.add_argument("--points-per-batch", type=int, default=64)
    parser.add_argument("--params", default="{}", help="JSON object of further overrides")
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed first run")
    parser.add_argument(
        "--served", action="store_true", help="add the served row (embedded server, same weights)"
    )
    parser.add_argument("--work", type=Path, default=Path(".bench/everything"))
    args = parser.parse_args(argv)
    overrides = {
        "points_per_side": args.points_per_side,
        "points_per_batch": args.points_per_batch,
        **json.loads(args.params),
    }
    report = run(
        args.model,
        args.work / args.model,
        width=args.width,
        height=args.height,
        overrides=overrides,
        repeats=args.repeats,
        warmup=not args.no_warmup,
        served=args.served,
    )
    print(json.dumps(report, indent=1))
    for row in report["rows"]:
        print(
            f"{row['name']:>12}: median {row['median_s']:.2f} s, {row['instances']} instances, "
            f"speedup x{row['speedup']:.2f}"
        )
    if report.get("served_peak_bytes"):
        print(f"served: server peak memory {report['served_peak_bytes'] / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
