"""Triton's onnxruntime backend vs the python-backend runner, on the same models, in one run.

One production repository, two embedded servers at once: its CPU twins on Triton's
onnxruntime backend (what ``triton-sam serve`` runs) and its python-runner twins (the
fallback, ``--target python``); the same ONNX files under both. Two requests are timed, as a
client sends them:

- ``encode``: one ``<family>_encoder`` request with the preprocessed image (batch 1);
- ``click``: one ``<family>_session`` request carrying an image id already embedded there and
  one click, the request an interactive user makes most (BLS to the decoder inside).

Requests alternate between the two servers one by one (ABAB, the order swapped every round),
so load from others on a shared machine falls on both alike; only the calls are timed, and
each server gets untimed warm-up calls first. Ratio = runner p50 / backend p50.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from triton_sam.bench.latency import click_prompt
from triton_sam.client import model_frame
from triton_sam.client.embedding_path import bytes_tensor, embed_inputs
from triton_sam.client.embedding_path import image_id as session_image_id
from triton_sam.client.transport import Transport, resolve_endpoint
from triton_sam.errors import ServerError
from triton_sam.models.spec import FamilySpec

BACKENDS = ("onnxruntime", "python")
REQUESTS = ("encode", "click")


@dataclass
class BackendComparison:
    """Latency samples (ms) per request kind and serving path, plus the run's settings."""

    model: str
    samples_ms: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    settings: dict[str, object] = field(default_factory=dict)

    def table(self) -> list[dict[str, object]]:
        """One row per request kind: p50/p95 of each path and the runner/backend ratios."""
        rows = []
        for request in REQUESTS:
            row: dict[str, object] = {"request": request}
            for backend in BACKENDS:
                a = np.asarray(self.samples_ms[request][backend])
                row[f"{backend}_p50"] = float(np.percentile(a, 50))
                row[f"{backend}_p95"] = float(np.percentile(a, 95))
                row[f"{backend}_n"] = int(a.size)
            row["ratio_p50"] = row["python_p50"] / row["onnxruntime_p50"]  # type: ignore[operator]
            row["ratio_p95"] = row["python_p95"] / row["onnxruntime_p95"]  # type: ignore[operator]
            rows.append(row)
        return rows


def compare_backends(
    urls: Mapping[str, str],
    family: FamilySpec,
    image: np.ndarray,
    *,
    protocol: str = "grpc",
    n_encode: int = 10,
    n_click: int = 50,
    warmup: int = 2,
    model_name: str = "",
) -> BackendComparison:
    """Time encode and session clicks on both servers, interleaved.

    Args:
        urls: ``{"onnxruntime": url, "python": url}``: the two servers of the same repository.
        family: the family spec (tensor names, preprocessing, prompt layout).
        image: HxWx3 uint8 RGB.
        protocol: ``"grpc"`` or ``"http"`` (the URLs' protocol).
        n_encode / n_click: timed requests per server.
        warmup: untimed requests of each kind per server first.
    """
    hw = (int(image.shape[0]), int(image.shape[1]))
    tensor = model_frame.preprocess(image, family.preprocessing)
    encode_feeds = {family.encoder_inputs[0].name: tensor}
    # the id the session model computes (and answers) for these pixels
    image_id = session_image_id(image, family, family.encoder_model, family.session_model)
    prompts = click_prompt(family, hw, (hw[1] / 3, hw[0] / 2))
    # A click sends the prompt tensors only; the session model fills in the empty mask input.
    click_feeds = {"image_id": bytes_tensor(image_id), **_without_mask(prompts, family)}
    report = BackendComparison(model_name or family.family)
    report.settings = {"protocol": protocol, "n_encode": n_encode, "n_click": n_click,
                       "warmup": warmup, "image_hw": list(hw)}  # fmt: skip
    transports = {b: Transport(resolve_endpoint(urls[b], protocol)) for b in BACKENDS}
    try:
        embeddings, click_outputs = list(family.embedding_names), ["masks", "iou_predictions"]
        calls: dict[str, dict[str, Callable[[], object]]] = {
            "encode": {
                b: (lambda t=t: t.infer(family.encoder_model, encode_feeds, embeddings))
                for b, t in transports.items()
            },
            "click": {
                b: (lambda t=t: t.infer(family.session_model, click_feeds, click_outputs))
                for b, t in transports.items()
            },
        }
        for t in transports.values():  # the click's image, embedded once on each server
            out = t.infer(family.session_model, embed_inputs(image), ["encoded", "image_id"])
            answered = bytes(out["image_id"].reshape(-1)[0]).decode()
            if answered != image_id:  # client and server hash differently: a version skew
                raise ServerError(f"image_id: the server answered {answered!r}, not {image_id!r}")
        for request, n in (("encode", n_encode), ("click", n_click)):
            report.samples_ms[request] = _interleaved(calls[request], n, warmup)
    finally:
        for t in transports.values():
            t.close()
    return report


def _without_mask(prompts: dict[str, np.ndarray], family: FamilySpec) -> dict[str, np.ndarray]:
    embeddings = set(family.embedding_names)
    skip = {"mask_input", "has_mask_input"}
    return {k: v for k, v in prompts.items() if k not in skip and k not in embeddings}


def _interleaved(
    calls: Mapping[str, Callable[[], object]], n: int, warmup: int
) -> dict[str, list[float]]:
    """``n`` timed calls per backend, alternating, the order swapped every round."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    samples: dict[str, list[float]] = {b: [] for b in calls}
    order = list(calls)
    for i in range(n):
        for backend in order if i % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            calls[backend]()
            samples[backend].append((time.perf_counter() - t0) * 1e3)
    return samples


def write_report(report: BackendComparison, out_dir: Path) -> dict[str, Path]:
    """Write ``backends.json`` and ``backends.md`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = report.table()
    paths = {"json": out_dir / "backends.json", "md": out_dir / "backends.md"}
    payload = {"model": report.model, "settings": report.settings, "rows": rows,
               "samples_ms": report.samples_ms}  # fmt: skip
    paths["json"].write_text(json.dumps(payload, indent=2))
    settings = report.settings
    lines = [
        f"# onnxruntime backend vs python runner: {report.model}",
        "",
        f"{settings.get('protocol')}, concurrency 1, requests alternating between the two "
        "servers; latency in ms.",
        "",
        "| request | backend p50 | backend p95 | runner p50 | runner p95 | runner/backend p50 "
        "| runner/backend p95 | n per path |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['request']} | {r['onnxruntime_p50']:.1f} | {r['onnxruntime_p95']:.1f} | "
            f"{r['python_p50']:.1f} | {r['python_p95']:.1f} | {r['ratio_p50']:.2f} | "
            f"{r['ratio_p95']:.2f} | {r['onnxruntime_n']} |"
        )
    paths["md"].write_text("\n".join(lines) + "\n")
    return paths
