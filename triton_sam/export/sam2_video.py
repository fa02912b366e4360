"""SAM2.1 video exporter: the official ``SAM2VideoPredictor`` split into five ONNX graphs.

The tracking loop (which memories, which pointers, when to encode a memory) is Python control
flow upstream; it lives in :mod:`triton_sam.serving.tracking.tracker` here, and the graphs are the
tensor work between its decisions (contracts in :mod:`triton_sam.serving.protocol.tracker`):

- ``video_encoder``: ``forward_image`` + ``_prepare_backbone_features`` (no ``no_mem_embed``);
- ``memory_attention``: the official ``MemoryAttention`` layers over a variable number of
  spatial memories (Nm) and object pointers (Np), with the position encodings built in the
  graph (constants + ``maskmem_tpos_enc`` / ``obj_ptr_tpos_proj``);
- ``video_decoder``: ``_forward_sam_heads`` with every branch turned into arithmetic;
- ``memory_encoder``: ``_encode_new_memory`` (sigmoid or binarise, scale, bias, no-object
  embedding by arithmetic);
- ``mask_prompt``: ``_use_mask_as_output``'s object pointer and score.

Each graph is checked against the official torch code path (not against the wrappers), every
mismatching output of every case collected and raised once.

ONNX quirks met, and what was done:

- RoPE: upstream rotates queries/keys with complex tensors (``torch.view_as_complex``), which
  ONNX cannot express. The attention here calls the official projections and rotates with the
  same angles as real (cos, sin) pairs: ``(a + ib)(c + id) = (ac - bd) + i(ad + bc)``.
- ``num_k_exclude_rope`` is a Python int upstream (the tracer would bake it in): spatial
  memories and pointer tokens are separate graph inputs, projected separately and rotated
  only where upstream rotates, then concatenated in upstream's order.
- ``F.interpolate(..., antialias=True)`` needs opset 18's Resize; the one place that needs it
  (a mask prompt's low-res logits) is resampled by the orchestration instead, with torch's
  antialias weights (:mod:`triton_sam.serving.resample`).
- Zeros/-1 padding points are derived from an input (``x * 0``), not ``torch.zeros(B, ...)``,
  which the tracer would fix to the traced batch size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from triton_sam.errors import CheckpointError, ExportError, ExportValidationError
from triton_sam.export import (
    ExportOptions,
    GraphExport,
    batch_axes,
    finish_graph,
    trace_graphs,
    verification,
)
from triton_sam.export.sam2 import predict_all_tokens
from triton_sam.export.wrapper import ModelWrapper
from triton_sam.models.spec import GraphSpec, ModelSpec
from triton_sam.serving.protocol import tracker as protocol
from triton_sam.serving.tracking.config import TrackerConfig

GRAPH_KEYS = tuple(protocol.GRAPHS)
TRACKER_CONFIG_FILENAME = "tracker_config.json"


# -- the official model ---------------------------------------------------------------------
def build_video_model(spec: ModelSpec, checkpoint: Path | None) -> nn.Module:
    """Build the official ``SAM2VideoPredictor`` for ``spec`` on CPU, eval mode.

    Uses ``build_sam2_video_predictor`` with its default post-processing overrides, then sets
    ``fill_hole_area = 0``: its hole filling needs sam2's CUDA extension (not built here), and
    the predictor adds ``++model.fill_hole_area=8`` *after* the caller's overrides, so a hydra
    override cannot turn it off; the attribute can.

    Raises:
        CheckpointError: unreadable checkpoint, or keys that do not match the config.
    """
    from sam2.build_sam import build_sam2_video_predictor

    from triton_sam.export.sam2 import _load_state, _sam2_hydra

    with _sam2_hydra():
        model = build_sam2_video_predictor(spec.upstream_config, ckpt_path=None, device="cpu")
    model.fill_hole_area = 0
    if checkpoint is not None:
        _load_state(model, checkpoint, spec)
    return model.eval()


def tracker_config(model: nn.Module) -> TrackerConfig:
    """The hyperparameters the orchestration needs, read from the built model.

    Raises:
        ExportError: a configuration the orchestration does not reproduce (the message says
            which setting).
    """
    config = TrackerConfig(
        image_size=int(model.image_size),
        num_maskmem=int(model.num_maskmem),
        max_obj_ptrs_in_encoder=int(model.max_obj_ptrs_in_encoder),
        memory_temporal_stride_for_eval=int(model.memory_temporal_stride_for_eval),
        max_cond_frames_in_attn=int(model.max_cond_frames_in_attn),
        only_obj_ptrs_in_the_past_for_eval=bool(model.only_obj_ptrs_in_the_past_for_eval),
        use_signed_tpos_enc_to_obj_ptrs=bool(model.use_signed_tpos_enc_to_obj_ptrs),
        multimask_output_in_sam=bool(model.multimask_output_in_sam),
        multimask_output_for_tracking=bool(model.multimask_output_for_tracking),
        multimask_min_pt_num=int(model.multimask_min_pt_num),
        multimask_max_pt_num=int(model.multimask_max_pt_num),
        use_mask_input_as_output_without_sam=bool(model.use_mask_input_as_output_without_sam),
        add_all_frames_to_correct_as_cond=bool(model.add_all_frames_to_correct_as_cond),
        clear_non_cond_mem_around_input=bool(model.clear_non_cond_mem_around_input),
    )
    unsupported = {
        "directly_add_no_mem_embed": not model.directly_add_no_mem_embed,
        "use_obj_ptrs_in_encoder": not model.use_obj_ptrs_in_encoder,
        "add_tpos_enc_to_obj_ptrs": not model.add_tpos_enc_to_obj_ptrs,
        "pred_obj_scores": not model.pred_obj_scores,
        "use_high_res_features_in_sam": not model.use_high_res_features_in_sam,
        "soft_no_obj_ptr": bool(model.soft_no_obj_ptr),
        "non_overlap_masks": bool(model.non_overlap_masks),
        "non_overlap_masks_for_mem_enc": bool(model.non_overlap_masks_for_mem_enc),
        "fill_hole_area": model.fill_hole_area != 0,
        "hidden_dim": model.hidden_dim != protocol.HIDDEN_DIM,
        "mem_dim": model.mem_dim != protocol.MEM_DIM,
        # upstream's own path for it calls a method SAM2VideoPredictor does not define
        "clear_non_cond_mem_around_input": bool(model.clear_non_cond_mem_around_input),
    }
    bad = [name for name, is_bad in unsupported.items() if is_bad]
    if bad or config.image_size != protocol.IMAGE_SIZE:
        raise ExportError(
            f"model: settings the tracking export does not reproduce: {bad or ['image_size']}"
        )
    return config


# -- wrappers -------------------------------------------------------------------------------
class VideoEncoder(ModelWrapper):
    """image [B,3,1024,1024] -> vision_feats [B,256,64,64], high_res_feats_0/1 (NCHW)."""

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        backbone_out = self.model.forward_image(image)
        _, vision_feats, _, feat_sizes = self.model._prepare_backbone_features(backbone_out)
        batch = image.shape[0]
        # HWxBxC -> BxCxHxW, as _track_step reshapes the high-resolution levels
        feats = [
            feat.permute(1, 2, 0).reshape(batch, -1, h, w)
            for feat, (h, w) in zip(vision_feats, feat_sizes, strict=True)
        ]
        return feats[-1], feats[0], feats[1]


class VideoDecoderGraph(ModelWrapper):
    """``_forward_sam_heads`` with its branches as arithmetic (see protocol.DECODER_*)."""

    def forward(
        self,
        pix_feat: torch.Tensor,
        high_res_feats_0: torch.Tensor,
        high_res_feats_1: torch.Tensor,
        point_coords: torch.Tensor,
        point_labels: torch.Tensor,
        mask_input: torch.Tensor,
        has_mask_input: torch.Tensor,
        multimask_output: torch.Tensor,
        add_no_mem_embed: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        model = self.model
        # 1 * e and 0 * e are exact, so both cases equal upstream's bit for bit.
        no_mem = model.no_mem_embed.reshape(1, -1, 1, 1)
        pix = pix_feat + add_no_mem_embed.reshape(-1, 1, 1, 1) * no_mem
        masks, ious, tokens, scores = predict_all_tokens(
            model.sam_prompt_encoder,
            model.sam_mask_decoder,
            (pix, high_res_feats_0, high_res_feats_1),
            (point_coords, point_labels, mask_input, has_mask_input),
        )
        return _select_outputs(model, masks, ious, tokens, scores, multimask_output)


def _select_outputs(
    model: nn.Module,
    masks: torch.Tensor,
    ious: torch.Tensor,
    tokens: torch.Tensor,
    scores: torch.Tensor,
    multimask_output: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """MaskDecoder.forward's and _forward_sam_heads' selections, for both values of
    ``multimask_output``, chosen per item by ``torch.where``."""
    from sam2.modeling.sam2_base import NO_OBJ_SCORE

    decoder = model.sam_mask_decoder
    batch = masks.shape[0]
    appearing = scores > 0  # [B,1]
    # multimask: tokens 1-3, the best by predicted IoU (gating first, as upstream; it does not
    # change which index wins)
    multi_masks = torch.where(appearing[:, :, None, None], masks[:, 1:], NO_OBJ_SCORE)
    best = torch.argmax(ious[:, 1:], dim=-1, keepdim=True)  # [B,1]
    multi_mask = multi_masks.gather(1, best[:, :, None, None].expand(-1, -1, *masks.shape[-2:]))
    multi_iou = ious[:, 1:].gather(1, best)
    if model.use_multimask_token_for_obj_ptr:
        multi_token = tokens[:, 1:].gather(1, best[:, :, None].expand(-1, -1, tokens.shape[-1]))
    else:
        multi_token = tokens[:, 0:1]
    # single mask: token 0, or the dynamic fallback to the best multimask token
    if decoder.dynamic_multimask_via_stability:
        single_mask, single_iou = decoder._dynamic_multimask_via_stability(masks, ious)
    else:
        single_mask, single_iou = masks[:, 0:1], ious[:, 0:1]
    single_mask = torch.where(appearing[:, :, None, None], single_mask, NO_OBJ_SCORE)
    multi = multimask_output.reshape(batch, 1) > 0.5
    low_res = torch.where(multi[:, :, None, None], multi_mask, single_mask)
    iou = torch.where(multi, multi_iou, single_iou)
    token = torch.where(multi, multi_token[:, 0], tokens[:, 0])
    obj_ptr = _gate_pointer(model, model.obj_ptr_proj(token), appearing.float())
    return low_res, obj_ptr, scores, iou


def _gate_pointer(model: nn.Module, obj_ptr: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """``fixed_no_obj_ptr``: an absent object's pointer is ``no_obj_ptr`` (upstream's two lines)."""
    if model.fixed_no_obj_ptr:
        obj_ptr = lam * obj_ptr
    return obj_ptr + (1 - lam) * model.no_obj_ptr


class MemoryEncoderGraph(ModelWrapper):
    """``_encode_new_memory`` from low-res masks (see protocol.MEMORY_ENCODER_*)."""

    def forward(
        self,
        vision_feats: torch.Tensor,
        low_res_masks: torch.Tensor,
        object_score_logits: torch.Tensor,
        is_mask_from_pts: torch.Tensor,
    ) -> torch.Tensor:
        model = self.model
        size = model.image_size
        high_res = F.interpolate(
            low_res_masks, size=(size, size), mode="bilinear", align_corners=False
        )
        binarize = is_mask_from_pts.reshape(-1, 1, 1, 1) > 0.5
        if not model.binarize_mask_from_pts_for_mem_enc:
            binarize = torch.zeros_like(binarize)
        mask_for_mem = torch.where(binarize, (high_res > 0).float(), torch.sigmoid(high_res))
        if model.sigmoid_scale_for_mem_enc != 1.0:
            mask_for_mem = mask_for_mem * model.sigmoid_scale_for_mem_enc
        if model.sigmoid_bias_for_mem_enc != 0.0:
            mask_for_mem = mask_for_mem + model.sigmoid_bias_for_mem_enc
        out = model.memory_encoder(vision_feats, mask_for_mem, skip_mask_sigmoid=True)
        features = out["vision_features"]
        if model.no_obj_embed_spatial is not None:
            absent = 1 - (object_score_logits > 0).float()
            features = features + absent[..., None, None] * model.no_obj_embed_spatial[
                ..., None, None
            ].expand(*features.shape)
        return features


class MaskPromptGraph(ModelWrapper):
    """``_use_mask_as_output``'s object pointer and score for a binary mask in the input frame."""

    def forward(self, vision_feats: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        model = self.model
        encoder = model.sam_prompt_encoder
        # The high-resolution levels only shape the mask upsampling, whose output this graph
        # drops (the exporter prunes it): any tensor of the right shape will do.
        batch, size = vision_feats.shape[0], model.image_size
        high_res = [
            torch.zeros(batch, 32, size // 4, size // 4),
            torch.zeros(batch, 64, size // 8, size // 8),
        ]
        # Upstream passes no points: one (0, 0) point labelled -1, which the prompt encoder
        # pads with a second one. Built from the input so the batch stays symbolic.
        corner = mask[:, 0, :2, :2] * 0  # [B,2,2] zeros
        sparse = encoder._embed_points(corner, corner[:, :, 0] - 1, pad=False)
        dense = encoder._embed_masks(model.mask_downsample(mask))
        masks, ious, tokens, scores = model.sam_mask_decoder.predict_masks(
            image_embeddings=vision_feats,
            image_pe=encoder.get_dense_pe(),
            sparse_prompt_embeddings=sparse,
            dense_prompt_embeddings=dense,
            repeat_image=False,
            high_res_features=high_res,
        )
        # single-mask output: the pointer comes from token 0, gated by the decoder's score...
        obj_ptr = _gate_pointer(model, model.obj_ptr_proj(tokens[:, 0]), (scores > 0).float())
        # ...then by whether the mask has any pixel, which also sets the score (+-10)
        lam = (mask.flatten(1) > 0).float().amax(dim=1, keepdim=True)
        obj_ptr = _gate_pointer(model, obj_ptr, lam)
        score = protocol.MASK_AS_OUTPUT_SCALE * lam + protocol.MASK_AS_OUTPUT_BIAS
        return obj_ptr, score


# -- export ---------------------------------------------------------------------------------
@dataclass
class VideoExportResult:
    """Paths and figures of one video export.

    Attributes:
        graphs: graph key (``protocol.GRAPHS``) -> path of its ``.onnx``.
        tracker_config: the tracker's hyper-parameters read from the model (not a
            ``config.pbtxt``; ``config`` is its old name).
        seconds: wall time per stage.
        max_abs_error: largest |ORT - torch| per ``graph.output`` over the verification cases.
        tolerance: the tolerance of the check (relative to each output's magnitude).
    """

    graphs: dict[str, Path]
    tracker_config: TrackerConfig
    seconds: dict[str, float] = field(default_factory=dict)
    max_abs_error: dict[str, float] = field(default_factory=dict)
    tolerance: verification.Tolerance | None = None

    @property
    def config(self) -> TrackerConfig:
        """The old name of :attr:`tracker_config`."""
        return self.tracker_config


def export_video(
    spec: ModelSpec,
    checkpoint: Path | None,
    out_dir: Path,
    options: ExportOptions | None = None,
    *,
    graphs: tuple[str, ...] = GRAPH_KEYS,
) -> VideoExportResult:
    """Export the tracking graphs of ``spec`` to ``out_dir/<graph>.onnx`` and check them.

    Args:
        spec: a SAM2.1 variant.
        checkpoint: official-format checkpoint; None exports the random initialisation.
        out_dir: a scratch directory.
        options: opset (17 by default), fp16, verify, seed.
        graphs: which graphs (all by default).

    Raises:
        CheckpointError, ExportError, ExportValidationError (every mismatch of every graph,
        listed once).
    """
    options = options or ExportOptions()
    unknown = set(graphs) - set(GRAPH_KEYS)
    if unknown:
        raise ExportError(f"graphs: unknown {sorted(unknown)}; expected some of {list(GRAPH_KEYS)}")
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    if checkpoint is not None and not Path(checkpoint).is_file():
        raise CheckpointError(f"checkpoint: {checkpoint} not found")
    model = build_video_model(spec, checkpoint)
    hyper = tracker_config(model)  # the tracker's hyper-parameters
    seconds["build"] = time.perf_counter() - t0
    from triton_sam.export.sam2_video_checks import VerificationCases
    from triton_sam.models.sam2_video import video_graphs

    cases = VerificationCases(model, hyper, np.random.default_rng(options.seed))
    tolerance = verification.FP16_TOLERANCE if options.fp16 else verification.FP32_TOLERANCE
    result = VideoExportResult({}, hyper, seconds, tolerance=tolerance)
    declared = {g.role: g for g in video_graphs()}
    traced, checks = [], {}
    for key in graphs:  # every reference before any export, as export_model does
        module, trace_feeds, checks[key] = cases.graph(key)
        traced.append(GraphExport(declared[key], module, trace_feeds, _dynamic_axes(declared[key])))
    result.graphs = trace_graphs(traced, out_dir, options, seconds)
    mismatches: list[str] = []
    for key, path in result.graphs.items():
        finish_graph(path, declared[key], options)  # points bounded: callable past the tracker
        if options.verify:
            t0 = time.perf_counter()
            try:
                errors = verification.verify_graph(path, checks[key], tolerance)
            except ExportValidationError as e:
                mismatches += [f"{key}: {line}" for line in e.mismatches]
            else:
                result.max_abs_error.update({f"{key}.{k}": v for k, v in errors.items()})
            seconds[f"verify_{key}"] = time.perf_counter() - t0
    if mismatches:
        raise ExportValidationError("the SAM2 video graphs", mismatches)
    # the settings the orchestration needs, beside the graphs (OnnxVideoPredictor reads it)
    (out_dir / TRACKER_CONFIG_FILENAME).write_text(hyper.to_json())
    return result


def _dynamic_axes(graph: GraphSpec) -> dict[str, dict[int, str]]:
    """Dim 0 is the batch; every -1 becomes a named dynamic axis (shared names where the
    same count appears in two inputs: Nm for memory/memory_tpos, Np for the pointers)."""
    shared = {"memory": "num_memories", "memory_tpos": "num_memories"}
    shared |= {"obj_ptrs": "num_pointers", "obj_ptr_tpos": "num_pointers"}
    shared |= {"point_coords": "num_points", "point_labels": "num_points"}
    return batch_axes([*graph.inputs, *graph.outputs], shared)


__all__ = ["GRAPH_KEYS", "VideoExportResult", "build_video_model", "export_video", "tracker_config"]
