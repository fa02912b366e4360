"""Export: checkpoint -> verified ONNX graphs, one per graph the family declares.

A family declares its graphs (``FamilySpec.graphs``: role, tensor contract, batching). Its
exporter module (``spec.family.exporter``) exposes ``build_model``,
``save_random_checkpoint`` and one ``wrap_<role>`` per graph (``wrap_encoder``,
``wrap_decoder``); everything else (export and output dims from the contract, fp16, metadata,
the ORT-vs-torch check) is one loop over the graphs here. What is family-specific is where
the example inputs come from: the prompt cases of a point-prompted decoder (below), the
concept family's (``concept_graphs``), the video graphs' (``sam2_video_checks``). The concept
and video exporters trace and finish their graphs through the same two steps
(:func:`trace_graphs`, :func:`finish_graph`) and keep their own checks (per-output
tolerances; expected outputs from upstream's code path instead of the wrappers).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from triton_sam.errors import InputValidationError
from triton_sam.models.spec import GraphSpec, ModelSpec, TensorSpec

if TYPE_CHECKING:
    from triton_sam.export.verification import Tolerance


@dataclass(frozen=True)
class ExportOptions:
    """How to export.

    Attributes:
        opset: ONNX opset (>= 17: LayerNormalization is a single op from 17 on).
        fp16: convert weights and compute to fp16 (I/O stays fp32). For GPU serving;
            onnxruntime's CPU provider runs fp16 graphs slowly.
        verify: run both graphs in onnxruntime against torch after export.
        external_data: force weights into a ``.onnx_data`` sidecar (automatic above 2 GiB).
        seed: seed for the synthetic verification inputs.
        fuse_attention: fuse the encoder's attention into onnxruntime's
            ``MultiHeadAttention`` (SAM2.1, SAM3 tracker; faster on CPU, needs onnxruntime to
            run; see ``export/optimize.py``). Same results within the fp32 tolerance. The
            embedded CPU twin does this to a copy anyway (``repository/cpu_graphs.py``).
        quantize: ``"none"`` or ``"int8"``: int8 weights for the encoder's MatMuls
            (onnxruntime dynamic quantization). Changes results: never the default; the
            check then uses ``optimize.INT8_TOLERANCE`` for the encoder.
    """

    opset: int = 17
    fp16: bool = False
    verify: bool = True
    external_data: bool = False
    seed: int = 0
    fuse_attention: bool = False
    quantize: str = "none"

    def __post_init__(self) -> None:
        from triton_sam.export.optimize import QUANTIZE_CHOICES

        if self.opset < 17:
            raise InputValidationError("opset", f"got {self.opset}, expected >= 17")
        if self.quantize not in QUANTIZE_CHOICES:
            raise InputValidationError(
                "quantize", f"got {self.quantize!r}, expected one of {list(QUANTIZE_CHOICES)}"
            )
        if self.quantize != "none" and self.fp16:
            raise InputValidationError("quantize", "int8 weights and fp16 exclude each other")


@dataclass
class ExportResult:
    """Paths and figures of one export.

    Attributes:
        graphs: role (``"encoder"``, ``"decoder"``) -> path of its ``.onnx``, in the
            family's order.
        seconds: wall time per stage (build, export_<role>, verify).
        max_abs_error: largest |ORT - torch| per output over the verification cases.
        tolerance: the tolerance the check used (the decoder's, and the encoder's unless
            ``encoder_tolerance`` differs: int8 weights); None without a check.
        encoder_tolerance: the tolerance the encoder's check used.
        fused_operators: operator counts from ``fuse_attention`` (empty without it).
    """

    graphs: dict[str, Path]
    seconds: dict[str, float] = field(default_factory=dict)
    max_abs_error: dict[str, float] = field(default_factory=dict)
    tolerance: Tolerance | None = None
    encoder_tolerance: Tolerance | None = None
    fused_operators: dict[str, int] = field(default_factory=dict)

    @property
    def encoder(self) -> Path:
        """Path of the encoder ``.onnx``."""
        return self.graphs["encoder"]

    @property
    def decoder(self) -> Path:
        """Path of the decoder ``.onnx``."""
        return self.graphs["decoder"]

    def files(self) -> list[Path]:
        """Every file the export wrote (graphs and external-data sidecars)."""
        from triton_sam.export.onnx_utils import external_data_files

        paths = list(self.graphs.values())
        return paths + [p for g in paths for p in external_data_files(g)]


def exporter_for(spec: ModelSpec) -> ModuleType:
    """Import the exporter module of ``spec``'s family (torch and the upstream package)."""
    return importlib.import_module(spec.family.exporter)


def save_random_checkpoint(spec: ModelSpec, path: Path, *, seed: int = 0) -> Path:
    """Write a random-init, official-format checkpoint for ``spec`` (offline testing/demo)."""
    return exporter_for(spec).save_random_checkpoint(spec, path, seed=seed)


def export_model(
    spec: ModelSpec,
    checkpoint: Path | None,
    out_dir: Path,
    options: ExportOptions | None = None,
    *,
    metadata: Mapping[str, str] | None = None,
) -> ExportResult:
    """Export ``spec`` to ``out_dir/{encoder,decoder}.onnx`` and check them against torch.

    Args:
        spec: the variant to export.
        checkpoint: official-format checkpoint; None exports the random initialisation.
        out_dir: a scratch directory (the repository writer moves the files into place).
        options: export options.
        metadata: written into both graphs' ``metadata_props`` (e.g. the checkpoint's
            sha256, see ``triton_sam.setup.pipeline``).

    Returns:
        Paths, timings and the measured ORT-vs-torch errors.

    Raises:
        CheckpointError: the checkpoint cannot be loaded into the official model.
        ExportError: torch.onnx.export failed.
        ExportValidationError: an output disagrees beyond tolerance; lists every mismatch.
    """
    from triton_sam.export import optimize, verification

    options = options or ExportOptions()
    exporter = exporter_for(spec)
    fam = spec.family
    seconds: dict[str, float] = {}

    t0 = time.perf_counter()
    model = exporter.build_model(spec, checkpoint)
    wrappers = {g.role: getattr(exporter, f"wrap_{g.role}")(model) for g in fam.graphs}
    seconds["build"] = time.perf_counter() - t0

    # Verification cases per graph; the last of each is the one traced (no dim traced as 1).
    cases, encoded = _prompt_cases(spec, wrappers, np.random.default_rng(options.seed))
    # Torch references before the export, which may leave a module's mode changed. The
    # encoder's one case is the image _prompt_cases already ran through the same module (in
    # the same mode, without grad) to embed the decoder's cases: those outputs are its
    # reference, and running the encoder again would only repeat them (for SAM1 ViT-B at
    # 1024 px, 15 s of CPU per export).
    checked: dict[str, list] = {g.role: [] for g in fam.graphs}
    for graph in fam.graphs if options.verify else ():
        for label, feeds in cases[graph.role]:
            if graph.role == "encoder":
                expected = {t.name: encoded[t.name] for t in graph.outputs}
            else:
                expected = run_torch(wrappers[graph.role], graph, feeds)
            checked[graph.role].append((label, feeds, expected))
    traced = [GraphExport(g, wrappers[g.role], cases[g.role][-1][1]) for g in fam.graphs]
    graphs = trace_graphs(traced, out_dir, options, seconds)

    tolerance = verification.FP16_TOLERANCE if options.fp16 else verification.FP32_TOLERANCE
    # CPU options on the encoder (off by default): fused attention, int8 weights (a looser
    # check, stated in optimize.INT8_TOLERANCE).
    tolerances = {g.role: tolerance for g in fam.graphs}
    fused: dict[str, int] = {}
    if options.fuse_attention:
        t0 = time.perf_counter()
        fused = optimize.fuse_attention(graphs["encoder"], fam.family)
        seconds["fuse_attention"] = time.perf_counter() - t0
    if options.quantize == "int8":
        t0 = time.perf_counter()
        optimize.quantize_int8(graphs["encoder"])
        seconds["quantize"] = time.perf_counter() - t0
        tolerances["encoder"] = optimize.INT8_TOLERANCE
    for graph in fam.graphs:
        finish_graph(graphs[graph.role], graph, options, metadata)
    result = ExportResult(graphs, seconds, tolerance=tolerance)
    result.encoder_tolerance = tolerances.get("encoder", tolerance)
    result.fused_operators = fused
    if options.verify:
        t0 = time.perf_counter()
        for role, path in graphs.items():
            checks = verification.verify_graph(path, checked[role], tolerances[role])
            result.max_abs_error.update(checks)
        seconds["verify"] = time.perf_counter() - t0
    return result


@dataclass(frozen=True)
class GraphExport:
    """One graph to trace.

    Attributes:
        graph: the declared graph: its role names the file (``<role>.onnx``), its tensors
            the graph's inputs and outputs, in the module's order.
        module: a torch module taking ``graph.inputs`` and returning ``graph.outputs``, in order.
        trace: the feeds it is traced on, by input name (no dynamic dim of size 1 in them,
            which the tracer could bake in).
        axes: the dynamic axes by tensor name; None: :func:`batch_axes` of the graph.
    """

    graph: GraphSpec
    module: Any
    trace: Mapping[str, np.ndarray]
    axes: Mapping[str, dict[int, str]] | None = None


def trace_graphs(
    graphs: Sequence[GraphExport],
    out_dir: Path,
    options: ExportOptions,
    seconds: dict[str, float],
) -> dict[str, Path]:
    """Trace each graph to ``out_dir/<role>.onnx`` (``seconds["export_<role>"]``), in order.

    Returns:
        role -> path of the ``.onnx`` written (external data beside it when needed).
    """
    import torch

    from triton_sam.export import onnx_utils

    paths: dict[str, Path] = {}
    for item in graphs:
        graph = item.graph
        t0 = time.perf_counter()
        paths[graph.role] = onnx_utils.export_graph(
            item.module,
            tuple(torch.from_numpy(item.trace[t.name]) for t in graph.inputs),
            out_dir / f"{graph.role}.onnx",
            input_names=[t.name for t in graph.inputs],
            output_names=[t.name for t in graph.outputs],
            dynamic_axes=dict(item.axes or batch_axes([*graph.inputs, *graph.outputs])),
            opset=options.opset,
            external_data=options.external_data,
        )
        # The exporter restores the mode the module had; the next graph may share its
        # submodules, so make sure they are traced in eval mode.
        item.module.eval()
        seconds[f"export_{graph.role}"] = time.perf_counter() - t0
    return paths


def finish_graph(
    path: Path,
    graph: GraphSpec,
    options: ExportOptions,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """What every traced graph gets, in place: fp16 (with ``options.fp16``), the bound on its
    prompt points, the declared output dims, and ``metadata`` in its ``metadata_props``."""
    from triton_sam.export import graph_edits, onnx_utils

    if options.fp16:
        onnx_utils.convert_to_fp16(path)
    bound_prompt_points(path, graph.inputs)
    # Last, so no later rewrite can drop them: Triton's onnxruntime backend needs the
    # fixed output sizes declared in the graph (see set_output_dims).
    graph_edits.set_output_dims(path, graph.outputs)
    if metadata:
        graph_edits.set_metadata(path, metadata)


def bound_prompt_points(path: Path, inputs: Sequence[TensorSpec]) -> None:
    """The graph refuses more prompt points than ``serving.bounds.GRAPH_MAX_POINTS`` per
    batch item, or ``GRAPH_MAX_BATCH_POINTS`` per batch, in each of its point inputs (see
    ``graph_edits.bound_points``); graphs without points unchanged."""
    from triton_sam.export import graph_edits
    from triton_sam.serving.bounds import GRAPH_MAX_BATCH_POINTS, GRAPH_MAX_POINTS, POINT_TENSORS

    for t in inputs:
        if t.name in POINT_TENSORS:
            graph_edits.bound_points(path, t.name, GRAPH_MAX_POINTS, GRAPH_MAX_BATCH_POINTS)


def _random_tensor(t: TensorSpec, batch: int, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((batch, *t.shape)).astype(t.dtype)


def batch_axes(
    tensors: Sequence[TensorSpec], shared: Mapping[str, str] | None = None
) -> dict[str, dict[int, str]]:
    """Dim 0 is Triton's batch; every -1 in the spec becomes a named dynamic axis:
    ``shared[name]`` where the same count appears in several tensors, else
    ``<name>_dim<i>``."""
    axes: dict[str, dict[int, str]] = {}
    for t in tensors:
        axes[t.name] = {0: "batch"}
        for i, d in enumerate(t.shape):
            if d == -1:
                axes[t.name][i + 1] = (shared or {}).get(t.name, f"{t.name}_dim{i + 1}")
    return axes


def _prompt_cases(
    spec: ModelSpec, wrappers: dict[str, Any], rng: np.random.Generator
) -> tuple[dict[str, list[tuple[str, dict[str, np.ndarray]]]], dict[str, np.ndarray]]:
    """Example inputs of a point-prompted pair, by role: a batch of two random images for
    the encoder (so the check also proves its batch dim symbolic), and for the decoder the
    encoder's embeddings of them with a click, box + clicks + mask input, and a batch of two.

    Points are laid out as the family's predictor lays them out (``box_before_points``,
    ``pad_with_box``). The last case is the one traced, so it has N > 1 and B > 1 (no dim
    traced as 1).

    Returns:
        (cases by role, the encoder's outputs on its one case by output name: the torch
        embeddings of the two images, [2, ...] each, in copies of their own so that no
        decoder case's feeds alias them).
    """
    import torch

    fam = spec.family
    size = fam.preprocessing.image_size
    mask = fam.preprocessing.mask_size
    image = _random_tensor(fam.encoder_inputs[0], 2, rng)
    with torch.no_grad():
        outputs = wrappers["encoder"](torch.from_numpy(image))
    embeddings = {t.name: e.numpy() for t, e in zip(fam.encoder_outputs, outputs, strict=True)}

    def layout(clicks: list[float], box: bool) -> list[float]:
        parts = [clicks]
        if box:
            parts.insert(0 if fam.box_before_points else 1, [2, 3])
        if not box or fam.pad_with_box:
            parts.append([-1])
        return [label for part in parts for label in part]

    def case(batch: int, labels: list[float], has_mask: list[float]) -> dict[str, np.ndarray]:
        n = len(labels)
        coords = rng.uniform(0, size, (batch, n, 2)).astype(np.float32)
        coords[:, np.array(labels) == -1] = 0.0  # the padding point sits at the origin
        feeds = {k: np.ascontiguousarray(v[:batch]) for k, v in embeddings.items()}
        feeds.update(
            point_coords=coords,
            point_labels=np.tile(np.array(labels, np.float32), (batch, 1)),
            mask_input=(rng.standard_normal((batch, 1, mask, mask)) * 8).astype(np.float32),
            has_mask_input=np.array(has_mask, np.float32).reshape(batch, 1),
        )
        return feeds

    cases = {
        "encoder": [("encoder batch=2", {fam.encoder_inputs[0].name: image})],
        "decoder": [
            ("click", case(1, layout([1], box=False), [0])),
            ("box+clicks+mask", case(1, layout([1, 0], box=True), [1])),
            ("batch=2", case(2, layout([1, 0, 1], box=True), [0, 1])),
        ],
    }
    return cases, {name: value.copy() for name, value in embeddings.items()}


def run_torch(
    module: Any, graph: GraphSpec, feeds: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """``module``'s outputs on ``feeds``, by ``graph``'s output names."""
    import torch

    with torch.no_grad():
        outs = module(*(torch.from_numpy(feeds[t.name]) for t in graph.inputs))
    if isinstance(outs, torch.Tensor):
        outs = (outs,)
    return {t.name: o.numpy() for t, o in zip(graph.outputs, outs, strict=True)}
