"""SAM3 concept exporter: transformers' ``Sam3Model`` as four verified ONNX graphs.

The wrappers call upstream's own code, so the graphs compute what transformers computes:

- vision = ``Sam3Model.get_vision_features(pixel_values).fpn_hidden_states[:-1]`` (the levels
  ``Sam3Model.forward`` reads; the 0.5-scale level is dropped upstream too);
- text = ``Sam3Model.get_text_features(input_ids, attention_mask).pooler_output``;
- exemplar = ``Sam3Model.geometry_encoder`` on the 72x72 level, one image's boxes and labels
  (what ``Sam3Model.forward`` runs for ``input_boxes``);
- decoder = ``Sam3Model.forward(vision_embeds=..., text_embeds=..., attention_mask=...)`` on
  one image's features tiled across its N prompts (text tokens, then exemplar tokens: the
  concatenation upstream builds from ``input_boxes``), followed by the processor's scoring
  (sigmoid(logit) x sigmoid(presence)), the threshold and a top-k, written as arithmetic (no
  data-dependent Python branch): see ``sam3_concept_wrappers.ConceptDecoder``.

This module is the family's exporter interface (configs, checkpoints, tokenizer, wrappers);
the export itself and its verification are in :mod:`triton_sam.export.concept_graphs`.

Checkpoints are Hugging Face model directories (``config.json`` + ``model.safetensors`` +
the processor's tokenizer files), such as the snapshot of ``facebook/sam3``.
:func:`save_random_checkpoint` writes one offline, with a toy CLIP tokenizer
(:func:`toy_tokenizer`) so that ``Sam3Processor.from_pretrained`` works end to end.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from triton_sam.errors import CheckpointError
from triton_sam.export import sam3_concept_wrappers as wrappers
from triton_sam.models import sam3_concept as contract
from triton_sam.models.sam3_concept import ConceptFamilySpec, concept_family
from triton_sam.models.spec import ModelSpec

TOKENIZER_FILENAME = "tokenizer.json"

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


def wrap_vision(model: nn.Module) -> nn.Module:
    """The ONNX-exportable vision graph of a built ``Sam3Model`` (in eval mode)."""
    return wrappers.ConceptVision(model).eval()


def wrap_text(model: nn.Module) -> nn.Module:
    """The ONNX-exportable text graph of a built ``Sam3Model`` (in eval mode)."""
    return wrappers.ConceptText(model).eval()


def wrap_exemplar(model: nn.Module) -> nn.Module:
    """The ONNX-exportable exemplar (geometry encoder) graph of a built ``Sam3Model``."""
    return wrappers.ConceptExemplars(model).eval()


def wrap_decoder(model: nn.Module) -> nn.Module:
    """The ONNX-exportable decoder graph of a built ``Sam3Model`` (in eval mode).

    Eval mode matters beyond the export: a fresh wrapper is in training mode, the exporter
    restores that mode afterwards, and the DETR dropout (p = 0.1) would then silently change
    every later torch reference run.
    """
    return wrappers.ConceptDecoder(model).eval()
