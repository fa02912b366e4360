"""SAM3 video exporter: transformers' ``Sam3TrackerVideoModel`` split into the tracker's graphs.

The same roles and tensor names as the SAM2.1 export (:mod:`triton_sam.export.sam2_video`;
contracts: ``protocol.graph_contracts`` at SAM3's sizes, ``protocol.SAM3_GRAPHS``), so the one
tracking loop (:mod:`triton_sam.serving.tracking`) serves both; what differs in the loop is
data (``TrackerConfig``, read from the model here):

- ``video_encoder``: ``get_image_features`` (the vision encoder, ``conv_s0``/``conv_s1`` on the
  two high-resolution levels), the three levels as NCHW maps, no ``no_memory_embedding``;
- ``memory_attention``: the model's ``Sam3TrackerVideoMemoryAttention`` layers over Nm spatial
  memories and Np object pointers (each split into hidden/mem_dim tokens, as upstream), the
  position encodings built in the graph (the vision level's sine encoding, the memory
  encoder's, ``memory_temporal_positional_encoding`` and the pointers' projected 1-D sine);
- ``video_decoder``: ``_single_frame_forward`` on memory-conditioned features, both output
  selections by arithmetic (``torch.where``), the pointer gated by the object score;
- ``memory_encoder``: ``_encode_new_memory`` from the low-resolution logits (upsampled to the
  input, then to the memory encoder's 4 x 288 input, as upstream's high-resolution masks go).

- ``mask_prompt``: ``_use_mask_as_output``'s object pointer and score for a binary mask, and
  (an output SAM2.1's graph does not have) the mask's memory: upstream encodes a mask
  prompt's memory from the full-resolution mask, not from low-resolution logits.

The real weights are the gated ``facebook/sam3`` snapshot (a Hugging Face model directory);
:func:`small_config` is a seeded reduced-width model with the same tensor contract.

ONNX notes: RoPE is applied with upstream's real (cos, sin) pair rotation; the keys that
upstream excludes from it (``num_k_exclude_rope``, a Python int) are the pointer tokens, a
separate graph input here, so no count is baked in at trace time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from triton_sam.errors import CheckpointError, ExportError, ExportValidationError
from triton_sam.export import ExportOptions, GraphExport, finish_graph, trace_graphs, verification
from triton_sam.export.sam3_video_graphs import WRAPPERS
from triton_sam.models.sam3_video import video_graphs
from triton_sam.serving.protocol import tracker as protocol
from triton_sam.serving.tracking.config import TrackerConfig

GRAPH_KEYS = protocol.SAM3_GRAPH_KEYS
TRACKER_CONFIG_FILENAME = "tracker_config.json"
# bfloat16 keeps 8 significant bits: rounding moves a value by at most 2^-9 of itself. The
# memory encoder's reference is upstream's stored (bfloat16) memory, so its check allows twice
# that of the tensor's scale at most, and 2^-9 of its rms in rms (the most a rounding of at
# most 2^-9 of each element can give); fp32 noise is far below both.
BF16_TOLERANCE = verification.Tolerance(max_rel=2.0**-8, rms_rel=2.0**-9)


# -- the model ------------------------------------------------------------------------------
def small_config() -> Any:
    """A small random-init ``Sam3TrackerVideoConfig`` with facebook/sam3's tensor contract.

    1008x1008 input, 14-pixel patches, a 256-channel FPN with the real model's four scales (the
    video model drops the last, as upstream), hence 72x72 features and 288x288 masks; memories
    of 64 channels, 7 memory slots, 16 pointers, 4 conditioning frames as the real config. Only
    the ViT (2 layers of width 32), the decoder MLPs, the memory attention (1 layer, FFN 64)
    and the memory fuser (1 layer) are small, so export and parity run in seconds on a CPU.
    """
    from transformers import Sam3TrackerVideoConfig

    return Sam3TrackerVideoConfig(
        vision_config={
            "model_type": "sam3_vision_model",
            "backbone_config": {
                "model_type": "sam3_vit_model",
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "global_attn_indexes": [1],
            },
            "scale_factors": [4.0, 2.0, 1.0, 0.5],
            "backbone_feature_sizes": [[288, 288], [144, 144], [72, 72]],
        },
        mask_decoder_config={"mlp_dim": 64, "iou_head_hidden_dim": 32},
        memory_attention_num_layers=1,
        memory_attention_feed_forward_hidden_size=64,
        memory_fuser_num_layers=1,
        memory_fuser_intermediate_dim=64,
    )


def random_model(seed: int = 0, config: Any = None) -> nn.Module:
    """``Sam3TrackerVideoModel`` of ``config`` (default :func:`small_config`), seeded, eval.

    The learnt embeddings upstream initialises to zero (no-memory, temporal, no-object,
    occlusion) get random values, so a test can see whether each is applied where upstream
    applies it.
    """
    from transformers import Sam3TrackerVideoModel

    torch.manual_seed(seed)
    model = Sam3TrackerVideoModel(config if config is not None else small_config()).eval()
    with torch.no_grad():
        for param in (
            model.no_memory_embedding,
            model.memory_temporal_positional_encoding,
            model.no_object_pointer,
            model.occlusion_spatial_embedding_parameter,
        ):
            param.normal_(std=0.5)
    return model


def save_random_video_checkpoint(path: Path, *, seed: int = 0, config: Any = None) -> Path:
    """Write :func:`random_model` as a model directory (``save_pretrained``), loaded through
    the same path as the ``facebook/sam3`` snapshot (offline tests and demos).

    Raises:
        CheckpointError: ``path`` exists (never overwritten).
    """
    path = Path(path)
    if path.exists():
        raise CheckpointError(f"checkpoint: {path} already exists; not overwriting it")
    tmp = path.with_name(path.name + ".tmp")
    random_model(seed, config).save_pretrained(tmp)
    tmp.replace(path)
    return path


def build_video_model(checkpoint: Path | None, *, seed: int = 0) -> nn.Module:
    """``Sam3TrackerVideoModel`` from a Hugging Face model directory (the ``facebook/sam3``
    snapshot, whose detector weights are ignored as upstream ignores them), or
    :func:`random_model` when ``checkpoint`` is None.

    Raises:
        CheckpointError: not a model directory, or tracker weights missing from it.
    """
    if checkpoint is None:
        return random_model(seed)
    from transformers import Sam3TrackerVideoModel

    checkpoint = Path(checkpoint)
    if not (checkpoint / "config.json").is_file():
        raise CheckpointError(
            f"checkpoint: {checkpoint} is not a Hugging Face model directory (no config.json); "
            "expected the snapshot of facebook/sam3 or a save_pretrained() directory"
        )
    try:
        model, info = Sam3TrackerVideoModel.from_pretrained(checkpoint, output_loading_info=True)
    except Exception as e:  # transformers raises OSError, ValueError, KeyError...
        raise CheckpointError(f"checkpoint: cannot load {checkpoint}: {e}") from e
    missing = sorted(info.get("missing_keys", []))
    if missing:
        raise CheckpointError(
            f"checkpoint: {checkpoint} lacks {len(missing)} tracker weights "
            f"(first: {'; '.join(missing[:3])}); expected Sam3TrackerVideoModel's"
        )
    return model.eval()


def tracker_config(model: nn.Module) -> TrackerConfig:
    """The settings the orchestration needs, read from the built model.

    Raises:
        ExportError: a setting the orchestration does not reproduce (named in the message).
    """
    config = model.config
    feat = int(model.backbone_feature_sizes[-1][0])
    unsupported = {
        "enable_temporal_pos_encoding_for_object_pointers": (
            not config.enable_temporal_pos_encoding_for_object_pointers
        ),
        "num_maskmem": int(config.num_maskmem) < 1,
        "memory_attention_hidden_size": config.memory_attention_hidden_size != model.hidden_dim,
        "image_size": int(config.image_size) != protocol.SAM3_IMAGE_SIZE,
        "feature size": feat != protocol.SAM3_FEAT_SIZE,
    }
    bad = [name for name, is_bad in unsupported.items() if is_bad]
    if bad:
        raise ExportError(f"model: settings the tracking export does not reproduce: {bad}")
    return TrackerConfig(
        image_size=int(config.image_size),
        num_maskmem=int(config.num_maskmem),
        max_obj_ptrs_in_encoder=int(config.max_object_pointers_in_encoder),
        memory_temporal_stride_for_eval=1,  # upstream supports stride 1 only
        max_cond_frames_in_attn=int(config.max_cond_frame_num),
        only_obj_ptrs_in_the_past_for_eval=True,  # upstream's eval behaviour, not a setting
        use_signed_tpos_enc_to_obj_ptrs=True,
        multimask_output_in_sam=bool(config.multimask_output_in_sam),
        multimask_output_for_tracking=bool(config.multimask_output_for_tracking),
        multimask_min_pt_num=int(config.multimask_min_pt_num),
        multimask_max_pt_num=int(config.multimask_max_pt_num),
        use_mask_input_as_output_without_sam=True,
        add_all_frames_to_correct_as_cond=False,
        clear_non_cond_mem_around_input=False,
        feat_size=feat,
        hidden_dim=int(model.hidden_dim),
        mem_dim=int(model.mem_dim),
        preprocessing="sam3",
        forward_on_prompt=True,
        mask_prompt_memory=True,
    )


# -- export ---------------------------------------------------------------------------------
@dataclass
class Sam3VideoExportResult:
    """Paths and figures of one export.

    Attributes:
        graphs: graph key -> ``.onnx`` path.
        tracker_config: the settings read from the model.
        seconds: wall time per stage.
        max_abs_error: largest |ORT - upstream| per ``graph.output`` over the cases.
    """

    graphs: dict[str, Path]
    tracker_config: TrackerConfig
    seconds: dict[str, float] = field(default_factory=dict)
    max_abs_error: dict[str, float] = field(default_factory=dict)


def export_sam3_video(
    model: nn.Module, out_dir: Path, options: ExportOptions | None = None
) -> Sam3VideoExportResult:
    """Export ``model``'s tracking graphs to ``out_dir/<graph>.onnx``, check each against
    upstream's own code path (:mod:`.sam3_video_checks`) and write ``tracker_config.json``.

    Args:
        model: a built ``Sam3TrackerVideoModel`` (:func:`build_video_model`).
        out_dir: a directory.
        options: opset, verify, seed (fp16 is refused: not verified for this family).

    Raises:
        ExportError: an unsupported setting; ExportValidationError: every mismatch, once.
    """
    from triton_sam.export.sam3_video_checks import verification_cases

    options = options or ExportOptions()
    if options.fp16:
        raise ExportError("fp16: the SAM3 video graphs are exported in fp32 only")
    seconds: dict[str, float] = {}
    hyper = tracker_config(model)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    declared = {g.role: g for g in video_graphs()}
    t0 = time.perf_counter()
    cases = verification_cases(model, hyper, np.random.default_rng(options.seed))
    seconds["references"] = time.perf_counter() - t0
    shared = {"memory": "num_memories", "memory_tpos": "num_memories"}
    shared |= {"obj_ptrs": "num_pointers", "obj_ptr_tpos": "num_pointers"}
    shared |= {"point_coords": "num_points", "point_labels": "num_points"}
    from triton_sam.export import batch_axes

    traced = []
    for key in GRAPH_KEYS:
        graph = declared[key]
        axes = batch_axes([*graph.inputs, *graph.outputs], shared)
        traced.append(GraphExport(graph, WRAPPERS[key](model).eval(), cases[key][-1][1], axes))
    paths = trace_graphs(traced, out_dir, options, seconds)
    result = Sam3VideoExportResult(paths, hyper, seconds)
    mismatches: list[str] = []
    for key, path in paths.items():
        finish_graph(path, declared[key], options)
        if not options.verify:
            continue
        t0 = time.perf_counter()
        for tolerance, graph_cases in _by_tolerance(cases[key]):
            try:
                errors = verification.verify_graph(path, graph_cases, tolerance)
            except ExportValidationError as e:
                mismatches += [f"{key}: {line}" for line in e.mismatches]
            else:
                result.max_abs_error.update({f"{key}.{k}": v for k, v in errors.items()})
        seconds[f"verify_{key}"] = time.perf_counter() - t0
    if mismatches:
        raise ExportValidationError("the SAM3 video graphs", mismatches)
    (out_dir / TRACKER_CONFIG_FILENAME).write_text(hyper.to_json())
    return result


def _by_tolerance(cases: list) -> list[tuple[verification.Tolerance, list]]:
    """The cases split by the tolerance each output is checked with: a memory
    (``maskmem_features``) against upstream's stored bfloat16 memory, the rest in fp32."""
    memory, rest = [], []
    for label, feeds, expected in cases:
        bf16 = {k: v for k, v in expected.items() if k == "maskmem_features"}
        fp32 = {k: v for k, v in expected.items() if k != "maskmem_features"}
        if bf16:
            memory.append((label, feeds, bf16))
        if fp32:
            rest.append((label, feeds, fp32))
    pairs = [(verification.FP32_TOLERANCE, rest), (BF16_TOLERANCE, memory)]
    return [(tolerance, group) for tolerance, group in pairs if group]


__all__ = [
    "GRAPH_KEYS",
    "Sam3VideoExportResult",
    "build_video_model",
    "export_sam3_video",
    "random_model",
    "save_random_video_checkpoint",
    "small_config",
    "tracker_config",
    "video_graphs",
]
