"""Where one session click's time goes: client stages, Triton's statistics, the model's stages.

One click through ``SAM2TritonClient``'s session path is split into stages, each timed per
click (p50 over ``n`` clicks), beside onnxruntime in this process running the same decoder
and the same postprocessing (the baseline; interleaved click by click, so both see the
same load):

- client (``time.perf_counter`` around each step, as :mod:`triton_sam.client.flow` runs
  them): ``prompts`` (pixel prompts -> decoder prompt tensors + the session request),
  ``request`` (tritonclient input objects), ``round_trip`` (send, Triton, answer),
  ``parse`` (output tensors to numpy), ``postprocess`` (low-res logits -> masks at the
  original size, as the client does);
- Triton's statistics extension (``/v2/models/<m>/stats`` read before and after each click,
  so each delta is that one click): ``queue``, ``compute_input``, ``compute_infer``,
  ``compute_output`` of the session model and of the decoder it calls by BLS;
- inside the session model (its counters ``triton_sam_session_stage_microseconds`` /
  ``_stage_count`` on ``/metrics``, one delta per click; stages in
  ``protocol.embedding_cache.STAGES``): event-loop hop, intake, building the BLS request,
  the BLS round trip, reading outputs, sending the answer.

Derived rows: ``wire + front end`` = round trip - the session model's queue - its in-model
total (HTTP/gRPC, Triton's request handling, the stub IPC of the request and response);
``bls overhead`` = the BLS round trip - the decoder's queue and compute (the decoder's inputs
crossing into the stub's shared memory and Triton, the IPC both ways).

The server is any running Triton with the family's session and decoder models (HTTP port for
the statistics, metrics port for the stages); ``triton-sam bench click`` starts the embedded
one.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from triton_sam.bench import paths as bench_paths
from triton_sam.bench.counters import session_decoder
from triton_sam.bench.latency import Series, measure
from triton_sam.client import embedding_path, flow, model_frame, prompts
from triton_sam.client.decode_request import Click
from triton_sam.client.prediction import make_prediction
from triton_sam.client.transport import Transport, build_infer_inputs, resolve_endpoint
from triton_sam.models.spec import FamilySpec
from triton_sam.serving.protocol import embedding_cache

CLIENT_STAGES = ("prompts", "request", "round_trip", "parse", "postprocess")
STAT_STAGES = ("queue", "compute_input", "compute_infer", "compute_output")
_SAMPLE = re.compile(r"^(?P<name>\w+)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass
class ClickBreakdown:
    """Per-click samples (ms) of every stage of one run; see the module docstring.

    Attributes:
        stages: stage name -> one sample per click. Names: ``click`` (client total),
            ``client.<stage>``, ``session.<stat>`` / ``decoder.<stat>`` (Triton statistics),
            ``model.<stage>`` (inside the session model), ``derived.<name>``, and the
            baseline ``ort.decode`` / ``ort.postprocess`` / ``ort.click``.
        throughput: ``"<path> c=<n>"`` -> clicks per second (optional concurrency runs).
        settings: what was run (model names, protocol, n, host).
    """

    stages: dict[str, list[float]] = field(default_factory=dict)
    throughput: dict[str, float] = field(default_factory=dict)
    settings: dict[str, object] = field(default_factory=dict)

    def add(self, stage: str, ms: float) -> None:
        self.stages.setdefault(stage, []).append(float(ms))

    def p50(self, stage: str) -> float:
        return float(np.percentile(self.stages[stage], 50))

    def table(self) -> list[dict[str, object]]:
        """One row per stage: p50 and p95 in ms, and the p50 as a share of the click's p50."""
        click = self.p50("click")
        return [
            {
                "stage": name,
                "p50_ms": self.p50(name),
                "p95_ms": float(np.percentile(values, 95)),
                "share": self.p50(name) / click if click > 0 else 0.0,
                "n": len(values),
            }
            for name, values in self.stages.items()
        ]

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "table": self.table()}


def markdown(report: ClickBreakdown) -> str:
    """The breakdown as a markdown table, with the session click against onnxruntime."""
    lines = ["| stage | p50 ms | p95 ms | share of the click p50 |", "|---|---|---|---|"]
    for row in report.table():
        lines.append(
            f"| {row['stage']} | {row['p50_ms']:.2f} | {row['p95_ms']:.2f} | "
            f"{100 * float(row['share']):.0f}% |"  # type: ignore[arg-type]
        )
    ratio = report.p50("click") / report.p50("ort.click")
    lines.append("")
    lines.append(f"session click p50 / in-process ORT decode + postprocess p50: {ratio:.2f}x")
    for key, value in report.throughput.items():
        lines.append(f"- {key}: {value:.1f} clicks/s")
    return "\n".join(lines)


class _Server:
    """Reads one server's per-model statistics and the session model's stage counters."""

    def __init__(self, http_url: str, metrics_url: str) -> None:
        self.http_url = http_url.rstrip("/")
        self.metrics_url = metrics_url.rstrip("/")

    def stats(self, model: str) -> dict[str, tuple[int, int]]:
        """stage -> (count, ns) cumulated, from ``/v2/models/<model>/stats``."""
        import json

        with urllib.request.urlopen(f"{self.http_url}/v2/models/{model}/stats", timeout=10) as r:
            stats = json.loads(r.read())["model_stats"][0].get("inference_stats", {})
        return {s: (int(stats[s]["count"]), int(stats[s]["ns"])) for s in STAT_STAGES}

    def stages(self, model: str) -> dict[str, tuple[float, float]]:
        """stage -> (count, microseconds) cumulated, from the session model's counters."""
        with urllib.request.urlopen(f"{self.metrics_url}/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, list[float]] = {}
        wanted = {embedding_cache.STAGE_COUNT: 0, embedding_cache.STAGE_MICROSECONDS: 1}
        for line in text.splitlines():
            match = _SAMPLE.match(line)
            if match is None or match["name"] not in wanted:
                continue
            labels = dict(_LABEL.findall(match["labels"]))
            if labels.get("model") != model or "stage" not in labels:
                continue
            out.setdefault(labels["stage"], [0.0, 0.0])[wanted[match["name"]]] = float(
                match["value"]
            )
        return {k: (v[0], v[1]) for k, v in out.items()}

    def stages_after(
        self, model: str, before: Mapping[str, tuple[float, float]], timeout_s: float = 2.0
    ) -> dict[str, tuple[float, float]]:
        """:meth:`stages` once the ``total`` counter moved past ``before``: the model adds a
        click's stages just after it sent the answer, so the client may read first."""
        deadline = time.monotonic() + timeout_s
        previous = before.get("total", (0.0, 0.0))[0]
        while True:
            now = self.stages(model)
            if now.get("total", (0.0, 0.0))[0] > previous or time.monotonic() > deadline:
                return now
            time.sleep(0.002)


def run_breakdown(
    family: FamilySpec,
    urls: Mapping[str, str],
    sessions: tuple[Any, Any],
    image: np.ndarray,
    *,
    protocol: str = "grpc",
    n: int = 50,
    warmup: int = 3,
    settle_s: float = 0.05,
) -> ClickBreakdown:
    """Time ``n`` session clicks stage by stage, each followed by the same click through
    onnxruntime in this process (decoder + the client's postprocessing), interleaved.

    Each side starts ``settle_s`` after the other ended: onnxruntime's intra-op workers
    spin after a run before they sleep, and on a small host the spinning pool of one side
    (the server's decoder or this process's session) otherwise slows the other's run
    (measured on 2 cores: in-process decode 32 -> 58 ms right after a 2-thread server click).

    Args:
        family: the served family (session/decoder model names, prompt layout).
        urls: the server's ``"grpc"`` and/or ``"http"`` URL (``protocol`` picks the one the
            clicks use), ``"stats"`` (its HTTP URL, for ``/v2/models/<m>/stats``) and
            ``"metrics"`` (its metrics URL).
        sessions: (encoder, decoder) onnxruntime sessions of the served ONNX files
            (:func:`triton_sam.bench.paths.ort_sessions`).
        image: HxWx3 uint8 RGB (embedded once on each side, untimed).
        n / warmup: timed clicks, after ``warmup`` untimed ones.
    """
    report = ClickBreakdown()
    report.settings = {"model": family.family, "protocol": protocol, "n": n,
                       "image_hw": list(image.shape[:2]), "settle_s": settle_s}  # fmt: skip
    server = _Server(urls["stats"], urls["metrics"])
    transport = Transport(resolve_endpoint(urls[protocol], protocol))
    module, client = transport._module, transport._client  # noqa: SLF001 (stage timing)
    http = protocol == "http"
    hw = (int(image.shape[0]), int(image.shape[1]))
    session_model, encoder_model = family.session_model, family.encoder_model
    decoder_model = session_decoder(server.http_url, session_model) or family.decoder_model
    try:
        picture = embedding_path.CachedImage.of(image, family, encoder_model, session_model)
        flow.run(flow.embed(picture, family, session_model), flow.sender(transport))
        encoder, decoder = sessions
        embedding_names = list(family.embedding_names)
        tensor = model_frame.preprocess(image, family.preprocessing)
        values = encoder.run(embedding_names, {family.encoder_inputs[0].name: tensor})
        features = dict(zip(embedding_names, values, strict=True))
        point = bench_paths.click_of(hw)

        def click_prompts() -> dict[str, np.ndarray]:
            # Built inside each timed window: both paths pay for it.
            return prompts.build_decoder_prompts(
                point_coords=point, point_labels=[1], box=None, mask_input=None,
                orig_hw=hw, family=family,
            )  # fmt: skip

        for i in range(warmup + n):
            timed = i >= warmup
            before = (server.stats(session_model), server.stats(decoder_model),
                      server.stages(session_model))  # fmt: skip
            time.sleep(settle_s)
            t0 = time.perf_counter()
            decoder_prompts = click_prompts()
            inputs, fallback = picture.click_inputs(decoder_prompts, None)
            outputs = embedding_path.click_outputs(prompts.output_names(False, family), family)
            click = Click(inputs, fallback, outputs, False)
            t1 = time.perf_counter()
            infer_inputs = build_infer_inputs(module, click.inputs, http=http)
            requested = [
                module.InferRequestedOutput(o, **({"binary_data": True} if http else {}))
                for o in click.outputs
            ]
            t2 = time.perf_counter()
            result = client.infer(session_model, infer_inputs, outputs=requested)
            t3 = time.perf_counter()
            out = {o: result.as_numpy(o) for o in click.outputs}
            t4 = time.perf_counter()
            low_res, scores = prompts.select_outputs(out, False, family)
            prediction = make_prediction(low_res, scores, hw, family.preprocessing)
            key = embedding_path.issued_key(out)
            if key is not None:
                picture.remember(key, prediction.low_res_logits)
            t5 = time.perf_counter()
            after = (server.stats(session_model), server.stats(decoder_model),
                     server.stages_after(session_model, before[2]))  # fmt: skip
            time.sleep(settle_s)
            o0 = time.perf_counter()
            ort_prompts = click_prompts()
            names = list(prompts.output_names(False, family))
            ort_out = decoder.run(names, {**features, **ort_prompts})
            o1 = time.perf_counter()
            ort_low, ort_scores = prompts.select_outputs(
                dict(zip(names, ort_out, strict=True)), False, family
            )
            make_prediction(ort_low, ort_scores, hw, family.preprocessing)
            o2 = time.perf_counter()
            if not timed:
                continue
            ms = 1e3
            report.add("click", (t5 - t0) * ms)
            for stage, (a, b) in zip(
                CLIENT_STAGES, ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5)), strict=True
            ):
                report.add(f"client.{stage}", (b - a) * ms)
            for prefix, k in (("session", 0), ("decoder", 1)):
                for stage in STAT_STAGES:
                    count = after[k][stage][0] - before[k][stage][0]
                    ns = after[k][stage][1] - before[k][stage][1]
                    report.add(f"{prefix}.{stage}", ns / max(count, 1) / 1e6)
            model_ms = {}
            for stage in embedding_cache.STAGES:  # in the order a click goes through them
                count, us = after[2].get(stage, (0.0, 0.0))
                c0, us0 = before[2].get(stage, (0.0, 0.0))
                if count > c0:
                    model_ms[stage] = (us - us0) / (count - c0) / 1e3
                    report.add(f"model.{stage}", model_ms[stage])
            total = model_ms.get("total")
            if total is not None:
                report.add(
                    "derived.wire+front_end",
                    (t3 - t2) * ms - report.stages["session.queue"][-1] - total,
                )
            if "bls" in model_ms:
                decoder_ms = sum(report.stages[f"decoder.{s}"][-1] for s in STAT_STAGES)
                report.add("derived.bls_overhead", model_ms["bls"] - decoder_ms)
            report.add("ort.decode", (o1 - o0) * ms)
            report.add("ort.postprocess", (o2 - o1) * ms)
            report.add("ort.click", (o2 - o0) * ms)
    finally:
        transport.close()
    return report


def click_throughput(
    family: FamilySpec,
    url: str,
    sessions: tuple[Any, Any],
    image: np.ndarray,
    *,
    protocol: str = "grpc",
    concurrency: int = 4,
    n: int = 40,
) -> dict[str, float]:
    """Clicks per second with ``concurrency`` callers: the session path (one client and one
    image per caller) and onnxruntime in process (one decoder session shared by the
    callers' threads, as a user's threads would share it)."""
    factories: dict[str, Callable[[], bench_paths.Path]] = {
        "session": lambda: bench_paths.ClientPath(url, protocol, family.family, session=True),
        "onnxruntime": lambda: bench_paths.OrtPath(sessions, family),
    }
    out = {}
    for name, factory in factories.items():
        callers = [factory() for _ in range(concurrency)]
        try:
            for k, caller in enumerate(callers):
                variant = image.copy()
                variant[0, 0] = (k, 7, 7)  # one image per caller
                caller.encode(variant)
            samples, wall = measure(
                _clicks(callers),
                max(n, concurrency),
                concurrency,
                f"{name} click c={concurrency}",
            )
            series = Series("click", name, concurrency, samples, wall)
            out[f"{name} c={concurrency}"] = series.summary()["throughput"]
        finally:
            for caller in callers:
                caller.close()
    return out


def _clicks(callers: list[bench_paths.Path]) -> Callable[[int], object]:
    return lambda i: callers[i].click()


def variant_repository(
    served: Path,
    out_dir: Path,
    family: FamilySpec,
    *,
    cpu_features: str,
    decoder_sizing: tuple[int, int] | None = None,
) -> Path:
    """A copy of the embedded repository ``served`` (files linked) whose session model keeps
    its features as ``cpu_features`` says, with ``model.py`` from this source tree, and,
    with ``decoder_sizing`` = (instances, intra-op threads), the decoder its clicks run on
    sized so (for measuring sizings; the served default is ``size_cpu_decoder``'s)."""
    from triton_sam.repository.backend_checks import ORT_INTRA_OP_PARAM
    from triton_sam.repository.config import config_to_text, parse_config
    from triton_sam.repository.session_config import session_variant
    from triton_sam.repository.writer import ModelFiles, list_models, read_model, write_models

    session = parse_config(read_model(served, family.session_model).config_text)
    clicks_decoder = session.parameters[embedding_cache.PARAM_DECODER_MODEL].string_value
    models = []
    for name in list_models(served):
        model = read_model(served, name)
        if name == family.session_model:
            model = session_variant(model, cpu_features=cpu_features)
            slots = embedding_cache.PARAM_DECODER_SLOTS
            if decoder_sizing is not None:
                config = parse_config(model.config_text)
                if slots in config.parameters:  # one per instance, plus one queued
                    config.parameters[slots].string_value = str(decoder_sizing[0] + 1)
                model = ModelFiles(name, config_to_text(config), model.files)
        elif name == clicks_decoder and decoder_sizing is not None:
            config = parse_config(model.config_text)
            for group in config.instance_group:
                group.count = decoder_sizing[0]
            config.parameters[ORT_INTRA_OP_PARAM].string_value = str(decoder_sizing[1])
            model = ModelFiles(name, config_to_text(config), model.files)
        models.append(model)
    write_models(out_dir, models, link=True)
    return out_dir
