"""Concept segmentation throughput: Triton (``sam3_concept``) vs ``Sam3Model`` in-process.

Both paths run on the same images and phrases in the same run, sequentially (one request at
a time), so the ratio is the cost (or gain) of serving:

- ``triton-<protocol>``: ``SAM2TritonClient(model_type="sam3_concept")``: ``set_image`` on a
  new image (pixels up, vision graph, features cached), then ``predict_concepts`` with the
  phrases (text features cached after their first use, decoder, RLE masks at the original
  size, decoded on the client);
- ``transformers``: what a user would write instead: ``Sam3Processor`` + ``Sam3Model.
  get_vision_features`` once per image, then per call ``Sam3Model`` on the phrases with
  ``vision_embeds`` and ``post_process_instance_segmentation`` (masks at the original size).

Exemplar queries (one phrase and two example boxes, one positive and one negative) are timed
the same way: on the image they were drawn on (Triton encodes the boxes and keeps them under a
new ``exemplar_id``; transformers runs ``Sam3Model`` with ``input_boxes``), and, Triton only,
the kept id applied to a new image (nothing re-sent, no boxes re-encoded; upstream has no
cross-image exemplars to time it against).

Figures: images/s (set_image / vision), phrases/s, queries/s and instances/s (predict), p50 and
p95 per call, and the bytes a request sends and the payload it gets back.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from triton_sam.client.concepts import ConceptPrediction


@dataclass
class ConceptBenchReport:
    """Rows of one run: one per (path, stage); settings say what was run."""

    rows: list[dict[str, object]] = field(default_factory=list)
    settings: dict[str, object] = field(default_factory=dict)

    def add(self, path: str, stage: str, seconds: list[float], **extra: object) -> None:
        """Record the latencies of one stage (one sample per call)."""
        a = np.asarray(seconds, dtype=np.float64)
        row: dict[str, object] = {"path": path, "stage": stage, "calls": int(a.size)}
        row |= {"p50_ms": float(np.median(a) * 1e3), "p95_ms": float(np.percentile(a, 95) * 1e3)}
        row |= {"mean_ms": float(a.mean() * 1e3)}
        self.rows.append(row | extra)

    def markdown(self) -> str:
        """The rows as a markdown table."""
        columns = ["path", "stage", "calls", "p50_ms", "p95_ms", "mean_ms", "per_s", "unit"]
        columns.append("sent_bytes")
        columns += ["received_bytes", "server_exemplar_runs"]
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for row in self.rows:
            cells = []
            for c in columns:
                value = row.get(c, "")
                cells.append(f"{value:.1f}" if isinstance(value, float) else str(value))
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)


@dataclass(frozen=True)
class Workload:
    """What every path of the benchmark is timed on.

    Attributes:
        images: RGB uint8 images; the first warms the path up, the others are timed.
        phrases: the noun phrases asked for each image.
        threshold: the score threshold (Sam3Processor's).
        repeats: timed predict calls per stage.
    """

    images: Sequence[np.ndarray]
    phrases: Sequence[str]
    threshold: float
    repeats: int


def bench_triton(
    url: str,
    protocol: str,
    work: Workload,
    report: ConceptBenchReport,
    stats_url: str | None = None,
) -> None:
    """Time set_image (new images) and predict_concepts (cached image, ``repeats`` calls);
    with ``stats_url`` (Triton's HTTP endpoint) the exemplar rows also say how many times
    the server ran its exemplar graph for them, read from its statistics."""
    from triton_sam.client import SAM2TritonClient

    images, phrases, threshold, repeats = work.images, work.phrases, work.threshold, work.repeats

    path = f"triton-{protocol}"
    with SAM2TritonClient(url, model_type="sam3_concept", protocol=protocol) as client:
        client.set_image(images[0])  # warm-up: the first call loads lazily-initialised parts
        client.predict_concepts(list(phrases), threshold=threshold)
        set_s, sent = [], 0
        for image in images[1:]:
            t0 = time.perf_counter()
            client.set_image(image)
            set_s.append(time.perf_counter() - t0)
            sent = max(sent, client.last_request_bytes)
        report.add(path, "set_image", set_s, per_s=len(set_s) / sum(set_s), unit="images",
                   sent_bytes=sent)  # fmt: skip
        one, many, instances, received, bytes_one, bytes_many = [], [], 0, 0, 0, 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            client.predict_concepts(phrases[0], threshold=threshold)
            one.append(time.perf_counter() - t0)
            bytes_one = client.last_request_bytes
            t0 = time.perf_counter()
            prediction = client.predict_concepts(list(phrases), threshold=threshold)
            many.append(time.perf_counter() - t0)
            bytes_many = client.last_request_bytes
            instances += len(prediction)
            received = response_payload(prediction)
        _add_predictions(report, path, one, many, len(phrases), instances, bytes_one, bytes_many,
                         received)  # fmt: skip
        # The same calls without masks: what serving costs when no mask is encoded (random
        # weights give noise-like masks, the worst case for RLE, on the wire and to encode).
        boxes = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            client.predict_concepts(list(phrases), threshold=threshold, mask_format="none")
            boxes.append(time.perf_counter() - t0)
        per_s = len(phrases) * len(boxes) / sum(boxes)
        report.add(path, f"predict {len(phrases)} phrases, boxes only", boxes, per_s=per_s,
                   unit="phrases")  # fmt: skip
        _bench_triton_exemplars(client, path, work, report, stats_url)


def exemplar_boxes(hw: tuple[int, int]) -> tuple[list[list[float]], list[int]]:
    """Two example boxes (x0, y0, x1, y1 pixels) inside an (H, W) image: a positive one and a
    negative one, as a user draws "more like this" and "not this"."""
    h, w = hw
    return [[0.1 * w, 0.1 * h, 0.35 * w, 0.4 * h], [0.55 * w, 0.5 * h, 0.9 * w, 0.85 * h]], [1, 0]


def _bench_triton_exemplars(
    client, path: str, work: Workload, report: ConceptBenchReport, stats_url: str | None
) -> None:
    """Exemplar queries on the image they were drawn on, then their id on new images."""
    from triton_sam.bench.counters import read_counters

    def exemplar_runs() -> int:  # what the server says its exemplar graph ran (0: not asked)
        if stats_url is None:
            return 0
        return read_counters(stats_url, None, "sam3_concept_exemplar").executed

    phrase, threshold = work.phrases[0], work.threshold
    boxes, labels = exemplar_boxes(work.images[-1].shape[:2])
    drawn, kept_id, sent, before = [], None, 0, exemplar_runs()
    for _ in range(work.repeats):
        t0 = time.perf_counter()
        found = client.predict_concepts(phrase, boxes=boxes, box_labels=labels, threshold=threshold)
        drawn.append(time.perf_counter() - t0)
        kept_id, sent = found.exemplar_id, client.last_request_bytes
    after = exemplar_runs()
    runs = after - before if stats_url else ""
    report.add(path, "exemplars: phrase + 2 boxes", drawn, per_s=len(drawn) / sum(drawn),
               unit="queries", sent_bytes=sent, server_exemplar_runs=runs)  # fmt: skip
    applied = []
    for image in work.images[1:]:  # each a new image: the id is all that travels
        client.set_image(image)
        t0 = time.perf_counter()
        client.predict_concepts(phrase, exemplar_ids=[kept_id], threshold=threshold)
        applied.append(time.perf_counter() - t0)
        sent = client.last_request_bytes
    runs = exemplar_runs() - after if stats_url else ""
    report.add(path, "exemplar id on a new image", applied, per_s=len(applied) / sum(applied),
               unit="queries", sent_bytes=sent, server_exemplar_runs=runs)  # fmt: skip


def bench_transformers(checkpoint: Path, work: Workload, report: ConceptBenchReport) -> None:
    """The same stages with ``Sam3Model`` + ``Sam3Processor`` in this process."""
    import torch
    from transformers import Sam3Model, Sam3Processor

    images, phrases, threshold, repeats = work.images, work.phrases, work.threshold, work.repeats

    model = Sam3Model.from_pretrained(checkpoint).eval()
    processor = Sam3Processor.from_pretrained(checkpoint)

    def vision(image: np.ndarray):
        with torch.no_grad():
            pixels = processor(images=image, return_tensors="pt")["pixel_values"]
            return model.get_vision_features(pixel_values=pixels)

    def predict(features, texts: list[str], hw: tuple[int, int]) -> list[dict]:
        from transformers.models.sam3.modeling_sam3 import Sam3VisionEncoderOutput

        n = len(texts)
        tiled = Sam3VisionEncoderOutput(
            fpn_hidden_states=tuple(f.repeat(n, 1, 1, 1) for f in features.fpn_hidden_states),
            fpn_position_encoding=tuple(
                p.repeat(n, 1, 1, 1) for p in features.fpn_position_encoding
            ),
        )
        with torch.no_grad():
            outputs = model(vision_embeds=tiled, **processor(text=texts, return_tensors="pt"))
        return processor.post_process_instance_segmentation(
            outputs, threshold=threshold, mask_threshold=0.5, target_sizes=[hw] * n
        )

    features = vision(images[0])  # warm-up
    predict(features, list(phrases), images[0].shape[:2])
    set_s = []
    for image in images[1:]:
        t0 = time.perf_counter()
        features = vision(image)
        set_s.append(time.perf_counter() - t0)
    report.add("transformers", "set_image", set_s, per_s=len(set_s) / sum(set_s), unit="images")
    hw = images[-1].shape[:2]
    one, many, instances = [], [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        predict(features, [phrases[0]], hw)
        one.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        results = predict(features, list(phrases), hw)
        many.append(time.perf_counter() - t0)
        instances += sum(len(r["scores"]) for r in results)
    _add_predictions(report, "transformers", one, many, len(phrases), instances, 0, 0, 0)

    boxes, labels = exemplar_boxes(hw)
    prompts = processor(text=[phrases[0]], input_boxes=[boxes], input_boxes_labels=[labels],
                        original_sizes=[list(hw)], return_tensors="pt")  # fmt: skip
    keys = ("input_ids", "attention_mask", "input_boxes", "input_boxes_labels")
    drawn = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        with torch.no_grad():
            outputs = model(vision_embeds=features, **{k: prompts[k] for k in keys})
        processor.post_process_instance_segmentation(
            outputs, threshold=threshold, mask_threshold=0.5, target_sizes=[hw]
        )
        drawn.append(time.perf_counter() - t0)
    report.add("transformers", "exemplars: phrase + 2 boxes", drawn,
               per_s=len(drawn) / sum(drawn), unit="queries")  # fmt: skip


def _add_predictions(
    report: ConceptBenchReport,
    path: str,
    one: list[float],
    many: list[float],
    n: int,
    instances: int,
    sent_one: int,
    sent_many: int,
    received: int,
) -> None:
    sent = {"sent_bytes": sent_one or ""}
    report.add(path, "predict 1 phrase", one, per_s=len(one) / sum(one), unit="phrases", **sent)
    sent = {"sent_bytes": sent_many or "", "received_bytes": received or ""}
    per_s = n * len(many) / sum(many)
    report.add(path, f"predict {n} phrases", many, per_s=per_s, unit="phrases", **sent)
    per_s = instances / sum(many)
    report.add(path, f"instances ({n} phrases)", many, per_s=per_s, unit="instances")


def response_payload(prediction: ConceptPrediction) -> int:
    """Bytes of the outputs a prediction came from (tensor payload, RLE masks)."""
    arrays = (prediction.presence, prediction.phrase_index, prediction.query_index)
    total = sum(a.nbytes for a in (*arrays, prediction.scores, prediction.boxes))
    return total + sum(len(r["counts"]) for r in prediction.rle or ())


def sample_images(count: int, seed: int = 0) -> list[np.ndarray]:
    """``count`` distinct RGB images of a typical photo size (640x480), blocks plus noise;
    another ``seed`` gives other images."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        blocks = rng.integers(0, 256, (14, 18, 3))
        base = np.kron(blocks, np.ones((37, 37, 1)))[:480, :640]
        out.append(np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8))
    return out


def run_concept_bench(
    *,
    checkpoint: Path,
    urls: dict[str, str],
    phrases: Sequence[str] = ("cat", "red car", "person", "a cell"),
    images: int = 3,
    repeats: int = 3,
    threshold: float = 0.5,
    stats_url: str | None = None,
) -> ConceptBenchReport:
    """Benchmark the served model (``urls``: protocol -> URL) against ``Sam3Model`` loaded
    from ``checkpoint`` (the same weights the server exported), in one run; ``stats_url``
    (Triton's HTTP endpoint) adds the server's own count of exemplar graph runs."""
    report = ConceptBenchReport(settings={
        "phrases": list(phrases), "images": images, "repeats": repeats, "threshold": threshold,
        "image_size": "640x480", "concurrency": 1,
    })  # fmt: skip
    for seed, (protocol, url) in enumerate(urls.items()):
        # new images for every path: the server would answer a probe for ones it holds
        work = Workload(sample_images(images + 1, seed=seed), phrases, threshold, repeats)
        bench_triton(url, protocol, work, report, stats_url)
    work = Workload(sample_images(images + 1, seed=len(urls)), phrases, threshold, repeats)
    bench_transformers(checkpoint, work, report)
    return report


def bench_local(
    work_dir: Path,
    *,
    checkpoint: Path | None = None,
    phrases: Sequence[str] = ("cat", "red car", "person", "a cell"),
    images: int = 3,
    repeats: int = 3,
) -> ConceptBenchReport:
    """Export, serve (embedded Triton, both protocols) and benchmark on this machine.

    Args:
        work_dir: scratch directory (checkpoint and repository are written there).
        checkpoint: a ``facebook/sam3``-layout model directory (exported as ``sam3_concept``);
            None writes the small random-init model (``sam3_concept_small``).
    """
    from triton_sam.bench.harness import embedded, protocol_urls, setup_repository
    from triton_sam.export import sam3_concept
    from triton_sam.models import get_model
    from triton_sam.repository.config import RepositoryOptions

    work_dir = Path(work_dir)
    if checkpoint is None:
        spec = sam3_concept.small_spec()
        checkpoint = work_dir / "checkpoint"
        if not (checkpoint / "config.json").is_file():
            sam3_concept.save_random_checkpoint(spec, checkpoint)
    else:
        spec = get_model("sam3_concept")
    repo = setup_repository(
        spec,
        work_dir / "model_repository",
        checkpoint=checkpoint,
        twin=False,  # written for the python target: served as it is
        repository_options=RepositoryOptions(target="python"),
    )
    with embedded(repo) as server:
        report = run_concept_bench(
            checkpoint=checkpoint,
            urls=protocol_urls(server),
            phrases=phrases,
            images=images,
            repeats=repeats,
            stats_url=server.http_url,
        )
    report.settings["model"] = spec.name
    return report
