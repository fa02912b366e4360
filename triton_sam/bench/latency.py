"""Encoder/decoder latency through Triton vs in-process onnxruntime, in the same run.

The baseline runs the very ONNX files of the repository in this process, so the ratio is
the cost of serving (serialisation, transport, the backend) and nothing else.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from triton_sam import transforms
from triton_sam.client import SAM2TritonClient
from triton_sam.client.prompts import build_decoder_prompts
from triton_sam.models.spec import FamilySpec


@dataclass
class Series:
    """Latency samples of one path (``encoder/onnxruntime``, ``decoder/grpc``...), in ms."""

    samples_ms: list[float]
    request_bytes: int = 0

    def summary(self) -> dict[str, float]:
        """p50/p95/p99/mean in ms (percentiles by linear interpolation)."""
        a = np.asarray(self.samples_ms)
        return {
            "p50": float(np.percentile(a, 50)),
            "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)),
            "mean": float(a.mean()),
            "n": float(a.size),
        }


@dataclass
class LatencyReport:
    """All series of a run, keyed ``<graph>/<path>``, plus the run's settings."""

    model: str
    series: dict[str, Series] = field(default_factory=dict)
    settings: dict[str, object] = field(default_factory=dict)

    def table(self) -> list[dict[str, object]]:
        """One row per series with percentiles and the ratio of p50 to the ORT baseline."""
        rows = []
        for key, s in self.series.items():
            graph = key.split("/")[0]
            base = self.series.get(f"{graph}/onnxruntime")
            row: dict[str, object] = {"series": key, **s.summary(), "bytes": s.request_bytes}
            if base is not None:
                row["x_ort_p50"] = s.summary()["p50"] / base.summary()["p50"]
            rows.append(row)
        return rows


def _time(fn: Callable[[], object], n: int, label: str) -> list[float]:
    fn()  # warm-up: first-call allocations and lazy initialisation are not latency
    out = []
    for _ in tqdm(range(n), desc=label, leave=False):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def run_latency_benchmark(
    repository: Path,
    urls: Mapping[str, str],
    family: FamilySpec,
    image: np.ndarray,
    *,
    n_encode: int = 5,
    n_decode: int = 50,
    model_name: str = "",
) -> LatencyReport:
    """Time encode and one-click decode via each protocol in ``urls`` and via ORT in-process.

    Args:
        repository: the served repository (its ONNX files are the baseline's).
        urls: protocol ("http"/"grpc") -> URL of the running server.
        family: the family spec (tensor names, preprocessing).
        image: HxWx3 uint8 RGB.
        n_encode / n_decode: timed repetitions after one warm-up call.
    """
    import onnxruntime as ort

    report = LatencyReport(model_name or family.family)
    report.settings = {"n_encode": n_encode, "n_decode": n_decode, "image_hw": image.shape[:2]}
    pre = family.preprocessing
    hw = (int(image.shape[0]), int(image.shape[1]))
    click = dict(point_coords=[[hw[1] / 2, hw[0] / 2]], point_labels=[1], box=None, mask_input=None)

    tensor = transforms.preprocess(image, pre)
    sessions = {
        graph: ort.InferenceSession(
            str(_onnx_file(repository, name)), providers=["CPUExecutionProvider"]
        )
        for graph, name in (("encoder", family.encoder_model), ("decoder", family.decoder_model))
    }
    enc_feed = {family.encoder_inputs[0].name: tensor}
    embeddings = dict(
        zip(family.embedding_names, sessions["encoder"].run(None, enc_feed), strict=True)
    )
    dec_feed = {**embeddings, **build_decoder_prompts(orig_hw=hw, family=family, **click)}
    outputs = ["masks", "iou_predictions"]
    report.series["encoder/onnxruntime"] = Series(
        _time(lambda: sessions["encoder"].run(None, enc_feed), n_encode, "encoder ort"),
        tensor.nbytes,
    )
    report.series["decoder/onnxruntime"] = Series(
        _time(lambda: sessions["decoder"].run(outputs, dec_feed), n_decode, "decoder ort"),
        sum(a.nbytes for a in dec_feed.values()),
    )
    sessions.clear()  # free their threads and memory before the server is measured

    for protocol, url in urls.items():
        with SAM2TritonClient(url, model_type=family.family, protocol=protocol) as client:
            enc: list[float] = []

            def encode(client: SAM2TritonClient = client, enc: list[float] = enc) -> None:
                client.set_image(image)
                enc.append(client.last_timings_ms["encode"])

            _time(encode, n_encode, f"encoder {protocol}")
            report.series[f"encoder/{protocol}"] = Series(enc[1:], client.last_request_bytes)
            dec: list[float] = []

            def decode(client: SAM2TritonClient = client, dec: list[float] = dec) -> None:
                client.predict(point_coords=click["point_coords"], point_labels=[1])
                dec.append(client.last_timings_ms["decode"])

            _time(decode, n_decode, f"decoder {protocol}")
            report.series[f"decoder/{protocol}"] = Series(dec[1:], client.last_request_bytes)
    return report


def _onnx_file(repository: Path, model: str) -> Path:
    path = repository / model / "1" / "model.onnx"
    return path.resolve()  # embedded twins symlink to the onnxruntime repository's files


def write_report(report: LatencyReport, out_dir: Path) -> dict[str, Path]:
    """Write ``latency.json``, ``latency.md`` and ``latency.png`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = report.table()
    paths = {"json": out_dir / "latency.json", "md": out_dir / "latency.md"}
    payload = {"model": report.model, "settings": report.settings, "rows": rows}
    payload["series"] = {k: asdict(v) for k, v in report.series.items()}
    paths["json"].write_text(json.dumps(payload, indent=2, default=str))
    lines = [
        f"# Latency: {report.model}",
        "",
        "| series | p50 ms | p95 ms | p99 ms | x ORT (p50) | bytes sent |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r['x_ort_p50']:.2f}" if "x_ort_p50" in r else "-"
        lines.append(
            f"| {r['series']} | {r['p50']:.1f} | {r['p95']:.1f} | {r['p99']:.1f} | {ratio} "
            f"| {int(r['bytes']):,} |"  # type: ignore[call-overload]
        )
    paths["md"].write_text("\n".join(lines) + "\n")
    paths["png"] = _plot(rows, out_dir / "latency.png", report.model)
    return paths


def _plot(rows: list[dict[str, object]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, graph in zip(axes, ("encoder", "decoder"), strict=True):
        sel = [r for r in rows if str(r["series"]).startswith(graph)]
        names = [str(r["series"]).split("/")[1] for r in sel]
        x = np.arange(len(sel))
        ax.bar(x - 0.2, [r["p50"] for r in sel], 0.4, label="p50")
        ax.bar(x + 0.2, [r["p95"] for r in sel], 0.4, label="p95")
        ax.set_xticks(x, names)
        ax.set_title(f"{graph} latency (ms)")
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
