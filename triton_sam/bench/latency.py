"""Per-graph latency and throughput through Triton vs in-process onnxruntime.

Every path runs at each concurrency level in the same run: ``onnxruntime`` (the repository's
own ONNX files, in this process: the baseline), and the served models over ``http`` and
``grpc``. The ratio to the baseline is the cost of serving (serialisation, transport, the
backend) and nothing else. Requests are built once; only the calls are timed. The graphs
timed are the family's (``FamilySpec.graphs``: an encoder, fed one image, and a decoder,
fed one click on its embeddings).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from triton_sam.client import model_frame
from triton_sam.client.prompts import build_decoder_prompts
from triton_sam.client.transport import Transport, resolve_endpoint
from triton_sam.errors import InputValidationError
from triton_sam.models.spec import FamilySpec


@dataclass
class Series:
    """Samples of one (graph, path, concurrency): per-request latency in ms, and wall time."""

    graph: str
    path: str
    concurrency: int
    samples_ms: list[float]
    wall_s: float
    request_bytes: int = 0

    @property
    def key(self) -> str:
        return f"{self.graph}/{self.path}/c{self.concurrency}"

    def summary(self) -> dict[str, float]:
        """p50/p95/p99/mean in ms (linear interpolation) and throughput in requests/s."""
        a = np.asarray(self.samples_ms)
        return {
            "p50": float(np.percentile(a, 50)),
            "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)),
            "mean": float(a.mean()),
            "throughput": a.size / self.wall_s if self.wall_s > 0 else 0.0,
            "n": float(a.size),
        }


@dataclass
class LatencyReport:
    """All series of a run plus its settings."""

    model: str
    series: list[Series] = field(default_factory=list)
    settings: dict[str, object] = field(default_factory=dict)

    def get(self, graph: str, path: str, concurrency: int) -> Series | None:
        """The series for one graph/path/concurrency, if measured."""
        for s in self.series:
            if (s.graph, s.path, s.concurrency) == (graph, path, concurrency):
                return s
        return None

    def table(self) -> list[dict[str, object]]:
        """One row per series; ``x_ort_p50`` = its p50 over the ORT baseline's p50."""
        rows = []
        for s in self.series:
            row: dict[str, object] = {
                "series": s.key,
                "graph": s.graph,
                "path": s.path,
                "concurrency": s.concurrency,
                **s.summary(),
                "bytes": s.request_bytes,
            }
            base = self.get(s.graph, "onnxruntime", s.concurrency)
            if base is not None:
                row["x_ort_p50"] = s.summary()["p50"] / base.summary()["p50"]
            rows.append(row)
        return rows


def measure(
    call: Callable[[int], object], n: int, concurrency: int, label: str
) -> tuple[list[float], float]:
    """Run ``call(worker)`` ``n`` times from ``concurrency`` threads; latencies (ms) and wall (s).

    Worker 0 makes one untimed warm-up call first: first-call allocations and lazy
    initialisation are not latency.
    """
    samples: list[float] = []
    lock = threading.Lock()
    counter = iter(range(n))
    bar = tqdm(total=n, desc=label, leave=False)

    def worker(index: int) -> None:
        if index == 0:
            call(index)
        while True:
            with lock:
                if next(counter, None) is None:
                    return
            t0 = time.perf_counter()
            call(index)
            ms = (time.perf_counter() - t0) * 1e3
            with lock:
                samples.append(ms)
                bar.update()

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    wall = time.perf_counter() - start
    bar.close()
    return samples, wall


def run_latency_benchmark(
    repository: Path,
    urls: Mapping[str, str],
    family: FamilySpec,
    image: np.ndarray,
    *,
    concurrency: Sequence[int] = (1, 4, 16),
    n_encode: int = 5,
    n_decode: int = 50,
    model_name: str = "",
) -> LatencyReport:
    """Time encode and one-click decode on every path at every concurrency level.

    Args:
        repository: the served repository (its ONNX files are the baseline's).
        urls: protocol ("http"/"grpc") -> URL of the running server.
        family: the family spec (tensor names, preprocessing, prompt layout).
        image: HxWx3 uint8 RGB.
        concurrency: concurrent callers per level.
        n_encode / n_decode: timed requests per level (at least one per caller).
    """
    import onnxruntime as ort

    models = {g.role: g.model for g in family.graphs}
    if set(models) != {"encoder", "decoder"}:
        raise InputValidationError(
            "family", f"{family.family}: graphs {list(models)}; timed are encoder + decoder"
        )
    report = LatencyReport(model_name or family.family)
    report.settings = {
        "n_encode": n_encode,
        "n_decode": n_decode,
        "concurrency": list(concurrency),
        "image_hw": list(image.shape[:2]),
    }
    hw = (int(image.shape[0]), int(image.shape[1]))
    tensor = model_frame.preprocess(image, family.preprocessing)
    sessions = {
        g: ort.InferenceSession(str(_onnx_file(repository, m)), providers=["CPUExecutionProvider"])
        for g, m in models.items()
    }
    feeds = {"encoder": {family.encoder_inputs[0].name: tensor}}
    embeddings = sessions["encoder"].run(list(family.embedding_names), feeds["encoder"])
    feeds["decoder"] = {
        **dict(zip(family.embedding_names, embeddings, strict=True)),
        **click_prompt(family, hw, (hw[1] / 2, hw[0] / 2)),
    }
    outputs = {"encoder": list(family.embedding_names), "decoder": ["masks", "iou_predictions"]}
    counts = {"encoder": n_encode, "decoder": n_decode}

    for graph in models:
        nbytes = sum(a.nbytes for a in feeds[graph].values())
        for c in concurrency:
            n = max(counts[graph], c)
            session = sessions[graph]
            samples, wall = measure(
                lambda _, s=session, g=graph: s.run(outputs[g], feeds[g]),
                n,
                c,
                f"{graph} onnxruntime c={c}",
            )
            report.series.append(Series(graph, "onnxruntime", c, samples, wall, nbytes))
    sessions.clear()  # free their threads and memory before the server is measured

    for protocol, url in urls.items():
        endpoint = resolve_endpoint(url, protocol)
        for graph in models:
            nbytes = sum(a.nbytes for a in feeds[graph].values())
            for c in concurrency:
                # One connection per caller: a tritonclient connection serialises its calls.
                transports = [Transport(endpoint) for _ in range(c)]
                try:
                    samples, wall = measure(
                        lambda i, g=graph, t=transports: t[i].infer(
                            models[g], feeds[g], outputs[g]
                        ),
                        max(counts[graph], c),
                        c,
                        f"{graph} {protocol} c={c}",
                    )
                finally:
                    for t in transports:
                        t.close()
                report.series.append(Series(graph, protocol, c, samples, wall, nbytes))
    return report


def click_prompt(
    family: FamilySpec, hw: tuple[int, int], xy: tuple[float, float]
) -> dict[str, np.ndarray]:
    """The decoder's prompt tensors for one foreground click at ``xy`` = (X, Y) in the pixels
    of an ``hw`` = (H, W) image, laid out as ``family``'s clients send it (no mask input)."""
    return build_decoder_prompts(
        point_coords=[list(xy)], point_labels=[1], box=None, mask_input=None, orig_hw=hw,
        family=family,
    )  # fmt: skip


def _onnx_file(repository: Path, model: str) -> Path:
    # embedded twins symlink to the onnxruntime repository's files
    return (repository / model / "1" / "model.onnx").resolve()


def write_report(report: LatencyReport, out_dir: Path) -> dict[str, Path]:
    """Write ``latency.json``, ``latency.md`` and ``latency.png`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = report.table()
    paths = {"json": out_dir / "latency.json", "md": out_dir / "latency.md"}
    payload = {
        "model": report.model,
        "settings": report.settings,
        "rows": rows,
        "series": [asdict(s) for s in report.series],
    }
    paths["json"].write_text(json.dumps(payload, indent=2))
    lines = [
        f"# Latency: {report.model}",
        "",
        "| graph | path | conc. | p50 ms | p95 ms | p99 ms | req/s | x ORT (p50) | bytes/request |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r['x_ort_p50']:.2f}" if "x_ort_p50" in r else "-"
        lines.append(
            f"| {r['graph']} | {r['path']} | {r['concurrency']} | {r['p50']:.1f} | "
            f"{r['p95']:.1f} | {r['p99']:.1f} | {r['throughput']:.2f} | {ratio} | "
            f"{r['bytes']:,} |"
        )
    paths["md"].write_text("\n".join(lines) + "\n")
    paths["png"] = _plot(rows, out_dir / "latency.png", report.model)
    return paths


def _plot(rows: list[dict[str, object]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graphs = list(dict.fromkeys(str(r["graph"]) for r in rows))  # the family's, in order
    fig, axes = plt.subplots(2, len(graphs), figsize=(5.5 * len(graphs), 7), squeeze=False)
    for col, graph in enumerate(graphs):
        for name in sorted({str(r["path"]) for r in rows}):
            sel = sorted(
                (r for r in rows if r["graph"] == graph and r["path"] == name),
                key=lambda r: r["concurrency"],  # type: ignore[arg-type,return-value]
            )
            conc = [r["concurrency"] for r in sel]
            axes[0, col].plot(conc, [r["p50"] for r in sel], marker="o", label=f"{name} p50")
            axes[0, col].plot(conc, [r["p95"] for r in sel], ls="--", label=f"{name} p95")
            axes[1, col].plot(conc, [r["throughput"] for r in sel], marker="o", label=name)
        axes[0, col].set(title=f"{graph} latency", xlabel="concurrency", ylabel="ms")
        axes[1, col].set(title=f"{graph} throughput", xlabel="concurrency", ylabel="req/s")
        for ax in axes[:, col]:
            ax.set_xscale("log", base=2)
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
