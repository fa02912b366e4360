"""The user benchmark's report: same-run ratios and goals from the timed series, and the
files written from them (``users.json``, ``users.md``, ``users.png``). The run:
:mod:`triton_sam.bench.users`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from triton_sam.bench import paths as bench_paths
from triton_sam.bench.latency import Series
from triton_sam.bench.users_models import BASE_VARIANT

# Path and operation names of the rows that others are compared with.
OFFICIAL = "official"
ORT = "onnxruntime"
DURING_ENCODE = "click-during-encode"


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
