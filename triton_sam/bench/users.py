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
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import resource
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from triton_sam.bench import paths as bench_paths
from triton_sam.bench.harness import embedded, protocol_urls
from triton_sam.bench.latency import Series, measure
from triton_sam.bench.memory import TreePeaks
from triton_sam.models.spec import ModelSpec

OFFICIAL = "official"
ORT = "onnxruntime"
DURING_ENCODE = "click-during-encode"
# Encoder export variants the bench can build from the fp32 export (label -> the tolerance
# its agreement with the fp32 encoder is judged by: the one the export check uses for it).
BASE_VARIANT = "fp32"
ENCODER_VARIANTS = ("fp32", "fused", "int8")


@dataclass(frozen=True)
class ServedModel:
    """One model ready to benchmark.

    Attributes:
        spec: the variant.
        checkpoint: the weights the ONNX files were exported from (the official predictor
            loads the same file).
        repository: the embedded server's repository (onnxruntime backend twins).
        runner_repository: its python-runner twins, or None to skip that row.
        encoder_variants: label (``fused``, ``int8``) -> an embedded repository identical
            to ``repository`` but for that encoder export variant.
        skipped_variants: label -> why this model has no such variant (e.g. no attention
            fusion for its family).
    """

    spec: ModelSpec
    checkpoint: Path
    repository: Path
    runner_repository: Path | None = None
    encoder_variants: Mapping[str, Path] = field(default_factory=dict)
    skipped_variants: Mapping[str, str] = field(default_factory=dict)


@dataclass
class UserReport:
    """Series of every (model, operation, path, concurrency) of one run, plus its settings.

    ``agreement``: model -> encoder variant -> ``{"max_abs": {output: float}, "tolerance": str,
    "within": bool}`` (see :func:`encoder_agreement`).
    """

    series: dict[str, list[Series]] = field(default_factory=dict)  # model -> series
    settings: dict[str, object] = field(default_factory=dict)
    agreement: dict[str, dict[str, dict[str, object]]] = field(default_factory=dict)

    def get(self, model: str, op: str, path: str, concurrency: int) -> Series | None:
        """The series of one cell, if measured."""
        for s in self.series.get(model, []):
            if (s.graph, s.path, s.concurrency) == (op, path, concurrency):
                return s
        return None

    def p50(self, model: str, op: str, path: str, concurrency: int = 1) -> float | None:
        """The p50 (ms) of one cell, if measured."""
        s = self.get(model, op, path, concurrency)
        return None if s is None else s.summary()["p50"]

    def table(self) -> list[dict[str, object]]:
        """One row per series with p50/p95/p99/throughput and same-run p50 ratios
        (``click-during-encode`` is compared with ``click``'s baselines)."""
        rows = []
        for model, series in self.series.items():
            for s in series:
                summary = s.summary()
                row: dict[str, object] = {"model": model, "op": s.graph, "path": s.path,
                                          "concurrency": s.concurrency, **summary,
                                          "bytes": s.request_bytes}  # fmt: skip
                op = "click" if s.graph == DURING_ENCODE else s.graph
                for key, base in (
                    ("x_ort", self.get(model, op, ORT, s.concurrency)),
                    ("x_official", self.get(model, op, OFFICIAL, 1)),
                ):
                    if base is not None:
                        row[key] = summary["p50"] / base.summary()["p50"]
                rows.append(row)
        return rows

    def goals(self) -> list[dict[str, object]]:
        """The serving goals as ratios, one row per (model, session path), from same-run p50s:

        - ``click_x_ort``: session click p50 / in-process ORT click p50, c=1 (goal <= 1.3);
        - ``clicks_per_s_x_ort``: session clicks/s / ORT clicks/s at the highest concurrency
          (goal >= 0.8);
        - ``encode_x_official``: variant -> served (this path's) encode p50 / the official
          predictor's ``set_image`` p50 (goal <= 1.0);
        - ``during_encode_x_encode``: click-during-encode p50 / this path's encode p50
          (goal < 0.5).
        Missing cells are left out of a row.
        """
        levels = [int(c) for c in self.settings.get("concurrency", [1])]  # type: ignore[union-attr]
        top = max(levels)
        rows: list[dict[str, object]] = []
        for model, series in self.series.items():
            names = dict.fromkeys(s.path for s in series)
            variants = dict.fromkeys(
                v
                for v in self.settings.get("encoder_variants", [BASE_VARIANT])  # type: ignore[union-attr]
            )
            for path in names:
                if not path.startswith("session-") or _variant_of(path, variants):
                    continue
                row: dict[str, object] = {"model": model, "path": path}
                click, ort = self.p50(model, "click", path), self.p50(model, "click", ORT)
                if click is not None and ort is not None:
                    row["click_x_ort"] = click / ort
                s, base = self.get(model, "click", path, top), self.get(model, "click", ORT, top)
                if s is not None and base is not None and top > 1:
                    row["clicks_per_s_x_ort"] = (
                        s.summary()["throughput"] / base.summary()["throughput"]
                    )
                official = self.p50(model, "encode", OFFICIAL)
                encodes: dict[str, float] = {}
                for variant in variants:
                    name = path if variant == BASE_VARIANT else f"{path}-{variant}"
                    encode = self.p50(model, "encode", name)
                    if encode is not None and official is not None:
                        encodes[variant] = encode / official
                if encodes:
                    row["encode_x_official"] = encodes
                during, encode = (
                    self.p50(model, DURING_ENCODE, path),
                    self.p50(model, "encode", path),
                )
                if during is not None and encode is not None:
                    row["during_encode_x_encode"] = during / encode
                rows.append(row)
        return rows


def _variant_of(path: str, variants: Mapping[str, None]) -> str | None:
    """The encoder variant a path name ends with (``session-grpc-fused`` -> ``fused``)."""
    for v in variants:
        if v != BASE_VARIANT and path.endswith(f"-{v}"):
            return v
    return None


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


def encoder_agreement(
    reference: Path, variant: Path, model: ServedModel, image: np.ndarray, tolerance: Any
) -> dict[str, object]:
    """How far an encoder variant's outputs are from the fp32 encoder's on ``image``.

    Both encoders (``<repo>/<encoder>/1/model.onnx`` of the two embedded repositories) run
    in-process onnxruntime on the same preprocessed tensor. ``tolerance`` (an
    ``onnx_utils.Tolerance``) is the one the export check uses for that variant.

    Returns:
        ``{"max_abs": {output: float}, "tolerance": str, "within": bool}``;
        ``within``: every output is within ``tolerance`` (``Tolerance.mismatch``).
    """
    import onnxruntime as ort

    from triton_sam.client import model_frame

    family = model.spec.family
    tensor = model_frame.preprocess(image, family.preprocessing)
    names = list(family.embedding_names)
    outputs = []
    for repo in (reference, variant):
        path = (repo / family.encoder_model / "1" / "model.onnx").resolve()
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outputs.append(session.run(names, {family.encoder_inputs[0].name: tensor}))
        del session  # one encoder session alive at a time
    max_abs, within = {}, True
    for name, r, v in zip(names, *outputs, strict=True):
        max_abs[name] = float(np.max(np.abs(v - r)))
        within &= tolerance.mismatch(v, r) is None
    return {"max_abs": max_abs, "tolerance": tolerance.describe(), "within": within}


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


# -- preparing models ---------------------------------------------------------------------


def prepare_model(
    name: str,
    work_dir: Path,
    *,
    checkpoints_dir: Path = Path("checkpoints"),
    runner: bool = True,
    encoder_variants: Sequence[str] = (),
) -> ServedModel:
    """Export ``name`` once into ``work_dir/<name>`` (reused when its build finished before)
    and write its embedded repositories.

    Weights: the verified checkpoint in ``checkpoints_dir`` when there is one, else a seeded
    random initialisation of the official config written beside the export (for the SAM3
    tracker the small config of :func:`triton_sam.export.sam3.small_config`: the real
    1008/288 tensor contract with a 2-layer ViT), so the official predictor and the ONNX
    files share their weights.

    ``encoder_variants`` (besides ``fp32``, the export itself): see
    :func:`prepare_encoder_variant`; a variant the family has no rewrite for is recorded in
    ``skipped_variants`` instead of failing the run.
    """
    from triton_sam.errors import ExportError
    from triton_sam.models import get_model
    from triton_sam.repository.writer import embedded_repository
    from triton_sam.setup.pipeline import build_repository, obtain_checkpoint

    unknown = set(encoder_variants) - set(ENCODER_VARIANTS)
    if unknown:
        from triton_sam.errors import InputValidationError

        raise InputValidationError(
            "encoder_variants", f"got {sorted(unknown)}, expected from {list(ENCODER_VARIANTS)}"
        )
    spec = get_model(name)
    root = work_dir / name
    checkpoint = _checkpoint(spec, root, checkpoints_dir)
    repo = root / "model_repository"
    done = root / "build.json"
    if not (done.is_file() and json.loads(done.read_text()).get("checkpoint") == str(checkpoint)):
        if repo.exists():
            shutil.rmtree(repo)
        checkpoint = obtain_checkpoint(
            spec, checkpoint=checkpoint, checkpoints_dir=checkpoints_dir, download=False
        )
        build_repository(spec, repo, checkpoint=checkpoint, checkpoints_dir=checkpoints_dir)
        done.write_text(json.dumps({"checkpoint": str(checkpoint)}))
    # fp32: the graphs as exported; `triton-sam serve`'s default twin is the ``fused`` variant
    # where the family has an attention fusion (the same twin as the served path otherwise).
    served = embedded_repository(repo, root / "embedded", fuse_attention=False)
    runner_repo = embedded_repository(repo, root / "runner", target="python") if runner else None
    variants: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    for variant in dict.fromkeys(encoder_variants):
        if variant == BASE_VARIANT:
            continue
        try:
            variants[variant] = prepare_encoder_variant(spec, repo, root / variant, variant)
        except ExportError as e:
            skipped[variant] = str(e)
    return ServedModel(spec, checkpoint, served, runner_repo, variants, skipped)


def prepare_encoder_variant(spec: ModelSpec, repo: Path, root: Path, variant: str) -> Path:
    """An embedded repository like ``repo``'s but with the encoder rewritten as ``variant``.

    ``fused``: exactly what ``triton-sam serve`` serves by default (the CPU twin with fused
    attention, :mod:`~triton_sam.repository.cpu_graphs`). ``int8``: a copy of the fp32
    export's encoder through :func:`~triton_sam.export.optimize.quantize_int8` (the rewrite
    ``export.quantize=int8`` applies; no second torch export), every other model linked to
    ``repo``'s files, reused when ``root/variant.json`` names the same source encoder.

    Raises:
        ExportError: the family has no such rewrite (fused: see
            :func:`~triton_sam.export.optimize.has_attention_fusion`) or it failed.
    """
    from triton_sam.errors import ExportError
    from triton_sam.export import optimize
    from triton_sam.repository import cpu_graphs
    from triton_sam.repository.writer import (
        ModelFiles,
        embedded_repository,
        list_models,
        read_model,
        write_models,
    )

    encoder_name = spec.family.encoder_model
    if variant == "fused":
        if not optimize.has_attention_fusion(spec.family.family):
            raise ExportError(f"fuse_attention: no attention fusion for {spec.family.family!r}")
        served = embedded_repository(repo, root / "embedded")
        if not cpu_graphs.graph_family(served / encoder_name / "1" / "model.onnx")[1]:
            raise ExportError(f"{encoder_name}: attention fusion failed (see the log)")
        return served
    if variant != "int8":
        raise ValueError(f"variant {variant!r}: no encoder rewrite")
    source = (repo / encoder_name / "1" / "model.onnx").resolve()
    marker = root / "variant.json"
    stamp = {"variant": variant, "source": str(source), "mtime": source.stat().st_mtime}
    variant_repo = root / "model_repository"
    if not (marker.is_file() and json.loads(marker.read_text()) == stamp):
        if root.exists():
            shutil.rmtree(root)
        encoder_dir = root / "encoder"
        encoder_dir.mkdir(parents=True)
        models = [read_model(repo, name) for name in list_models(repo)]
        encoder = next(m for m in models if m.name == encoder_name)
        files = {}
        for rel, src in encoder.files.items():  # model.onnx and its .onnx_data sidecar
            dest = encoder_dir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(src).resolve(), dest)
            files[rel] = dest
        optimize.quantize_int8(encoder_dir / "model.onnx")
        models = [
            ModelFiles(m.name, m.config_text, files) if m.name == encoder_name else m
            for m in models
        ]
        write_models(variant_repo, models, link=True)
        marker.write_text(json.dumps(stamp))
    return embedded_repository(variant_repo, root / "embedded", fuse_attention=False)


def variant_tolerance(variant: str) -> Any:
    """The tolerance the export check uses for an encoder ``variant`` (see
    :mod:`triton_sam.export.optimize`): fp32's for fused attention (same math up to float
    reassociation), ``INT8_TOLERANCE`` for int8 weights."""
    from triton_sam.export import onnx_utils, optimize

    return optimize.INT8_TOLERANCE if variant == "int8" else onnx_utils.FP32_TOLERANCE


def _checkpoint(spec: ModelSpec, root: Path, checkpoints_dir: Path) -> Path:
    from triton_sam.errors import CheckpointError, IntegrityError
    from triton_sam.models.checkpoints import resolve_checkpoint

    if not spec.checkpoint.hf_repo:
        try:
            return resolve_checkpoint(spec.checkpoint, None, checkpoints_dir)
        except (CheckpointError, IntegrityError):
            pass
    root.mkdir(parents=True, exist_ok=True)
    if spec.family.family == "sam3":
        from triton_sam.export import sam3

        path = root / "random_small_sam3"
        if not path.exists():
            sam3.save_random_checkpoint(spec, path, seed=0, config=sam3.small_config())
        return path
    from triton_sam.export import save_random_checkpoint

    path = root / f"random_{spec.checkpoint.filename}"
    if not path.exists():
        save_random_checkpoint(spec, path, seed=0)
    return path


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
    *,
    protocols: Sequence[str] = ("grpc", "http"),
    concurrency: Sequence[int] = (1, 4),
    n_encode: int = 3,
    n_decode: int = 30,
    official: bool = True,
    during_encode: bool = True,
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
    settings = BenchSettings(tuple(protocols), tuple(concurrency), n_encode, n_decode,
                             official, during_encode)  # fmt: skip
    report.settings = {"protocols": list(protocols), "concurrency": list(concurrency),
                       "n_encode": n_encode, "n_decode": n_decode,
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


# -- report -------------------------------------------------------------------------------


def write_report(report: UserReport, out_dir: Path) -> dict[str, Path]:
    """Write ``users.json``, ``users.md`` (goals, summary, every cell) and ``users.png``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = report.table()
    files = {"json": out_dir / "users.json", "md": out_dir / "users.md"}
    series = {m: [asdict(s) for s in ss] for m, ss in report.series.items()}
    payload = {"settings": report.settings, "goals": report.goals(), "rows": rows,
               "agreement": report.agreement, "series": series}  # fmt: skip
    files["json"].write_text(json.dumps(payload, indent=2))
    text = "\n".join([goals_markdown(report), summary_markdown(report), markdown(report, rows)])
    files["md"].write_text(text)
    files["png"] = _plot(rows, out_dir / "users.png")
    return files


def markdown(report: UserReport, rows: list[dict[str, object]] | None = None) -> str:
    """The run's table: one row per (model, operation, path, concurrency)."""
    rows = report.table() if rows is None else rows
    s = report.settings
    lines = [
        "| model | op | path | c | p50 ms | p95 ms | p99 ms | req/s | x ORT p50 "
        "| x official p50 | bytes sent |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratios = [f"{r[k]:.2f}" if k in r else "-" for k in ("x_ort", "x_official")]
        lines.append(
            f"| {r['model']} | {r['op']} | {r['path']} | {r['concurrency']} | {r['p50']:.1f} | "
            f"{r['p95']:.1f} | {r['p99']:.1f} | {r['throughput']:.1f} | {ratios[0]} | "
            f"{ratios[1]} | {_size(int(r['bytes']))} |"  # type: ignore[call-overload]
        )
    load = s.get("load_average_before"), s.get("load_average_after")
    lines += ["", f"settings: {json.dumps({k: v for k, v in s.items() if 'load' not in k})}; "
              f"load average (1/5/15 min) before {load[0]}, after {load[1]}"]  # fmt: skip
    return "\n".join(lines) + "\n"


# The serving goals: (goal-row key, column title, test on the ratio, goal text).
GOALS: tuple[tuple[str, str, Callable[[float], bool], str], ...] = (
    ("click_x_ort", "session click p50 / ORT click, c=1", lambda x: x <= 1.3, "<= 1.3"),
    ("clicks_per_s_x_ort", "session clicks/s / ORT clicks/s, c={top}", lambda x: x >= 0.8,
     ">= 0.8"),
    ("encode_x_official", "served encode / official set_image", lambda x: x <= 1.0, "<= 1.0"),
    ("during_encode_x_encode", "click during another encode / encode", lambda x: x < 0.5,
     "< 0.5"),
)  # fmt: skip


def goals_markdown(report: UserReport) -> str:
    """The goal ratios (see :meth:`UserReport.goals`), each marked met or not, and the
    encoder variants' agreement with fp32."""
    levels = [int(c) for c in report.settings.get("concurrency", [1])]  # type: ignore[union-attr]
    top = max(levels)
    head = [title.format(top=top) + f" (goal {goal})" for _, title, _, goal in GOALS]
    lines = [
        "| model | path | " + " | ".join(head) + " |",
        "|---|---|" + "---|" * len(GOALS),
    ]
    for row in report.goals():
        cells = []
        for key, _, test, _ in GOALS:
            value = row.get(key)
            if isinstance(value, dict):
                cells.append(", ".join(f"{v} {_mark(x, test)}" for v, x in value.items()))
            else:
                cells.append("-" if value is None else _mark(float(value), test))  # type: ignore[arg-type]
        lines.append(f"| {row['model']} | {row['path']} | " + " | ".join(cells) + " |")
    for model, variants in report.agreement.items():
        for variant, a in variants.items():
            worst = max(a["max_abs"].values())  # type: ignore[attr-defined]
            verdict = "within" if a["within"] else "OUTSIDE"
            lines.append(
                f"\n{model} encoder `{variant}` vs fp32 (same image, in-process ORT): max |diff| "
                f"{worst:.2e}, {verdict} the export check's tolerance ({a['tolerance']})"
            )
    for model, why in dict(report.settings.get("skipped_variants", {})).items():  # type: ignore[call-overload]
        lines.append(f"\n{model}: no encoder variant {why}")
    for model, why in dict(report.settings.get("failed", {})).items():  # type: ignore[call-overload]
        lines.append(f"\n{model}: FAILED, {why}")
    return "\n".join(lines) + "\n"


def _mark(x: float, test: Callable[[float], bool]) -> str:
    return f"{x:.2f}x {'met' if test(x) else 'NOT met'}"


def summary_markdown(report: UserReport) -> str:
    """The run in one table: a row per (model, path); p50 ms at c=1 with its same-run ratio
    (encode against the official predictor, prompts against onnxruntime), and click
    throughput at the highest concurrency against onnxruntime's. One row per protocol:
    HTTP and gRPC side by side when both were measured."""
    levels = [int(c) for c in report.settings.get("concurrency", [1])]  # type: ignore[union-attr]
    top = max(levels)
    lines = [
        f"| model | path | encode p50 (x official) | click p50 (x ORT) | box p50 (x ORT) "
        f"| refine p50 (x ORT) | click during encode p50 (x encode) "
        f"| clicks/s at c={top} (x ORT) | bytes per click |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model, series in report.series.items():
        for path in dict.fromkeys(s.path for s in series):
            cells = []
            for op, base in (("encode", OFFICIAL), ("click", ORT), ("box", ORT), ("refine", ORT)):
                cells.append(_cell(report, model, op, path, 1, base, "p50"))
            during, encode = (
                report.p50(model, DURING_ENCODE, path),
                report.p50(model, "encode", path),
            )
            cells.append(
                "-"
                if during is None
                else f"{during:.0f} ms" + ("" if encode is None else f" ({during / encode:.2f}x)")
            )
            cells.append(_cell(report, model, "click", path, top, ORT, "throughput"))
            click = report.get(model, "click", path, 1)
            cells.append(_size(click.request_bytes) if click is not None else "-")
            lines.append(f"| {model} | {path} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(report: UserReport, model: str, op: str, path: str, c: int, base: str, key: str) -> str:
    """``value (ratio)``: ratio against ``base`` (at c=1 for the official predictor)."""
    s = report.get(model, op, path, c)
    if s is None:
        return "-"
    value = s.summary()[key]
    text = f"{value:.0f} ms" if key == "p50" else f"{value:.1f}"
    b = report.get(model, op, base, 1 if base == OFFICIAL else c)
    if b is not None and path != base:
        text += f" ({value / b.summary()[key]:.2f}x)"
    return text


def _size(n: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _plot(rows: list[dict[str, object]], path: Path) -> Path:
    """p50 per operation and path (log scale), one panel per model; c=1 solid, others hatched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(str(r["model"]) for r in rows))
    ops = list(dict.fromkeys([*bench_paths.OPERATIONS, *(str(r["op"]) for r in rows)]))
    fig, axes = plt.subplots(len(models), 1, figsize=(12, 3.6 * len(models)), squeeze=False)
    for ax, model in zip(axes[:, 0], models, strict=True):
        sel = [r for r in rows if r["model"] == model]
        names = list(dict.fromkeys(str(r["path"]) for r in sel))
        levels = sorted({int(r["concurrency"]) for r in sel})  # type: ignore[call-overload]
        width = 0.8 / (len(names) * len(levels))
        for k, (name, c) in enumerate(itertools.product(names, levels)):
            label: str | None = f"{name} c={c}"
            for j, op in enumerate(ops):
                hit = [r for r in sel if (r["path"], r["concurrency"], r["op"]) == (name, c, op)]
                if hit:
                    colour, hatch = f"C{names.index(name)}", None if c == 1 else "//"
                    p50 = float(hit[0]["p50"])  # type: ignore[arg-type]
                    ax.bar(j + k * width, p50, width, color=colour, hatch=hatch, label=label)
                    label = None  # one legend entry per (path, concurrency)
        ax.set_xticks(np.arange(len(ops)) + 0.4 - width / 2)
        ax.set_xticklabels(ops)
        ax.set(title=model, ylabel="p50 ms (log)", yscale="log")
        ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
