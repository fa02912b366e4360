"""Export of a concept family's four graphs, traced and finished by the shared steps of
:mod:`triton_sam.export` (output dims written from the spec, what Triton's onnxruntime backend
compares with ``config.pbtxt``), with the concept family's ORT-vs-torch check (per-output
tolerances, one report of every mismatch)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from triton_sam.errors import ExportValidationError
from triton_sam.export import (
    ExportOptions,
    GraphExport,
    finish_graph,
    onnx_utils,
    run_torch,
    trace_graphs,
    verification,
)
from triton_sam.export import sam3_concept as family_exporter
from triton_sam.models import sam3_concept as contract
from triton_sam.models.sam3_concept import ConceptFamilySpec
from triton_sam.models.spec import GraphSpec, ModelSpec

# Vision and text graphs: the fp32 default (ORT and torch differ by reassociation only).
# Decoder scores, boxes and presence: 1e-3 of the tensor's scale (~8,400 float32 ulps), far
# above what is measured (< 1e-6 on the small config, and the selection of queries is exact):
# these come after the DETR encoder/decoder's many normalised layers, whose reassociation
# error was never measured on trained weights, and a bug still moves them by far more.
DECODER_TOLERANCE = verification.Tolerance(max_rel=1e-3, rms_rel=1e-3)
# Decoder mask logits are dot products taken after the DETR encoder/decoder and the pixel
# decoder's GroupNorms, which ORT fuses and reassociates: the error grows with depth and with
# the logits' range, and what matters downstream is their sign (sigmoid > 0.5). So the bound
# is this fraction of the case's largest |logit|. Measured: small config 2.9e-4 at a range of
# 37 (8e-6 of it); the full-size model (default Sam3Config, re-scaled random init) 0.017 at a
# range of 419 (4.1e-5 of it; 22 sign flips in 33M logits, all within 0.02 of 0). 1e-4 of the
# range leaves a 2.4x margin over the worst of them; the rms error is bounded by the same
# fraction of the logits' rms.
MASK_RANGE_FRACTION = 1e-4
MASK_TOLERANCE = verification.Tolerance(max_rel=MASK_RANGE_FRACTION, rms_rel=MASK_RANGE_FRACTION)


@dataclass
class ConceptExportResult:
    """Paths and figures of one concept export.

    Attributes:
        graphs: role (``"vision"``, ``"text"``, ``"decoder"``) -> ``.onnx`` path.
        tokenizer: the ``tokenizer.json`` the serving model ships.
        pad_token_id: the tokenizer's padding id.
        seconds: wall time per stage.
        max_abs_error: largest |ORT - torch| per output (``<role>.<name>``).
        tolerance: the tolerance of each output (``<role>.<name>``), relative to the
            reference's magnitude in each case.
    """

    graphs: dict[str, Path]
    tokenizer: Path
    pad_token_id: int
    seconds: dict[str, float] = field(default_factory=dict)
    max_abs_error: dict[str, float] = field(default_factory=dict)
    tolerance: dict[str, verification.Tolerance] = field(default_factory=dict)

    def files(self) -> list[Path]:
        """Every file the export wrote (graphs, external-data sidecars, tokenizer)."""
        paths = list(self.graphs.values())
        return [*paths, *(p for g in paths for p in onnx_utils.external_data_files(g))]


def export_graphs(
    spec: ModelSpec,
    checkpoint: Path | None,
    out_dir: Path,
    options: ExportOptions | None = None,
) -> ConceptExportResult:
    """Export ``spec`` to ``out_dir/{vision,text,exemplar,decoder}.onnx`` + ``tokenizer.json``,
    verified.

    Args:
        spec: a concept variant.
        checkpoint: model directory; None exports the default config's random init.
        out_dir: a scratch directory (the repository writer moves the files into place).
        options: opset, external data, verification, seed (``fp16`` is not supported yet).

    Raises:
        CheckpointError / ExportError: as :func:`triton_sam.export.export_model`.
        ExportValidationError: raised once, listing every mismatching output of every graph.
    """
    options = options or ExportOptions()
    if options.fp16:
        from triton_sam.errors import InputValidationError

        raise InputValidationError("fp16", "not supported for the concept family yet (fp32 only)")
    if options.fuse_attention or options.quantize != "none":
        from triton_sam.errors import InputValidationError

        field = "fuse_attention" if options.fuse_attention else "quantize"
        raise InputValidationError(field, "not supported for the concept family (fp32 only)")
    fam: ConceptFamilySpec = spec.family
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    model = family_exporter.build_model(spec, checkpoint)
    tokenizer, pad_id = family_exporter.save_tokenizer(checkpoint, Path(out_dir))
    seconds["build"] = time.perf_counter() - t0
    wrappers = {g.role: getattr(family_exporter, f"wrap_{g.role}")(model) for g in fam.graphs}
    cases = _cases(
        fam, wrappers, np.random.default_rng(options.seed), pad_id, verify=options.verify
    )
    # References before the export: the exporter may leave a module's mode changed.
    checked = (
        {
            graph.role: [
                (label, feeds, run_torch(wrappers[graph.role], graph, feeds))
                for label, feeds in cases[graph.role]
            ]
            for graph in fam.graphs
        }
        if options.verify
        else {}
    )
    traced = [GraphExport(g, wrappers[g.role], cases[g.role][-1][1], _axes(g)) for g in fam.graphs]
    graphs = trace_graphs(traced, Path(out_dir), options, seconds)
    for graph in fam.graphs:
        finish_graph(graphs[graph.role], graph, options)
    result = ConceptExportResult(graphs, tokenizer, pad_id, seconds)
    if options.verify:
        t0 = time.perf_counter()
        _verify(result, fam, checked)
        seconds["verify"] = time.perf_counter() - t0
    return result


def _axes(graph: GraphSpec) -> dict[str, dict[int, str]]:
    """Dim 0 is Triton's batch; each -1 of the spec is a named dynamic axis. Names are
    shared where the dims are the same: ``phrases`` (prompts per image), the instance count
    ``instances``, the tokens of a prompt ``prompt_tokens``, the exemplar boxes ``boxes``."""
    per_instance = ["phrases", "instances"]
    names = {n: per_instance for n in ("scores", "boxes", "masks", "query_index")}
    names |= {
        n: ["phrases", "prompt_tokens"] for n in (contract.PROMPT_FEATURES, contract.PROMPT_MASK)
    }
    names |= {contract.EXEMPLAR_BOXES: ["boxes"], contract.EXEMPLAR_LABELS: ["boxes"]}
    names |= {contract.EXEMPLAR_FEATURES: ["exemplar_tokens"]}
    axes: dict[str, dict[int, str]] = {}
    for t in (*graph.inputs, *graph.outputs):
        axes[t.name] = {0: "batch"}
        dynamic = [i for i, d in enumerate(t.shape) if d == -1]
        labels = names.get(t.name, ["phrases"] * len(dynamic))
        for i, label in zip(dynamic, labels, strict=False):
            axes[t.name][i + 1] = label
    return axes


def _cases(
    fam: ConceptFamilySpec,
    wrappers: dict[str, nn.Module],
    rng: np.random.Generator,
    pad_id: int,
    *,
    verify: bool,
) -> dict[str, list[tuple[str, dict[str, np.ndarray]]]]:
    """Verification inputs per graph; the last case of each is the one traced (no dynamic
    dim of 1 in it).

    Realistic decoder inputs: features from the vision wrapper on random pixels, text
    features from the text wrapper on random tokens with different lengths, exemplar tokens
    from the exemplar wrapper on each image's random boxes. The decoder is traced on prompts
    with exemplar tokens (36 tokens), so text-only prompts (32) check that the prompt length
    stayed symbolic.
    """
    size = fam.preprocessing.image_size
    pixels = rng.standard_normal((2, 3, size, size)).astype(np.float32)
    ids, mask = _random_tokens(rng, 5, fam.context_length, pad_id)
    with torch.no_grad():
        features = [f.numpy() for f in wrappers["vision"](torch.from_numpy(pixels))]
        text = wrappers["text"](torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    names = fam.feature_names
    level = fam.exemplar.inputs[0].name

    def exemplar_case(image: int, count: int) -> dict:
        boxes, labels = _random_boxes(rng, count)
        feeds = {level: np.ascontiguousarray(features[names.index(level)][image : image + 1])}
        return feeds | {contract.EXEMPLAR_BOXES: boxes, contract.EXEMPLAR_LABELS: labels}

    exemplar_cases = [
        ("1 image x 1 box", exemplar_case(0, 1)),
        ("1 image x 3 boxes", exemplar_case(1, 3)),
    ]
    # The decoder's exemplar tokens: 3 boxes + CLS = 4 per image.
    tokens = np.concatenate(
        [
            run_torch(wrappers["exemplar"], fam.exemplar, exemplar_case(i, 3))[
                contract.EXEMPLAR_FEATURES
            ]
            for i in range(2)
        ]
    )

    def decoder_case(
        images: int, rows: list[int], threshold: float, limit: int, *, exemplars: bool = False
    ) -> dict:
        feeds = {n: np.ascontiguousarray(f[:images]) for n, f in zip(names, features, strict=True)}
        prompts = text[rows].reshape(images, -1, *text.shape[1:])
        prompt_mask = mask[rows].reshape(images, -1, mask.shape[-1])
        if exemplars:  # each image's exemplar tokens after each of its phrases' text tokens
            per = prompts.shape[1]
            extra = np.repeat(tokens[:images, None], per, axis=1)
            prompts = np.concatenate([prompts, extra], axis=2)
            valid = np.ones(extra.shape[:3], np.int64)
            prompt_mask = np.concatenate([prompt_mask, valid], axis=2)
        feeds[contract.PROMPT_FEATURES] = np.ascontiguousarray(prompts)
        feeds[contract.PROMPT_MASK] = np.ascontiguousarray(prompt_mask)
        feeds[contract.THRESHOLD] = np.full((images, 1), threshold, np.float32)
        feeds[contract.MAX_INSTANCES] = np.full((images, 1), limit, np.int64)
        return feeds

    queries, threshold, exemplar_threshold = fam.num_queries, 0.5, 0.5  # tracing: any will do
    if verify:  # every query of every (image, prompt) checked below: place the thresholds
        everything = decoder_case(2, [0, 1, 4, 2, 3, 0], -1.0, queries)
        threshold = _gap(run_torch(wrappers["decoder"], fam.decoder, everything)["scores"])
        everything = decoder_case(2, [0, 1, 4, 2, 3, 0], -1.0, queries, exemplars=True)
        scores = run_torch(wrappers["decoder"], fam.decoder, everything)["scores"]
        exemplar_threshold = _gap(scores)
    return {
        "vision": [("batch=2", {fam.vision.inputs[0].name: pixels})],
        "text": [("batch=5", {contract.INPUT_IDS: ids, contract.ATTENTION_MASK: mask})],
        "exemplar": exemplar_cases,
        "decoder": [
            ("1 image x 3 phrases, threshold", decoder_case(1, [0, 1, 4], threshold, queries)),
            ("1 image x 1 phrase, max_instances=3", decoder_case(1, [2], -1.0, 3)),
            ("2 images x 2 phrases, threshold", decoder_case(2, [0, 1, 2, 3], threshold, queries)),
            (
                "2 images x 2 phrases + 3 exemplars, threshold",
                decoder_case(2, [0, 1, 2, 3], exemplar_threshold, queries, exemplars=True),
            ),
        ],
    }


def _random_boxes(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` boxes [1, count, 4] (cx, cy, w, h), normalised, inside the image, 2% to 50%
    of its side, and labels [1, count] alternating positive (1) and negative (0)."""
    size = rng.uniform(0.02, 0.5, (count, 2))
    centre = size / 2 + rng.uniform(0, 1, (count, 2)) * (1 - size)
    boxes = np.concatenate([centre, size], axis=1).astype(np.float32)[None]
    labels = (np.arange(count) % 2 == 0).astype(np.int64)[None]
    return boxes, labels


def _random_tokens(
    rng: np.random.Generator, count: int, length: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids [count, length] with 3, 5, 7... valid tokens then padding, and their mask."""
    ids = np.full((count, length), pad_id, np.int64)
    mask = np.zeros((count, length), np.int64)
    for i in range(count):
        n = min(3 + 2 * i, length)
        ids[i, :n] = rng.integers(0, max(pad_id, 2), n)
        mask[i, :n] = 1
    return ids, mask


def _gap(scores: np.ndarray) -> float:
    """A threshold in the middle of the widest gap between scores near the median, so that
    no score lies within float error of it (ORT and torch then keep the same queries)."""
    values = np.sort(scores.reshape(-1))
    middle = values[len(values) // 4 : 3 * len(values) // 4]
    gaps = np.diff(middle)
    i = int(np.argmax(gaps))
    return float((middle[i] + middle[i + 1]) / 2)


def tolerance_for(role: str, name: str) -> verification.Tolerance:
    """The ORT-vs-torch tolerance of one output (see the constants above)."""
    if role != "decoder":
        return verification.FP32_TOLERANCE
    return MASK_TOLERANCE if name == contract.MASKS else DECODER_TOLERANCE


def _verify(
    result: ConceptExportResult,
    fam: ConceptFamilySpec,
    checked: dict[str, list[tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]]],
) -> None:
    """Run every case through ORT (one session per graph) against its torch reference;
    raise once listing every mismatch of every output, case and graph."""
    import onnxruntime as ort

    mismatches: list[str] = []
    for graph in fam.graphs:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(
            str(result.graphs[graph.role]), options, providers=["CPUExecutionProvider"]
        )
        names = [o.name for o in session.get_outputs()]
        for label, feeds, expected in checked[graph.role]:
            actual = dict(zip(names, session.run(names, dict(feeds)), strict=True))
            for name, reference in expected.items():
                key = f"{graph.role}.{name}"
                tolerance = result.tolerance[key] = tolerance_for(graph.role, name)
                prefix = f"{graph.role}: [{label}] "
                found = verification.compare_outputs(
                    actual, {name: reference}, tolerance, label=prefix
                )
                mismatches += found
                if name in actual and actual[name].shape == reference.shape:
                    error = np.abs(actual[name].astype(np.float64) - reference).max(initial=0.0)
                    result.max_abs_error[key] = max(result.max_abs_error.get(key, 0.0), error)
        del session  # free a large graph's memory before loading the next
    if mismatches:
        raise ExportValidationError(", ".join(p.name for p in result.graphs.values()), mismatches)
