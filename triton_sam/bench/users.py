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
  repository (the fallback for a server without the onnxruntime backend).

Operations: ``encode``, ``click``, ``box``, ``refine`` (chained refinement; by reference on
the session path). Every encode gets an image no server has seen (one pixel differs), so the
session path really encodes. Clicks run on an image encoded (untimed) per caller, one image
per caller, so concurrent callers never evict each other's kept logits. Ratios compare p50s
within the run: ``x_ort`` against ``onnxruntime`` at the same concurrency, ``x_official``
against the official predictor at c=1.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from triton_sam.bench import paths as bench_paths
from triton_sam.bench.latency import Series, measure
from triton_sam.models.spec import ModelSpec

OFFICIAL = "official"
ORT = "onnxruntime"


@dataclass(frozen=True)
class ServedModel:
    """One model ready to benchmark.

    Attributes:
        spec: the variant.
        checkpoint: the weights the ONNX files were exported from (the official predictor
            loads the same file).
        repository: the embedded server's repository (onnxruntime backend twins).
        runner_repository: its python-runner twins, or None to skip that row.
    """

    spec: ModelSpec
    checkpoint: Path
    repository: Path
    runner_repository: Path | None = None


@dataclass
class UserReport:
    """Series of every (model, operation, path, concurrency) of one run, plus its settings."""

    series: dict[str, list[Series]] = field(default_factory=dict)  # model -> series
    settings: dict[str, object] = field(default_factory=dict)

    def get(self, model: str, op: str, path: str, concurrency: int) -> Series | None:
        """The series of one cell, if measured."""
        for s in self.series.get(model, []):
            if (s.graph, s.path, s.concurrency) == (op, path, concurrency):
                return s
        return None

    def table(self) -> list[dict[str, object]]:
        """One row per series with p50/p95/p99/throughput and same-run p50 ratios."""
        rows = []
        for model, series in self.series.items():
            for s in series:
                summary = s.summary()
                row: dict[str, object] = {"model": model, "op": s.graph, "path": s.path,
                                          "concurrency": s.concurrency, **summary,
                                          "bytes": s.request_bytes}  # fmt: skip
                for key, base in (
                    ("x_ort", self.get(model, s.graph, ORT, s.concurrency)),
                    ("x_official", self.get(model, s.graph, OFFICIAL, 1)),
                ):
                    if base is not None:
                        row[key] = summary["p50"] / base.summary()["p50"]
                rows.append(row)
        return rows


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
) -> list[Series]:
    """Time every operation of every path of one model.

    Args:
        model: what to serve and compare (see :class:`ServedModel`).
        urls: server -> protocol -> URL; server ``"onnxruntime"`` (the backend repository,
            required) and optionally ``"python"`` (the runner twins; its first protocol only).
        image: HxWx3 uint8 RGB.
        concurrency: concurrent callers per level (encode: the first level only, see below).
        n_encode / n_decode: timed calls per series (at least one per caller).
        official: include the official predictor (c=1).

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

    factories[ORT] = ort
    for protocol, url in urls["onnxruntime"].items():
        for kind, session in (("session", True), ("stateless", False)):
            factories[f"{kind}-{protocol}"] = lambda u=url, p=protocol, s=session: (
                bench_paths.ClientPath(u, p, name, session=s)
            )
    if "python" in urls and urls["python"]:
        protocol, url = next(iter(urls["python"].items()))
        factories[f"session-{protocol}-runner"] = lambda: bench_paths.ClientPath(
            url, protocol, name, session=True
        )

    return _bench_paths(factories, image_variants(image), concurrency, n_encode, n_decode, name)


def _bench_paths(
    factories: Mapping[str, Callable[[], bench_paths.Path]],
    variants: Iterator[np.ndarray],
    levels: Sequence[int],
    n_encode: int,
    n_decode: int,
    model: str,
) -> list[Series]:
    """Every (level, operation) cell, each path in turn within it: compared cells are timed
    minutes apart at most, not a whole path's sweep apart, on a machine others load.

    One path object (connection, predictor) per caller; ``official`` has one caller.
    Before its first prompts each caller encodes its own image once (untimed); before
    ``refine`` each caller clicks once (untimed), so every timed refinement refines the
    caller's previous mask (by reference on the session path) and none is a first click.
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
            ops = bench_paths.OPERATIONS if c == levels[0] else bench_paths.OPERATIONS[1:]
            prepared = False
            for op in ops:
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
                        n = max(n_decode, c)
                    samples, wall = measure(call, n, c, f"{model} {op} {path} c={c}")
                    out.append(Series(op, path, c, samples, wall, group[0].request_bytes()))
    finally:
        for caller in itertools.chain.from_iterable(callers.values()):
            caller.close()
    return out


def _encode_call(
    callers: Sequence[bench_paths.Path], variants: Iterator[np.ndarray]
) -> Callable[[int], object]:
    """Caller i encodes an image no one has encoded before."""
    return lambda i: callers[i].encode(next(variants))


def _prompt_call(callers: Sequence[bench_paths.Path], op: str) -> Callable[[int], object]:
    """``callers[i].<op>()`` as a function of the caller index."""
    return lambda i: getattr(callers[i], op)()


# -- preparing models ---------------------------------------------------------------------


def prepare_model(
    name: str, work_dir: Path, *, checkpoints_dir: Path = Path("checkpoints"), runner: bool = True
) -> ServedModel:
    """Export ``name`` once into ``work_dir/<name>`` (reused when its build finished before)
    and write its embedded repositories.

    Weights: the verified checkpoint in ``checkpoints_dir`` when there is one, else a seeded
    random initialisation of the official config written beside the export (for the SAM3
    tracker the small config of :func:`triton_sam.export.sam3.small_config`: the real
    1008/288 tensor contract with a 2-layer ViT), so the official predictor and the ONNX
    files share their weights.
    """
    from triton_sam.models import get_model
    from triton_sam.pipeline import build_repository, obtain_checkpoint
    from triton_sam.repository.writer import embedded_repository

    spec = get_model(name)
    root = work_dir / name
    checkpoint = _checkpoint(spec, root, checkpoints_dir)
    repo = root / "model_repository"
    done = root / "build.json"
    if not (done.is_file() and json.loads(done.read_text()).get("checkpoint") == str(checkpoint)):
        if repo.exists():
            import shutil

            shutil.rmtree(repo)
        checkpoint = obtain_checkpoint(
            spec, checkpoint=checkpoint, checkpoints_dir=checkpoints_dir, download=False
        )
        build_repository(spec, repo, checkpoint=checkpoint, checkpoints_dir=checkpoints_dir)
        done.write_text(json.dumps({"checkpoint": str(checkpoint)}))
    served = embedded_repository(repo, root / "embedded")
    runner_repo = embedded_repository(repo, root / "runner", target="python") if runner else None
    return ServedModel(spec, checkpoint, served, runner_repo)


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
def served(model: ServedModel, protocols: Sequence[str]) -> Iterator[dict[str, dict[str, str]]]:
    """Start the embedded servers of ``model``; yields server -> protocol -> URL."""
    from triton_sam.server import EmbeddedTriton

    ports = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
    with ExitStack() as stack:
        repos = {"onnxruntime": model.repository, "python": model.runner_repository}
        urls: dict[str, dict[str, str]] = {}
        for server_name, repo in repos.items():
            if repo is None:
                continue
            server = stack.enter_context(EmbeddedTriton(repo, **ports))
            by_protocol = {"http": server.http_url, "grpc": server.grpc_url}
            urls[server_name] = {p: by_protocol[p] for p in protocols}
        yield urls


def run_user_benchmark(
    models: Sequence[ServedModel],
    image: np.ndarray,
    *,
    protocols: Sequence[str] = ("grpc", "http"),
    concurrency: Sequence[int] = (1, 4),
    n_encode: int = 3,
    n_decode: int = 30,
    official: bool = True,
) -> UserReport:
    """:func:`bench_model` for each model, its servers started for it and stopped after."""
    report = UserReport()
    report.settings = {"protocols": list(protocols), "concurrency": list(concurrency),
                       "n_encode": n_encode, "n_decode": n_decode,
                       "image_hw": list(image.shape[:2]), "cpu_count": os.cpu_count(),
                       "load_average_before": list(os.getloadavg())}  # fmt: skip
    for model in models:
        with served(model, protocols) as urls:
            report.series[model.spec.name] = bench_model(
                model,
                urls,
                image,
                concurrency=concurrency,
                n_encode=n_encode,
                n_decode=n_decode,
                official=official,
            )
    report.settings["load_average_after"] = list(os.getloadavg())
    return report


# -- report -------------------------------------------------------------------------------


def write_report(report: UserReport, out_dir: Path) -> dict[str, Path]:
    """Write ``users.json``, ``users.md`` (one table) and ``users.png`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = report.table()
    files = {"json": out_dir / "users.json", "md": out_dir / "users.md"}
    series = {m: [asdict(s) for s in ss] for m, ss in report.series.items()}
    payload = {"settings": report.settings, "rows": rows, "series": series}
    files["json"].write_text(json.dumps(payload, indent=2))
    files["md"].write_text(summary_markdown(report) + "\n" + markdown(report, rows))
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


def summary_markdown(report: UserReport) -> str:
    """The run in one table: a row per (model, path); p50 ms at c=1 with its same-run ratio
    (encode against the official predictor, prompts against onnxruntime), and click
    throughput at the highest concurrency against onnxruntime's."""
    levels = [int(c) for c in report.settings.get("concurrency", [1])]  # type: ignore[union-attr]
    top = max(levels)
    lines = [
        f"| model | path | encode p50 (x official) | click p50 (x ORT) | box p50 (x ORT) "
        f"| refine p50 (x ORT) | clicks/s at c={top} (x ORT) | bytes per click |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, series in report.series.items():
        for path in dict.fromkeys(s.path for s in series):
            cells = []
            for op, base in (("encode", OFFICIAL), ("click", ORT), ("box", ORT), ("refine", ORT)):
                cells.append(_cell(report, model, op, path, 1, base, "p50"))
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
    fig, axes = plt.subplots(len(models), 1, figsize=(12, 3.6 * len(models)), squeeze=False)
    for ax, model in zip(axes[:, 0], models, strict=True):
        sel = [r for r in rows if r["model"] == model]
        names = list(dict.fromkeys(str(r["path"]) for r in sel))
        levels = sorted({int(r["concurrency"]) for r in sel})  # type: ignore[call-overload]
        width = 0.8 / (len(names) * len(levels))
        for k, (name, c) in enumerate(itertools.product(names, levels)):
            label: str | None = f"{name} c={c}"
            for j, op in enumerate(bench_paths.OPERATIONS):
                hit = [r for r in sel if (r["path"], r["concurrency"], r["op"]) == (name, c, op)]
                if hit:
                    colour, hatch = f"C{names.index(name)}", None if c == 1 else "//"
                    p50 = float(hit[0]["p50"])  # type: ignore[arg-type]
                    ax.bar(j + k * width, p50, width, color=colour, hatch=hatch, label=label)
                    label = None  # one legend entry per (path, concurrency)
        ax.set_xticks(np.arange(len(bench_paths.OPERATIONS)) + 0.4 - width / 2)
        ax.set_xticklabels(bench_paths.OPERATIONS)
        ax.set(title=model, ylabel="p50 ms (log)", yscale="log")
        ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
