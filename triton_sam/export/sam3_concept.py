"""SAM3 concept exporter: transformers' ``Sam3Model`` as three verified ONNX graphs.

The wrappers call upstream's own code, so the graphs compute what transformers computes:

- vision = ``Sam3Model.get_vision_features(pixel_values).fpn_hidden_states[:-1]`` (the levels
  ``Sam3Model.forward`` reads; the 0.5-scale level is dropped upstream too);
- text = ``Sam3Model.get_text_features(input_ids, attention_mask).pooler_output``;
- decoder = ``Sam3Model.forward(vision_embeds=..., text_embeds=..., attention_mask=...)`` on
  one image's features tiled across its N phrases, followed by the processor's scoring
  (sigmoid(logit) x sigmoid(presence)), the threshold and a top-k, written as arithmetic (no
  data-dependent Python branch): see :class:`ConceptDecoder`.

Checkpoints are Hugging Face model directories (``config.json`` + ``model.safetensors`` +
the processor's tokenizer files), such as the snapshot of ``facebook/sam3``.
:func:`save_random_checkpoint` writes one offline, with a toy CLIP tokenizer
(:func:`toy_tokenizer`) so that ``Sam3Processor.from_pretrained`` works end to end.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from triton_sam.errors import CheckpointError, ExportValidationError
from triton_sam.export import ExportOptions, onnx_utils
from triton_sam.models import sam3_concept as contract
from triton_sam.models.sam3_concept import ConceptFamilySpec, concept_family
from triton_sam.models.spec import GraphSpec, ModelSpec

TOKENIZER_FILENAME = "tokenizer.json"

# Vision and text graphs: the fp32 default (ORT and torch differ by reassociation only).
# Decoder: mask logits are dot products taken after the DETR encoder/decoder and the pixel
# decoder's GroupNorms, which ORT fuses and reassociates; measured on the small config:
# 2.9e-4 on logits of magnitude up to ~40 (tests/export/test_sam3_concept_export.py prints
# it). 1e-3 is a ~3x margin; scores and boxes stay far inside it (< 1e-6).
DECODER_TOLERANCE = onnx_utils.Tolerance(atol=1e-3, rtol=1e-3)
# Words the toy tokenizer knows as single tokens (other lowercase words split into letters).
_TOY_WORDS = (
    "a", "the", "cat", "dog", "car", "red", "blue", "green", "person", "tree", "cell",
    "nucleus", "mitochondrion", "membrane", "vesicle", "neuron", "synapse", "axon",
)  # fmt: skip


# -- configs, checkpoints, tokenizer ----------------------------------------------------------
def small_config(vocab_size: int = 512) -> Any:
    """A small random-init ``Sam3Config`` (about 1.1M parameters) with the real geometry.

    Same 1008x1008 input, 14-pixel patches, 288/144/72 feature levels, 32 tokens and 200
    queries as ``facebook/sam3``; width 64 everywhere (the FPN width must equal the DETR
    width; the mask decoder's GroupNorm needs a multiple of 8), two ViT layers of which one is
    global, two text layers, two DETR encoder and two decoder layers.
    """
    from transformers import Sam3Config

    tokenizer = toy_tokenizer()
    return Sam3Config(
        vision_config={
            "backbone_config": {
                "model_type": "sam3_vit_model",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "global_attn_indexes": [1],
            },
            "fpn_hidden_size": 64,
        },
        text_config={
            "vocab_size": vocab_size,
            "hidden_size": 64,
            "intermediate_size": 128,
            "projection_dim": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "max_position_embeddings": contract.CONTEXT_LENGTH,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        geometry_encoder_config={
            "hidden_size": 64,
            "num_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 128,
        },
        detr_encoder_config={
            "hidden_size": 64,
            "num_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 128,
        },
        detr_decoder_config={
            "hidden_size": 64,
            "num_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 128,
        },
        mask_decoder_config={"hidden_size": 64, "num_attention_heads": 2},
    )


SMALL_WIDTH = 64


def small_spec() -> ModelSpec:
    """A variant of :func:`small_config`'s contract (width 64), for tests, demos and benchmarks
    that run offline; its random checkpoint comes from :func:`save_random_checkpoint`."""
    from triton_sam.models.spec import Checkpoint

    return ModelSpec(
        name="sam3_concept_small",
        family=concept_family(width=SMALL_WIDTH),
        upstream_config="triton_sam.export.sam3_concept.small_config",
        checkpoint=Checkpoint(url="", filename="sam3_concept_small"),
        params_m=1.1,
        description="SAM3 concept, small random configuration (tests, offline demos)",
    )


def default_config(family: ConceptFamilySpec) -> Any:
    """The ``Sam3Config`` a random checkpoint of ``family`` is built from: the published
    model's for width 256, :func:`small_config` for width 64.

    Raises:
        CheckpointError: another width (no known configuration has it).
    """
    from transformers import Sam3Config

    if family.width == contract.WIDTH and family.num_queries == contract.NUM_QUERIES:
        return Sam3Config()
    if family.width == SMALL_WIDTH and family.num_queries == contract.NUM_QUERIES:
        return small_config()
    raise CheckpointError(
        f"checkpoint: no default configuration of width {family.width} with "
        f"{family.num_queries} queries; pass config= explicitly"
    )


def family_for_config(config: Any) -> ConceptFamilySpec:
    """The tensor contract of a ``Sam3Config`` (its width and number of queries).

    Raises:
        CheckpointError: a config Sam3Model cannot run (FPN width != DETR width).
    """
    width = int(config.detr_encoder_config.hidden_size)
    fpn = int(config.vision_config.fpn_hidden_size)
    if fpn != width or int(config.detr_decoder_config.hidden_size) != width:
        raise CheckpointError(
            f"checkpoint: FPN width {fpn}, DETR widths {width}/"
            f"{config.detr_decoder_config.hidden_size}; Sam3Model needs them equal"
        )
    return concept_family(width=width, num_queries=int(config.detr_decoder_config.num_queries))


def toy_tokenizer() -> Any:
    """A CLIP tokenizer built offline: byte-level letters and digits, a few whole words.

    The real one (49,408 tokens) comes with the gated ``facebook/sam3`` snapshot. This one has
    the same special tokens, normaliser and pre-tokeniser (``CLIPTokenizer``'s), so
    ``Sam3Processor`` and the serving model tokenise with the same code path.
    """
    import string

    from transformers import CLIPTokenizer

    vocab: dict[str, int] = {}
    for c in string.ascii_lowercase + string.digits + "!?.,-'":
        vocab.setdefault(c, len(vocab))
        vocab.setdefault(c + "</w>", len(vocab))
    merges: list[tuple[str, str]] = []
    for word in _TOY_WORDS:
        pieces = list(word[:-1]) + [word[-1] + "</w>"]
        while len(pieces) > 1:  # merge left to right: c a t</w> -> ca t</w> -> cat</w>
            pair = (pieces[0], pieces[1])
            if pair not in merges:
                merges.append(pair)
            pieces = [pair[0] + pair[1], *pieces[2:]]
            vocab.setdefault(pieces[0], len(vocab))
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=merges)


def rescale_weights(model: nn.Module, *, seed: int = 0) -> None:
    """Re-initialise a random model so its outputs carry signal (parity tests need it).

    transformers initialises with std 0.02, which leaves scores near sigmoid(0)^2 and masks
    near 0 for every phrase, so a parity test could not tell phrases or instances apart.
    Here matrices get LeCun-normal weights (std 1/sqrt(fan_in)), biases N(0, 0.1), and three
    heads are scaled so that scores spread over (0, 1), presence differs by phrase (and is
    low for some: its bias is lowered by 3) and mask logits are O(10) (masks neither all-0.5
    nor saturated).
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = 1 if "embed" in name else p[0].numel()
                p.copy_(torch.randn(p.shape, generator=generator) / math.sqrt(fan_in))
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
        scoring = model.dot_product_scoring
        scoring.query_proj.weight.mul_(3.0)
        scoring.text_proj.weight.mul_(3.0)
        model.detr_decoder.presence_head.layer3.weight.mul_(8.0)
        model.detr_decoder.presence_head.layer3.bias.sub_(3.0)
        model.mask_decoder.mask_embedder.layers[-1].weight.mul_(0.005)


def save_random_checkpoint(
    spec: ModelSpec, path: Path, *, seed: int = 0, config: Any = None
) -> Path:
    """Write a random-init model directory with processor files, for offline tests and demos.

    Args:
        spec: a concept variant (its family's width must match ``config``).
        path: the directory to create (``save_pretrained`` layout).
        seed: seed of the initialisation (:func:`rescale_weights`).
        config: a ``Sam3Config``; default :func:`default_config` of the spec's family.

    Raises:
        CheckpointError: ``path`` exists, or ``config`` does not match ``spec``'s contract.
    """
    from transformers import Sam3ImageProcessor, Sam3Model, Sam3Processor

    config = config if config is not None else default_config(spec.family)
    _check_contract(spec, family_for_config(config))
    path = Path(path)
    if path.exists():
        raise CheckpointError(f"checkpoint: {path} already exists; not overwriting it")
    torch.manual_seed(seed)
    model = Sam3Model(config).eval()
    rescale_weights(model, seed=seed)
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    Sam3Processor(image_processor=Sam3ImageProcessor(), tokenizer=toy_tokenizer()).save_pretrained(
        tmp
    )
    tmp.replace(path)
    return path


def build_model(spec: ModelSpec, checkpoint: Path | None) -> nn.Module:
    """Build ``Sam3Model`` in eval mode on CPU from a model directory.

    Args:
        spec: a concept variant.
        checkpoint: a Hugging Face model directory (the ``facebook/sam3`` snapshot, or
            :func:`save_random_checkpoint` output); None builds the default config's random
            initialisation (full size, untokenisable without a tokenizer: export only).

    Raises:
        CheckpointError: not a model directory, unreadable, missing weights, or a contract
            (width, queries) other than ``spec``'s.
    """
    from transformers import Sam3Config, Sam3Model

    if checkpoint is None:
        model = Sam3Model(Sam3Config()).eval()
        _check_contract(spec, family_for_config(model.config))
        return model
    checkpoint = Path(checkpoint)
    if not (checkpoint / "config.json").is_file():
        raise CheckpointError(
            f"checkpoint: {checkpoint} is not a Hugging Face model directory (no config.json); "
            f"expected the snapshot of {spec.checkpoint.hf_repo or spec.upstream_config}"
        )
    try:
        model, info = Sam3Model.from_pretrained(checkpoint, output_loading_info=True)
    except Exception as e:  # transformers raises OSError, ValueError, KeyError...
        raise CheckpointError(f"checkpoint: cannot load {checkpoint}: {e}") from e
    missing = sorted(info.get("missing_keys", []))
    if missing:
        raise CheckpointError(
            f"checkpoint: {checkpoint} does not match {spec.name}: {len(missing)} missing keys "
            f"(e.g. {missing[:3]})"
        )
    _check_contract(spec, family_for_config(model.config))
    return model.eval()


def _check_contract(spec: ModelSpec, actual: ConceptFamilySpec) -> None:
    fam = spec.family
    if (actual.width, actual.num_queries) != (fam.width, fam.num_queries):
        raise CheckpointError(
            f"checkpoint: width {actual.width} with {actual.num_queries} queries, but "
            f"{spec.name} serves width {fam.width} with {fam.num_queries} queries"
        )


def save_tokenizer(checkpoint: Path | None, dest: Path) -> tuple[Path, int]:
    """Write the checkpoint's tokenizer as one ``tokenizer.json`` for the serving model.

    The serving model tokenises with the ``tokenizers`` package (the Rust library under
    ``CLIPTokenizer``), so curl and other-language clients send plain text. Padding and
    truncation are cleared: the serving model pads to 32 itself and refuses longer phrases,
    as Sam3Processor + Sam3Model do.

    Args:
        checkpoint: model directory with the processor's tokenizer files; None uses
            :func:`toy_tokenizer` (random-init exports).
        dest: directory to write ``tokenizer.json`` into.

    Returns:
        (path of ``tokenizer.json``, the pad token id).

    Raises:
        CheckpointError: the checkpoint has no readable tokenizer.
    """
    if checkpoint is None:
        tokenizer = toy_tokenizer()
    else:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        except Exception as e:  # OSError, ValueError... from the tokenizer loaders
            raise CheckpointError(
                f"checkpoint: {checkpoint} has no usable tokenizer ({e}); the facebook/sam3 "
                "snapshot ships tokenizer.json / vocab.json + merges.txt"
            ) from e
    backend = tokenizer.backend_tokenizer
    backend.no_padding()
    backend.no_truncation()
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / TOKENIZER_FILENAME
    backend.save(str(path))
    return path, int(tokenizer.pad_token_id)


# -- ONNX wrappers ---------------------------------------------------------------------------
class ConceptVision(nn.Module):
    """pixel_values [B,3,1008,1008] -> fpn_features.0/1/2 [B,C,288,288], [B,C,144,144],
    [B,C,72,72]."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.model.get_vision_features(pixel_values).fpn_hidden_states[:-1])


class ConceptText(nn.Module):
    """input_ids, attention_mask [B,32] int64 -> text_features [B,32,C]."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model.get_text_features(
            input_ids=input_ids, attention_mask=attention_mask
        ).pooler_output


class ConceptDecoder(nn.Module):
    """One image's features x N phrases -> the instances each phrase keeps.

    Inputs (B = images, N = phrases per image, C = width, T = 32):
        fpn_features.0/1/2 as the vision graph returns them; text_features [B,N,T,C] and
        attention_mask [B,N,T] int64 as the text graph / tokenizer give them; threshold [B,1]
        float32; max_instances [B,1] int64 (>= 1).
    Outputs (K = the most instances any phrase of the batch keeps, at least 1):
        scores [B,N,K] = sigmoid(logit) x sigmoid(presence); boxes [B,N,K,4] (x0, y0, x1, y1)
        normalised to [0, 1]; masks [B,N,K,288,288] mask logits; query_index [B,N,K] int64;
        num_instances [B,N] int64; presence [B,N] = sigmoid(presence logit).

    Phrase (b, n) keeps the queries whose score exceeds ``threshold`` (Sam3Processor's
    ``scores > threshold``), at most ``max_instances`` of them (the highest scores), in query
    order as the processor returns them: its first ``num_instances[b, n]`` entries; the rest
    of its K entries are padding (the next-best queries, scores at or below the threshold).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        fpn_0: torch.Tensor,
        fpn_1: torch.Tensor,
        fpn_2: torch.Tensor,
        text_features: torch.Tensor,
        attention_mask: torch.Tensor,
        threshold: torch.Tensor,
        max_instances: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        from transformers.modeling_outputs import BaseModelOutputWithPooling
        from transformers.models.sam3.modeling_sam3 import Sam3VisionEncoderOutput

        batch, phrases = text_features.shape[0], text_features.shape[1]
        features = [_tile(f, phrases) for f in (fpn_0, fpn_1, fpn_2)]
        vision = Sam3VisionEncoderOutput(
            # Sam3Model.forward drops the last level (the 0.5 scale); None stands in for it.
            fpn_hidden_states=(*features, None),
            fpn_position_encoding=(*(self._position_encoding(f) for f in features), None),
        )
        text = BaseModelOutputWithPooling(pooler_output=text_features.flatten(0, 1))
        out = self.model(
            vision_embeds=vision, text_embeds=text, attention_mask=attention_mask.flatten(0, 1)
        )
        presence = out.presence_logits.sigmoid()  # [BN, 1]
        scores = out.pred_logits.sigmoid() * presence  # [BN, Q], post_process_* order
        selected, kept = _select(scores, _per_phrase(threshold, phrases), max_instances, phrases)
        flat = selected + scores.shape[-1] * torch.arange(scores.shape[0])[:, None]
        flat = flat.reshape(-1)
        size = out.pred_masks.shape[-2:]
        masks = out.pred_masks.flatten(0, 1).index_select(0, flat)
        return (
            scores.reshape(-1).index_select(0, flat).reshape(batch, phrases, -1),
            out.pred_boxes.flatten(0, 1).index_select(0, flat).reshape(batch, phrases, -1, 4),
            masks.reshape(batch, phrases, -1, *size),
            selected.reshape(batch, phrases, -1),
            kept.reshape(batch, phrases),
            presence.reshape(batch, phrases),
        )

    def _position_encoding(self, features: torch.Tensor) -> torch.Tensor:
        # A constant of the level's shape (upstream's sine encoding). Built for batch 1 and
        # expanded, so the traced graph keeps the batch dim symbolic instead of baking it in.
        encode = self.model.vision_encoder.neck.position_encoding
        one = encode((1, *features.shape[1:]), features.device, features.dtype)
        return one.expand(features.shape[0], -1, -1, -1)


def _tile(features: torch.Tensor, phrases: int) -> torch.Tensor:
    """[B, C, H, W] -> [B*N, C, H, W]: each image once per phrase (a view, then one copy)."""
    return features[:, None].expand(-1, phrases, -1, -1, -1).flatten(0, 1)


def _per_phrase(values: torch.Tensor, phrases: int) -> torch.Tensor:
    """[B, 1] per-image values -> [B*N, 1], one row per (image, phrase)."""
    return values.reshape(-1, 1).expand(-1, phrases).reshape(-1, 1)


def _select(
    scores: torch.Tensor, threshold: torch.Tensor, max_instances: torch.Tensor, phrases: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices [BN, K] of the kept queries (query order, padding last) and counts [BN].

    Arithmetic, not branches: sort all queries by score, take the first K = max kept count
    (at least 1, so no tensor has a zero dim), then order each row's kept entries by query
    index and push its padding entries (index + Q) behind them.
    """
    queries = scores.shape[-1]
    limit = _per_phrase(max_instances, phrases).reshape(-1)
    kept = torch.minimum((scores > threshold).sum(-1), limit)  # [BN]
    k = kept.max().clamp(min=1)
    _, order = torch.topk(scores, queries, dim=-1)  # every query, best first
    rank = torch.arange(k)  # traced as a Range on the computed k
    candidates = order.index_select(1, rank)
    is_kept = rank[None, :] < kept[:, None]
    keys, _ = torch.sort(torch.where(is_kept, candidates, candidates + queries), dim=-1)
    return torch.remainder(keys, queries), kept


def wrap_vision(model: nn.Module) -> nn.Module:
    """The ONNX-exportable vision graph of a built ``Sam3Model`` (in eval mode)."""
    return ConceptVision(model).eval()


def wrap_text(model: nn.Module) -> nn.Module:
    """The ONNX-exportable text graph of a built ``Sam3Model`` (in eval mode)."""
    return ConceptText(model).eval()


def wrap_decoder(model: nn.Module) -> nn.Module:
    """The ONNX-exportable decoder graph of a built ``Sam3Model`` (in eval mode).

    Eval mode matters beyond the export: a fresh wrapper is in training mode, the exporter
    restores that mode afterwards, and the DETR dropout (p = 0.1) would then silently change
    every later torch reference run.
    """
    return ConceptDecoder(model).eval()


# -- export ----------------------------------------------------------------------------------
@dataclass
class ConceptExportResult:
    """Paths and figures of one concept export.

    Attributes:
        graphs: role (``"vision"``, ``"text"``, ``"decoder"``) -> ``.onnx`` path.
        tokenizer: the ``tokenizer.json`` the serving model ships.
        pad_token_id: the tokenizer's padding id.
        seconds: wall time per stage.
        max_abs_error: largest |ORT - torch| per output (``<role>.<name>``).
        tolerance: (atol, rtol) per graph role.
    """

    graphs: dict[str, Path]
    tokenizer: Path
    pad_token_id: int
    seconds: dict[str, float] = field(default_factory=dict)
    max_abs_error: dict[str, float] = field(default_factory=dict)
    tolerance: dict[str, tuple[float, float]] = field(default_factory=dict)

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
    """Export ``spec`` to ``out_dir/{vision,text,decoder}.onnx`` + ``tokenizer.json``, verified.

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
    fam: ConceptFamilySpec = spec.family
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    model = build_model(spec, checkpoint)
    tokenizer, pad_id = save_tokenizer(checkpoint, Path(out_dir))
    seconds["build"] = time.perf_counter() - t0
    wrappers = {"vision": wrap_vision(model), "text": wrap_text(model)}
    wrappers["decoder"] = wrap_decoder(model)
    cases = _cases(
        fam, wrappers, np.random.default_rng(options.seed), pad_id, verify=options.verify
    )
    # References before the export: the exporter may leave a module's mode changed.
    checked = (
        {
            graph.role: [
                (label, feeds, _run_torch(wrappers[graph.role], feeds, graph))
                for label, feeds in cases[graph.role]
            ]
            for graph in fam.graphs
        }
        if options.verify
        else {}
    )
    graphs = {}
    for graph in fam.graphs:
        t0 = time.perf_counter()
        graphs[graph.role] = _export_graph(
            wrappers[graph.role], graph, cases[graph.role][-1][1], Path(out_dir), options
        )
        seconds[f"export_{graph.role}"] = time.perf_counter() - t0
    result = ConceptExportResult(graphs, tokenizer, pad_id, seconds)
    if options.verify:
        t0 = time.perf_counter()
        _verify(result, fam, checked)
        seconds["verify"] = time.perf_counter() - t0
    return result


def _export_graph(
    module: nn.Module,
    graph: GraphSpec,
    feeds: dict[str, np.ndarray],
    out_dir: Path,
    options: ExportOptions,
) -> Path:
    """Export one graph, traced on ``feeds`` (no dim 1 among the dynamic ones)."""
    path = onnx_utils.export_graph(
        module,
        tuple(torch.from_numpy(feeds[t.name]) for t in graph.inputs),
        out_dir / f"{graph.role}.onnx",
        input_names=[t.name for t in graph.inputs],
        output_names=[t.name for t in graph.outputs],
        dynamic_axes=_axes(graph),
        opset=options.opset,
        external_data=options.external_data,
    )
    _declare_output_dims(path, graph)
    module.eval()  # the exporter restores the mode the module had; make sure it is eval
    return path


def _axes(graph: GraphSpec) -> dict[str, dict[int, str]]:
    """Dim 0 is Triton's batch; each -1 of the spec is a named dynamic axis. Names are
    shared where the dims are the same: ``phrases`` and the instance count ``instances``."""
    names = {"scores": ["phrases", "instances"], "boxes": ["phrases", "instances"]}
    names |= {"masks": ["phrases", "instances"], "query_index": ["phrases", "instances"]}
    axes: dict[str, dict[int, str]] = {}
    for t in (*graph.inputs, *graph.outputs):
        axes[t.name] = {0: "batch"}
        dynamic = [i for i, d in enumerate(t.shape) if d == -1]
        labels = names.get(t.name, ["phrases"] * len(dynamic))
        for i, label in zip(dynamic, labels, strict=False):
            axes[t.name][i + 1] = label
    return axes


def _declare_output_dims(path: Path, graph: GraphSpec) -> None:
    """Write the spec's output dims into the graph: static where the spec is, symbolic else.

    The TorchScript exporter names every output dim it cannot prove static (``Reshape..._dim_3``
    for the 4 in boxes [B,N,K,4]); Triton's onnxruntime backend compares output dims with the
    config exactly, so they must be the spec's.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    axes = _axes(graph)
    for value, spec in zip(model.graph.output, graph.outputs, strict=True):
        dims = value.type.tensor_type.shape.dim
        for i, dim in enumerate(dims):
            expected = -1 if i == 0 else spec.shape[i - 1]
            if expected > 0:
                dim.Clear()
                dim.dim_value = expected
            else:
                dim.Clear()
                dim.dim_param = axes[spec.name][i]
    onnx.save_model(model, str(path))  # weights stay where they were (inline or sidecar)


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
    features from the text wrapper on random tokens with different lengths.
    """
    size = fam.preprocessing.image_size
    pixels = rng.standard_normal((2, 3, size, size)).astype(np.float32)
    ids, mask = _random_tokens(rng, 5, fam.context_length, pad_id)
    with torch.no_grad():
        features = [f.numpy() for f in wrappers["vision"](torch.from_numpy(pixels))]
        text = wrappers["text"](torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    names = fam.feature_names

    def decoder_case(images: int, rows: list[int], threshold: float, limit: int) -> dict:
        feeds = {n: np.ascontiguousarray(f[:images]) for n, f in zip(names, features, strict=True)}
        feeds[contract.TEXT_FEATURES] = text[rows].reshape(images, -1, *text.shape[1:])
        feeds[contract.ATTENTION_MASK] = mask[rows].reshape(images, -1, mask.shape[-1])
        feeds[contract.THRESHOLD] = np.full((images, 1), threshold, np.float32)
        feeds[contract.MAX_INSTANCES] = np.full((images, 1), limit, np.int64)
        return feeds

    queries, threshold = fam.num_queries, 0.5  # tracing only needs some threshold
    if verify:  # every query of every (image, phrase) checked below: place the threshold
        everything = decoder_case(2, [0, 1, 4, 2, 3, 0], -1.0, queries)
        threshold = _gap(_run_torch(wrappers["decoder"], everything, fam.decoder)["scores"])
    return {
        "vision": [("batch=2", {fam.vision.inputs[0].name: pixels})],
        "text": [("batch=5", {contract.INPUT_IDS: ids, contract.ATTENTION_MASK: mask})],
        "decoder": [
            ("1 image x 3 phrases, threshold", decoder_case(1, [0, 1, 4], threshold, queries)),
            ("1 image x 1 phrase, max_instances=3", decoder_case(1, [2], -1.0, 3)),
            ("2 images x 2 phrases, threshold", decoder_case(2, [0, 1, 2, 3], threshold, queries)),
        ],
    }


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


def _run_torch(
    module: nn.Module, feeds: dict[str, np.ndarray], graph: GraphSpec
) -> dict[str, np.ndarray]:
    with torch.no_grad():
        outs = module(*(torch.from_numpy(feeds[t.name]) for t in graph.inputs))
    outs = outs if isinstance(outs, tuple) else (outs,)
    return {t.name: o.numpy() for t, o in zip(graph.outputs, outs, strict=True)}


def _verify(
    result: ConceptExportResult,
    fam: ConceptFamilySpec,
    checked: dict[str, list[tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]]],
) -> None:
    """Run every case through ORT against its torch reference; raise once listing every
    mismatch of every graph."""
    mismatches: list[str] = []
    for graph in fam.graphs:
        tolerance = DECODER_TOLERANCE if graph.role == "decoder" else onnx_utils.FP32_TOLERANCE
        result.tolerance[graph.role] = (tolerance.atol, tolerance.rtol)
        try:
            errors = onnx_utils.verify_graph(
                result.graphs[graph.role], checked[graph.role], tolerance
            )
        except ExportValidationError as e:
            mismatches += [f"{graph.role}: {line}" for line in e.mismatches]
            continue
        result.max_abs_error.update({f"{graph.role}.{k}": v for k, v in errors.items()})
    if mismatches:
        raise ExportValidationError(", ".join(p.name for p in result.graphs.values()), mismatches)
