"""Triton's own perf_analyzer against the served models, with shapes taken from the spec.

perf_analyzer is a C++ binary from the tritonclient wheel of the server's release; install it
with ``make perf-analyzer`` (``scripts/install_perf_analyzer.sh``).
"""

from __future__ import annotations

import csv
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from triton_sam.errors import InputValidationError, TritonSamError
from triton_sam.models.spec import FamilySpec

INSTALL_HINT = "install it with `make perf-analyzer` (scripts/install_perf_analyzer.sh)"


def find_perf_analyzer() -> Path:
    """``$TRITON_SAM_PERF_ANALYZER``, else ``<venv>/tools/perf_analyzer/``, else PATH.

    Raises:
        TritonSamError: not installed; the message says how to install it.
    """
    candidates = [
        os.environ.get("TRITON_SAM_PERF_ANALYZER"),
        str(Path(sys.prefix) / "tools" / "perf_analyzer" / "perf_analyzer"),
        shutil.which("perf_analyzer"),
    ]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    raise TritonSamError(f"perf_analyzer not found; {INSTALL_HINT}")


def perf_analyzer_env(binary: Path) -> dict[str, str]:
    """Environment with the CUDA runtime the binary links (installed beside it) on the path."""
    env = dict(os.environ)
    cudart = binary.parent / "cudart" / "nvidia" / "cuda_runtime" / "lib"
    if cudart.is_dir():
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(cudart), env.get("LD_LIBRARY_PATH", "")) if p
        )
    return env


def perf_analyzer_args(
    family: FamilySpec,
    graph: str,
    address: str,
    *,
    protocol: str = "grpc",
    concurrency: int = 1,
    num_points: int = 3,
    requests_per_level: int = 20,
    report_csv: Path | None = None,
) -> list[str]:
    """Arguments (after the binary) that load-test one graph of ``family`` at one concurrency.

    Variable dims come from the spec: the decoder's point dimension is ``num_points`` (a
    click, a box corner pair or a padding point each count one). Measurement windows count
    requests, not time, so a slow CPU still finishes.
    """
    if graph not in ("encoder", "decoder"):
        raise InputValidationError("graph", f"got {graph!r}, expected 'encoder' or 'decoder'")
    if protocol not in ("http", "grpc"):
        raise InputValidationError("protocol", f"got {protocol!r}, expected 'http' or 'grpc'")
    tensors = family.encoder_inputs if graph == "encoder" else family.decoder_inputs
    model = family.encoder_model if graph == "encoder" else family.decoder_model
    args = ["-m", model, "-u", address, "-i", protocol, "-b", "1"]
    for t in tensors:
        if -1 in t.shape:
            dims = [num_points if d == -1 else d for d in t.shape]
            args += ["--shape", f"{t.name}:{','.join(map(str, dims))}"]
    args += [
        "--concurrency-range",
        f"{concurrency}:{concurrency}",
        "--measurement-mode",
        "count_windows",
        "--measurement-request-count",
        str(requests_per_level),
        # three windows is the fewest perf_analyzer judges; CPU timings are noisy, so
        # stability is reported rather than waited for
        "--max-trials",
        "3",
        "--stability-percentage",
        "999",
    ]
    if report_csv is not None:
        args += ["-f", str(report_csv)]
    return args


def run_perf_analyzer(
    family: FamilySpec,
    graph: str,
    address: str,
    *,
    protocol: str = "grpc",
    concurrency: Sequence[int] = (1, 4, 16),
    timeout_s: float = 600.0,
    **kwargs: int,
) -> tuple[list[dict[str, float]], list[str]]:
    """Run perf_analyzer once per concurrency level; return its rows and the command lines.

    Each row has ``concurrency``, ``throughput`` (infer/s) and ``p50``/``p90``/``p95``/
    ``p99``/``avg`` latency in ms, as perf_analyzer measured them on the client.

    Raises:
        TritonSamError: not installed, or it failed (with its output's tail).
    """
    binary = find_perf_analyzer()
    env = perf_analyzer_env(binary)
    rows: list[dict[str, float]] = []
    commands: list[str] = []
    for level in concurrency:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.csv"
            cmd = [str(binary)] + perf_analyzer_args(
                family, graph, address, protocol=protocol, concurrency=level,
                report_csv=report, **kwargs,
            )  # fmt: skip
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env=env,
            )
            if proc.returncode != 0 or not report.is_file():
                tail = (proc.stdout + proc.stderr)[-2000:]
                raise TritonSamError(f"perf_analyzer failed (exit {proc.returncode}):\n{tail}")
            rows += parse_report(report.read_text())
            commands.append(shlex.join(cmd))
    return rows, commands


def parse_report(text: str) -> list[dict[str, float]]:
    """Rows of perf_analyzer's ``-f`` CSV as numbers (microseconds converted to ms)."""
    rows = []
    for raw in csv.DictReader(text.splitlines()):
        row = {
            "concurrency": float(raw["Concurrency"]),
            "throughput": float(raw["Inferences/Second"]),
            "server_queue": float(raw["Server Queue"]) / 1e3,
            "server_compute": float(raw["Server Compute Infer"]) / 1e3,
        }
        for key in ("p50", "p90", "p95", "p99"):
            row[key] = float(raw[f"{key} latency"]) / 1e3
        rows.append(row)
    return rows
