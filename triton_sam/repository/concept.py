"""Repository entries of a concept family: four ONNX graphs and the ``sam3_concept`` model.

- ``<family>_vision`` serves like an encoder (batch = images, the encoder's queue bounds);
- ``<family>_text`` like a decoder, with room for every phrase of a request in one batch;
- ``<family>_exemplar`` one image per call (upstream's ``roi_align`` call unrolls the
  traced batch, see ``sam3_concept_wrappers.ConceptExemplars``), the decoder's queue bounds;
- ``<family>_decoder`` like an encoder: it is heavy per image (each of its items is one image
  with its phrases; 66 MB of mask logits per phrase inside the graph at any width);
- ``<family>`` (the serving model, python backend in both targets): one instance (its caches
  live in it), ``KIND_GPU`` on GPU 0 when the graphs run on GPUs so image features stay in
  device memory, else ``KIND_CPU``. Its files are ``serving/concept_model.py`` as ``model.py``,
  the dependency-free ``triton_sam.serving`` modules as the package ``triton_sam_serving``
  and the checkpoint's ``tokenizer.json``.

All five are written as one atomic set (:func:`triton_sam.repository.writer.write_models`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_sam.models.sam3_concept import ConceptFamilySpec
from triton_sam.models.spec import TensorSpec
from triton_sam.repository import config as cfg
from triton_sam.repository.checks import check_int, check_model_name
from triton_sam.repository.shipping import shipped_files
from triton_sam.repository.writer import (
    SERVING_DIR,
    ModelFiles,
    graph_artifacts,
    write_models,
)
from triton_sam.serving.protocol import concept as protocol

SERVING_SOURCE = SERVING_DIR / "concept_model.py"


@dataclass(frozen=True)
class ConceptOptions:
    """Bounds of the ``sam3_concept`` serving model.

    Attributes:
        max_images: images whose features are kept (LRU beyond). At width 256 one image's
            three feature levels take 106 MiB in fp32 (width 64: 27 MiB).
        max_bytes: bound on the kept features in bytes (0 = only ``max_images``).
        max_phrases_cached: phrases whose text features are kept (32 x width floats each).
        max_phrases: phrases one request may carry.
        phrases_per_decode: phrases per decoder call; a request's calls run concurrently.
            Bounds the decoder's memory: 66 MB of mask logits per phrase inside the graph.
        max_image_pixels: largest image (H x W) accepted; masks are resized to it.
        max_exemplars: exemplars kept for later requests' ``exemplar_ids`` (LRU beyond, fair
            between tenants); each is (boxes + 1) x width floats (17 KiB for 16 boxes at
            width 256).
        max_boxes: exemplar boxes one request may carry.
    """

    max_images: int = 8
    max_bytes: int = 2 * 2**30
    max_phrases_cached: int = 1024
    max_phrases: int = protocol.MAX_PHRASES
    phrases_per_decode: int = 4
    max_image_pixels: int = protocol.MAX_IMAGE_PIXELS
    max_exemplars: int = 256
    max_boxes: int = protocol.MAX_BOXES

    def __post_init__(self) -> None:
        counts = ("max_images", "max_phrases_cached", "max_phrases", "phrases_per_decode")
        for name in (*counts, "max_exemplars", "max_boxes"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("max_bytes", self.max_bytes, minimum=0)
        check_int("max_image_pixels", self.max_image_pixels, minimum=1)


def graph_configs(
    family: ConceptFamilySpec, options: cfg.RepositoryOptions, concept: ConceptOptions
) -> dict[str, cfg.ModelConfig]:
    """Configs of the four graphs, by role (bounds per ``GraphSpec.batching``; the exemplar
    graph, which has none, takes one image per call)."""
    _, queue, timeout = options.bounds("decoder")
    one_image = {"max_batch_size": 1, "max_queue_size": queue, "queue_timeout_us": timeout}
    configs = {
        g.role: cfg.graph_config(g, options, **({} if g.batching else one_image))
        for g in family.graphs
    }
    # Every phrase of a request fits in one text batch.
    text = configs["text"]
    text.max_batch_size = max(text.max_batch_size, concept.max_phrases)
    return configs


def build_serving_config(
    family: ConceptFamilySpec,
    options: cfg.RepositoryOptions,
    concept: ConceptOptions,
    *,
    pad_token_id: int,
) -> cfg.ModelConfig:
    """The serving model's config: the protocol's tensors, one instance, BLS parameters.

    Raises:
        InputValidationError: a bad model name.
    """
    check_model_name(family.serving_model)
    config = cfg.ModelConfig(
        name=family.serving_model, backend="python", max_batch_size=options.encoder_max_batch_size
    )
    size = family.mask_size
    inputs = (
        TensorSpec(protocol.IMAGE, "uint8", (-1, -1, 3)),
        TensorSpec(protocol.IMAGE_ID, "bytes", (1,)),
        TensorSpec(protocol.TEXT, "bytes", (-1,)),
        TensorSpec(protocol.THRESHOLD, "float32", (1,)),
        TensorSpec(protocol.MASK_THRESHOLD, "float32", (1,)),
        TensorSpec(protocol.MAX_INSTANCES, "int32", (1,)),
        TensorSpec(protocol.EXEMPLAR_BOXES, "float32", (-1, 4)),
        TensorSpec(protocol.EXEMPLAR_LABELS, "int32", (-1,)),
        TensorSpec(protocol.EXEMPLAR_IDS, "bytes", (-1,)),
    )
    for spec in inputs:  # all optional: see the protocol (embed, probe, predict)
        message = _io(spec, cfg.model_config_pb2.ModelInput)
        message.optional = True
        config.input.append(message)
    outputs = (
        TensorSpec(protocol.IMAGE_ID, "bytes", (1,)),
        TensorSpec(protocol.IMAGE_SIZE, "int32", (2,)),
        TensorSpec(protocol.ENCODED, "int32", (1,)),
        TensorSpec(protocol.EXEMPLAR_ID, "bytes", (1,)),
        TensorSpec(protocol.PRESENCE, "float32", (-1,)),
        TensorSpec(protocol.NUM_INSTANCES, "int32", (-1,)),
        TensorSpec(protocol.PHRASE_INDEX, "int32", (-1,)),
        TensorSpec(protocol.QUERY_INDEX, "int32", (-1,)),
        TensorSpec(protocol.SCORES, "float32", (-1,)),
        TensorSpec(protocol.BOXES, "float32", (-1, 4)),
        TensorSpec(protocol.MASKS_RLE, "bytes", (-1,)),
        TensorSpec(protocol.MASKS_PNG, "bytes", (-1,)),
        TensorSpec(protocol.MASKS_LOGITS, "float32", (-1, size, size)),
    )
    config.output.extend(_io(t, cfg.model_config_pb2.ModelOutput) for t in outputs)
    group = config.instance_group.add(count=1)
    if options.kind == "gpu":
        group.kind = cfg.model_config_pb2.ModelInstanceGroup.KIND_GPU
        group.gpus.append(0)  # one instance in total: one cache
    else:
        group.kind = cfg.model_config_pb2.ModelInstanceGroup.KIND_CPU
    config.dynamic_batching.max_queue_delay_microseconds = options.max_queue_delay_us
    served = protocol.ConceptSettings(
        vision_model=family.vision.model,
        text_model=family.text.model,
        decoder_model=family.decoder.model,
        feature_names=tuple(family.feature_names),
        feature_bytes=feature_bytes(family),
        pad_token_id=int(pad_token_id),
        num_queries=family.num_queries,
        max_images=concept.max_images,
        max_bytes=concept.max_bytes,
        max_phrases_cached=concept.max_phrases_cached,
        max_phrases=concept.max_phrases,
        phrases_per_decode=concept.phrases_per_decode,
        max_image_pixels=concept.max_image_pixels,
        exemplar_model=family.exemplar.model,
        max_exemplars=concept.max_exemplars,
        max_boxes=concept.max_boxes,
    )
    cfg.set_parameters(config, served, kind=protocol.KIND)
    return config


def feature_bytes(family: ConceptFamilySpec) -> int:
    """Bytes of one image's vision features (fp32), as the serving model keeps them."""
    return sum(4 * math.prod(t.shape) for t in family.vision.outputs)


def serving_files(tokenizer: Path) -> dict[str, Path]:
    """What goes into the serving model's version directory."""
    files = {"model.py": SERVING_SOURCE, protocol.TOKENIZER_FILE: Path(tokenizer)}
    return files | shipped_files(SERVING_SOURCE)


def concept_artifacts(
    family: ConceptFamilySpec,
    *,
    graphs: dict[str, Path],
    tokenizer: Path,
    pad_token_id: int,
    options: cfg.RepositoryOptions,
    concept: ConceptOptions | None = None,
) -> list[ModelFiles]:
    """The four graphs and the serving model, as artifacts of one build.

    Args:
        family: the concept family (names, tensors).
        graphs: role (``"vision"``, ``"text"``, ``"exemplar"``, ``"decoder"``) -> exported
            ``.onnx``.
        tokenizer: the ``tokenizer.json`` to ship; pad_token_id: its padding id.
        options: target and serving options of the repository.
        concept: bounds of the serving model.

    Raises:
        RepositoryError / InputValidationError: as ``writer.graph_artifacts``.
    """
    concept = concept or ConceptOptions()
    configs = graph_configs(family, options, concept)
    models = graph_artifacts(family.graphs, graphs, options, configs=configs)
    serving = build_serving_config(family, options, concept, pad_token_id=pad_token_id)
    models.append(ModelFiles(serving.name, cfg.config_to_text(serving), serving_files(tokenizer)))
    return models


def write_concept_models(
    repo_dir: str | os.PathLike[str], family: ConceptFamilySpec, **build: Any
) -> list[str]:
    """Write :func:`concept_artifacts` (same keyword arguments) as one atomic set.

    Returns:
        The model names written: vision, text, exemplar, decoder, serving model.

    Raises:
        RepositoryError / InputValidationError: as ``writer.write_models``.
    """
    artifacts = concept_artifacts(family, **build)
    return [path.name for path in write_models(repo_dir, artifacts)]


def _io(spec: TensorSpec, message: type) -> object:
    # BYTES tensors are Triton's TYPE_STRING (numpy object arrays of bytes).
    if spec.dtype == "bytes":
        return message(
            name=spec.name, data_type=cfg.model_config_pb2.TYPE_STRING, dims=list(spec.shape)
        )
    return cfg.tensor_message(spec, message)
