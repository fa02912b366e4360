"""SAM2.1 video exporter: the official ``SAM2VideoPredictor`` split into five ONNX graphs.

The tracking loop (which memories, which pointers, when to encode a memory) is Python control
flow upstream; it lives in :mod:`triton_sam.tracking.tracker` here, and the graphs are the
tensor work between its decisions (contracts in :mod:`triton_sam.tracking.protocol`):

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
  antialias weights (:mod:`triton_sam.tracking.resample`).
- Zeros/-1 padding points are derived from an input (``x * 0``), not ``torch.zeros(B, ...)``,
  which the tracer would fix to the traced batch size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from triton_sam.errors import CheckpointError, ExportError, ExportValidationError
from triton_sam.export import ExportOptions, onnx_utils
from triton_sam.models.spec import ModelSpec, TensorSpec
from triton_sam.tracking import protocol
from triton_sam.tracking.config import TrackerConfig

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
class VideoEncoder(nn.Module):
    """image [B,3,1024,1024] -> vision_feats [B,256,64,64], high_res_feats_0/1 (NCHW)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

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


def _rope_tables(attention: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [tokens, head_dim/2] of an official RoPEAttention's complex freqs_cis."""
    freqs = attention.freqs_cis.to("cpu")
    return freqs.real.contiguous().float(), freqs.imag.contiguous().float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Upstream's ``apply_rotary_enc`` in real arithmetic.

    ``x`` [..., T*R, D] with consecutive (even, odd) channels as (real, imag) pairs; the T
    token positions of ``cos``/``sin`` [T, D/2] repeat R times along the tokens (a key of R
    memory frames, ``repeat_freqs_k``).
    """
    shape = x.shape
    pairs = x.reshape(*shape[:-2], -1, cos.shape[0], shape[-1] // 2, 2)
    real, imag = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return rotated.reshape(shape)


def _heads(attention: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``Attention._separate_heads`` with the channel count as a constant: upstream's traced
    ``c // num_heads`` exports as a -1 dim, which onnxruntime cannot resolve for the
    zero-token key of a frame with no object pointer."""
    heads = attention.num_heads
    x = x.reshape(x.shape[0], x.shape[1], heads, attention.internal_dim // heads)
    return x.transpose(1, 2)


class _RopeAttention(nn.Module):
    """An official ``RoPEAttention`` (its own projections) with real-valued rotation.

    Keys come in two parts: ``k_rope`` (spatial memory, rotated, positions repeating every
    ``cos.shape[0]`` tokens) and ``k_plain`` (object-pointer tokens, not rotated: upstream's
    ``num_k_exclude_rope``).
    """

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.attn = attention

    def forward(
        self,
        rope: tuple[torch.Tensor, torch.Tensor],
        q: torch.Tensor,
        k_rope: torch.Tensor,
        v_rope: torch.Tensor,
        k_plain: torch.Tensor | None = None,
        v_plain: torch.Tensor | None = None,
    ) -> torch.Tensor:
        a = self.attn
        q = _rotate(_heads(a, a.q_proj(q)), *rope)
        k = _rotate(_heads(a, a.k_proj(k_rope)), *rope)
        v = _heads(a, a.v_proj(v_rope))
        if k_plain is not None:
            k = torch.cat([k, _heads(a, a.k_proj(k_plain))], dim=-2)
            v = torch.cat([v, _heads(a, a.v_proj(v_plain))], dim=-2)
        out = F.scaled_dot_product_attention(q, k, v)
        return a.out_proj(a._recombine_heads(out))


class _RopeTables(nn.Module):
    """One (cos, sin) pair per distinct RoPE table of the layers, as persistent buffers:
    the tracer turns those into one shared initializer each, where a non-persistent buffer
    becomes a 2 MiB constant at every use (145 MB of graph for SAM2.1-tiny instead of 29)."""

    def __init__(self, attentions: list[nn.Module]) -> None:
        super().__init__()
        self.index: list[int] = []
        tables: list[tuple[torch.Tensor, torch.Tensor]] = []
        for attention in attentions:
            cos, sin = _rope_tables(attention)
            match = [
                i for i, (c, s) in enumerate(tables) if torch.equal(c, cos) and torch.equal(s, sin)
            ]
            if not match:
                tables.append((cos, sin))
                self.register_buffer(f"cos{len(tables) - 1}", cos)
                self.register_buffer(f"sin{len(tables) - 1}", sin)
            self.index.append(match[0] if match else len(tables) - 1)

    def get(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.index[i]
        return getattr(self, f"cos{n}"), getattr(self, f"sin{n}")


class MemoryAttentionGraph(nn.Module):
    """The official ``MemoryAttention`` over Nm memories and Np object pointers.

    Inputs (B = objects or batched requests):
        vision_feats [B,256,64,64]: the frame's raw lowest-level features;
        memory [B,Nm,64,64,64]: stored ``maskmem_features`` (conditioning frames first, then
            the recent frames, upstream's order); memory_tpos [B,Nm] int64: their t_pos;
        obj_ptrs [B,Np,256]; obj_ptr_tpos [B,Np]: temporal offsets / (max pointers - 1).
    Output: pix_feat [B,256,64,64], the memory-conditioned features.
    """

    def __init__(self, model: nn.Module, curr_pos: torch.Tensor, maskmem_pos: torch.Tensor):
        super().__init__()
        self.attention = model.memory_attention
        if not self.attention.batch_first:
            raise ExportError("memory_attention: only batch_first=True is exported")
        self.layers = nn.ModuleList()
        attentions = []
        for layer in self.attention.layers:
            if layer.pos_enc_at_attn or layer.pos_enc_at_cross_attn_queries:
                raise ExportError("memory_attention: query position encodings are not exported")
            attentions += [layer.self_attn, layer.cross_attn_image]
            self.layers.append(nn.ModuleList([_RopeAttention(a) for a in attentions[-2:]]))
        self.rope = _RopeTables(attentions)
        self.num_maskmem = model.num_maskmem
        self.maskmem_tpos_enc = model.maskmem_tpos_enc
        self.obj_ptr_tpos_proj = model.obj_ptr_tpos_proj
        self.hidden_dim, self.mem_dim = model.hidden_dim, model.mem_dim
        # Constants of the feature-map size (PositionEmbeddingSine ignores values), taken from
        # a real forward at export time; the verification checks them against fresh ones.
        self.register_buffer("curr_pos", curr_pos.flatten(2).transpose(1, 2))
        self.register_buffer("maskmem_pos", maskmem_pos.flatten(2).transpose(1, 2))

    def forward(
        self,
        vision_feats: torch.Tensor,
        memory: torch.Tensor,
        memory_tpos: torch.Tensor,
        obj_ptrs: torch.Tensor,
        obj_ptr_tpos: torch.Tensor,
    ) -> torch.Tensor:
        from sam2.modeling.sam2_utils import get_1d_sine_pe

        batch, channels, height, width = vision_feats.shape
        mem_dim = self.mem_dim
        # spatial memory [B,Nm,Cm,H,W] -> [B,Nm*HW,Cm]; position = constant + tpos embedding
        spatial = memory.flatten(3).transpose(2, 3).reshape(batch, -1, mem_dim)
        tpos = self.maskmem_tpos_enc.reshape(self.num_maskmem, mem_dim)[
            self.num_maskmem - 1 - memory_tpos
        ]
        spatial_pos = (self.maskmem_pos.unsqueeze(1) + tpos.unsqueeze(2)).reshape(
            batch, -1, mem_dim
        )
        # pointers [B,Np,C] -> [B,Np*(C/Cm),Cm] tokens, each pointer's position repeated
        split = self.hidden_dim // mem_dim
        ptr_tokens = obj_ptrs.reshape(batch, -1, mem_dim)
        ptr_pos = self.obj_ptr_tpos_proj(get_1d_sine_pe(obj_ptr_tpos, dim=self.hidden_dim))
        ptr_pos = ptr_pos.unsqueeze(2).expand(-1, -1, split, -1).reshape(batch, -1, mem_dim)

        output = vision_feats.flatten(2).transpose(1, 2)  # [B,HW,C]
        if self.attention.pos_enc_at_input:
            output = output + 0.1 * self.curr_pos
        for i, (layer, (self_attn, cross_attn)) in enumerate(
            zip(self.attention.layers, self.layers, strict=True)
        ):
            tgt2 = layer.norm1(output)
            output = output + layer.dropout1(self_attn(self.rope.get(2 * i), tgt2, tgt2, tgt2))
            tgt2 = layer.norm2(output)
            keys_pos = layer.pos_enc_at_cross_attn_keys
            output = output + layer.dropout2(
                cross_attn(
                    self.rope.get(2 * i + 1),
                    tgt2,
                    spatial + spatial_pos if keys_pos else spatial,
                    spatial,
                    ptr_tokens + ptr_pos if keys_pos else ptr_tokens,
                    ptr_tokens,
                )
            )
            tgt2 = layer.norm3(output)
            tgt2 = layer.linear2(layer.dropout(layer.activation(layer.linear1(tgt2))))
            output = output + layer.dropout3(tgt2)
        output = self.attention.norm(output)
        return output.transpose(1, 2).reshape(batch, channels, height, width)


class VideoDecoderGraph(nn.Module):
    """``_forward_sam_heads`` with its branches as arithmetic (see protocol.DECODER_*)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.prompt_encoder = model.sam_prompt_encoder
        self.mask_decoder = model.sam_mask_decoder

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
        sparse = self.prompt_encoder._embed_points(point_coords, point_labels, pad=False)
        has_mask = has_mask_input.reshape(-1, 1, 1, 1)
        no_mask = self.prompt_encoder.no_mask_embed.weight.reshape(1, -1, 1, 1)
        dense = has_mask * self.prompt_encoder._embed_masks(mask_input) + (1 - has_mask) * no_mask
        masks, ious, tokens, scores = self.mask_decoder.predict_masks(
            image_embeddings=pix,
            image_pe=self.prompt_encoder.get_dense_pe(),
            sparse_prompt_embeddings=sparse,
            dense_prompt_embeddings=dense,
            repeat_image=False,
            high_res_features=[high_res_feats_0, high_res_feats_1],
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


class MemoryEncoderGraph(nn.Module):
    """``_encode_new_memory`` from low-res masks (see protocol.MEMORY_ENCODER_*)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

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


class MaskPromptGraph(nn.Module):
    """``_use_mask_as_output``'s object pointer and score for a binary mask in the input frame."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

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
        config: the tracker hyperparameters read from the model.
        seconds: wall time per stage.
        max_abs_error: largest |ORT - torch| per ``graph.output`` over the verification cases.
        tolerance: the (atol, rtol) of the check.
    """

    graphs: dict[str, Path]
    config: TrackerConfig
    seconds: dict[str, float] = field(default_factory=dict)
    max_abs_error: dict[str, float] = field(default_factory=dict)
    tolerance: tuple[float, float] = (0.0, 0.0)


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
    config = tracker_config(model)
    seconds["build"] = time.perf_counter() - t0
    cases = _Cases(model, config, np.random.default_rng(options.seed))
    tolerance = onnx_utils.FP16_TOLERANCE if options.fp16 else onnx_utils.FP32_TOLERANCE
    result = VideoExportResult({}, config, seconds, tolerance=(tolerance.atol, tolerance.rtol))
    mismatches: list[str] = []
    for key in graphs:
        module, trace_feeds, checks = cases.graph(key)
        inputs, outputs = protocol.GRAPHS[key]
        t0 = time.perf_counter()
        path = onnx_utils.export_graph(
            module,
            tuple(torch.from_numpy(trace_feeds[name]) for name, _, _ in inputs),
            out_dir / f"{key}.onnx",
            input_names=[name for name, _, _ in inputs],
            output_names=[name for name, _, _ in outputs],
            dynamic_axes=_dynamic_axes(inputs + outputs),
            opset=options.opset,
            external_data=options.external_data,
        )
        onnx_utils.set_output_dims(path, [TensorSpec(*t) for t in outputs])
        seconds[f"export_{key}"] = time.perf_counter() - t0
        if options.fp16:
            onnx_utils.convert_to_fp16(path)
        result.graphs[key] = path
        if options.verify:
            t0 = time.perf_counter()
            try:
                errors = onnx_utils.verify_graph(path, checks, tolerance)
            except ExportValidationError as e:
                mismatches += [f"{key}: {line}" for line in e.mismatches]
            else:
                result.max_abs_error.update({f"{key}.{k}": v for k, v in errors.items()})
            seconds[f"verify_{key}"] = time.perf_counter() - t0
    if mismatches:
        raise ExportValidationError("the SAM2 video graphs", mismatches)
    # the settings the orchestration needs, beside the graphs (OnnxVideoPredictor reads it)
    (out_dir / TRACKER_CONFIG_FILENAME).write_text(config.to_json())
    return result


def _dynamic_axes(tensors: tuple[protocol.TensorContract, ...]) -> dict[str, dict[int, str]]:
    """Dim 0 is the batch; every -1 becomes a named dynamic axis (shared names where the
    same count appears in two inputs: Nm for memory/memory_tpos, Np for the pointers)."""
    shared = {"memory": "num_memories", "memory_tpos": "num_memories"}
    shared |= {"obj_ptrs": "num_pointers", "obj_ptr_tpos": "num_pointers"}
    shared |= {"point_coords": "num_points", "point_labels": "num_points"}
    axes: dict[str, dict[int, str]] = {}
    for name, _, shape in tensors:
        axes[name] = {0: "batch"}
        for i, d in enumerate(shape):
            if d == -1:
                axes[name][i + 1] = shared.get(name, f"{name}_dim{i + 1}")
    return axes


Case = tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]


class _Cases:
    """Trace inputs and verification cases per graph, each expected output computed by the
    official torch code path of SAM2Base / SAM2VideoPredictor."""

    def __init__(self, model: nn.Module, config: TrackerConfig, rng: np.random.Generator):
        self.model, self.config, self.rng = model, config, rng
        size = model.image_size
        image = torch.from_numpy(rng.standard_normal((2, 3, size, size)).astype(np.float32))
        with torch.no_grad():
            backbone = model.forward_image(image)
            _, vision, pos, sizes = model._prepare_backbone_features(backbone)
        self.feat_sizes = sizes
        self.vision = [v.detach() for v in vision]  # HWxBxC, upstream's layout
        self.curr_pos = pos[-1][:, :1].permute(1, 2, 0).reshape(1, -1, *sizes[-1]).detach()
        with torch.no_grad():
            self.maskmem_pos = model.memory_encoder.position_encoding(
                torch.zeros(1, model.mem_dim, *sizes[-1])
            ).detach()
        self.nchw = [
            v.permute(1, 2, 0).reshape(v.shape[1], -1, *s).numpy()
            for v, s in zip(self.vision, sizes, strict=True)
        ]

    def graph(self, key: str) -> tuple[nn.Module, dict[str, np.ndarray], list[Case]]:
        return getattr(self, f"_{key}")()

    # -- per graph ---------------------------------------------------------------------------
    def _video_encoder(self):
        image = self.rng.standard_normal((2, 3, self.model.image_size, self.model.image_size))
        image = image.astype(np.float32)
        with torch.no_grad():
            backbone = self.model.forward_image(torch.from_numpy(image))
            _, vision, pos, sizes = self.model._prepare_backbone_features(backbone)
        expected = {
            name: v.permute(1, 2, 0).reshape(2, -1, *s).numpy()
            for name, v, s in zip(
                ("high_res_feats_0", "high_res_feats_1", "vision_feats"), vision, sizes, strict=True
            )
        }
        # The memory attention graph bakes the position encoding in: prove it is a constant.
        baked = self.curr_pos.flatten(2)
        fresh = pos[-1][:, 1:2].permute(1, 2, 0).reshape(1, -1, baked.shape[-1])
        if not torch.equal(baked, fresh):
            raise ExportError("video_encoder: the position encoding depends on the image")
        return (
            VideoEncoder(self.model).eval(),
            {"image": image},
            [("batch=2", {"image": image}, expected)],
        )

    def _memory_attention(self):
        module = MemoryAttentionGraph(self.model, self.curr_pos, self.maskmem_pos).eval()
        cases = [
            self._memory_case("cond only, 1 pointer", frame=1, cond=(0,), non_cond=()),
            self._memory_case("7 memories, 7 pointers", frame=7, cond=(0,), non_cond=range(1, 7)),
            self._memory_case(
                "reverse, 2 cond frames", frame=3, cond=(9, 0), non_cond=(4, 5, 6), reverse=True
            ),
            self._memory_case("no pointer", frame=3, cond=(5,), non_cond=()),
        ]
        # Nm = 2 != Np = 3, so no two dynamic dims are traced as equal
        trace = self._memory_case("trace", frame=9, cond=(0,), non_cond=(1, 8), batch=2)[1]
        return module, trace, cases

    def _memory_case(self, label, *, frame, cond, non_cond, reverse=False, batch=1) -> Case:
        """Feeds from the orchestration's selection, expected from the official
        ``_prepare_memory_conditioned_features`` on an equivalent output_dict."""
        from triton_sam.tracking.memory import select_memories

        num_frames = 10
        outputs: dict[str, dict[int, dict[str, Any]]] = {
            "cond_frame_outputs": {},
            "non_cond_frame_outputs": {},
        }
        bank = {"cond_frame_outputs": {}, "non_cond_frame_outputs": {}}
        for kind, frames in (("cond_frame_outputs", cond), ("non_cond_frame_outputs", non_cond)):
            for t in frames:
                feats = self.rng.standard_normal((batch, self.model.mem_dim, 64, 64)) * 0.5
                ptr = self.rng.standard_normal((batch, self.model.hidden_dim))
                feats, ptr = feats.astype(np.float32), ptr.astype(np.float32)
                outputs[kind][t] = {
                    "maskmem_features": torch.from_numpy(feats),
                    "maskmem_pos_enc": [self.maskmem_pos.expand(batch, -1, -1, -1)],
                    "obj_ptr": torch.from_numpy(ptr),
                }
                bank[kind][t] = (feats, ptr)
        selection = select_memories(
            self.config,
            frame,
            bank["cond_frame_outputs"],
            bank["non_cond_frame_outputs"],
            num_frames,
            reverse=reverse,
        )
        feeds = {
            "vision_feats": np.ascontiguousarray(self.nchw[-1][:batch]),
            "memory": np.stack([m[0] for m in selection.memories], axis=1),
            "memory_tpos": np.tile(np.array(selection.memory_tpos, np.int64), (batch, 1)),
            "obj_ptrs": np.stack([p[1] for p in selection.pointers], axis=1)
            if selection.pointers
            else np.zeros((batch, 0, self.model.hidden_dim), np.float32),
            "obj_ptr_tpos": np.tile(selection.pointer_tpos, (batch, 1)),
        }
        with torch.no_grad():
            expected = self.model._prepare_memory_conditioned_features(
                frame_idx=frame,
                is_init_cond_frame=False,
                current_vision_feats=[self.vision[-1][:, :batch]],
                current_vision_pos_embeds=[
                    self.curr_pos.flatten(2).permute(2, 0, 1).expand(-1, batch, -1)
                ],
                feat_sizes=self.feat_sizes[-1:],
                output_dict=outputs,
                num_frames=num_frames,
                track_in_reverse=reverse,
            )
        return label, feeds, {"pix_feat": expected.numpy()}

    def _video_decoder(self):
        cases = [
            self._decoder_case("first click, multimask", [[1]], multimask=1, no_mem=1),
            self._decoder_case("box + click, single", [[2, 3, 1]], multimask=0, no_mem=1),
            self._decoder_case("tracking", [[]], multimask=1, no_mem=0, pads=2),
            self._decoder_case("correction + mask", [[1, 0]], multimask=0, no_mem=0, mask=True),
        ]
        trace = self._decoder_case("trace", [[2, 3, 1], [1, 0, 1]], multimask=0, no_mem=0)[1]
        trace["multimask_output"][1] = 1
        trace["has_mask_input"][0] = 1
        return VideoDecoderGraph(self.model).eval(), trace, cases

    def _decoder_case(self, label, labels, *, multimask, no_mem, pads=1, mask=False) -> Case:
        batch = len(labels)
        rows = [row + [-1] * pads for row in labels]
        point_labels = np.array(rows, np.float32)
        coords = self.rng.uniform(0, self.model.image_size, (*point_labels.shape, 2))
        coords = coords.astype(np.float32)
        coords[point_labels == -1] = 0.0
        pix = self.nchw[-1][:batch]
        mask_input = (self.rng.standard_normal((batch, 1, 256, 256)) * 8).astype(np.float32)
        feeds = {
            "pix_feat": np.ascontiguousarray(pix),
            "high_res_feats_0": np.ascontiguousarray(self.nchw[0][:batch]),
            "high_res_feats_1": np.ascontiguousarray(self.nchw[1][:batch]),
            "point_coords": coords,
            "point_labels": point_labels,
            "mask_input": mask_input,
            "has_mask_input": np.full((batch, 1), float(mask), np.float32),
            "multimask_output": np.full((batch, 1), float(multimask), np.float32),
            "add_no_mem_embed": np.full((batch, 1), float(no_mem), np.float32),
        }
        model = self.model
        with torch.no_grad():
            backbone = torch.from_numpy(feeds["pix_feat"])
            if no_mem:  # upstream adds it in HWxBxC layout; the sum is the same per element
                backbone = backbone + model.no_mem_embed.reshape(1, -1, 1, 1)
            # Upstream's prompt encoder pads once itself: hand it all but one padding point.
            points = {
                "point_coords": torch.from_numpy(coords[:, :-1]),
                "point_labels": torch.from_numpy(point_labels[:, :-1]).int(),
            }
            out = model._forward_sam_heads(
                backbone_features=backbone,
                point_inputs=points,
                mask_inputs=torch.from_numpy(mask_input) if mask else None,
                high_res_features=[
                    torch.from_numpy(feeds[n]) for n in ("high_res_feats_0", "high_res_feats_1")
                ],
                multimask_output=bool(multimask),
            )
        _, _, ious, low_res, _, obj_ptr, scores = out
        iou = ious.max(dim=-1, keepdim=True).values if multimask else ious
        expected = {
            "low_res_masks": low_res.numpy(),
            "obj_ptr": obj_ptr.numpy(),
            "object_score_logits": scores.numpy(),
            "iou": iou.numpy(),
        }
        return label, feeds, expected

    def _memory_encoder(self):
        cases = [
            self._memory_encoder_case("tracked frame, present", [0], [3.0]),
            self._memory_encoder_case("clicked frame (binarised), absent", [1], [-2.0]),
            self._memory_encoder_case("batch=2, mixed", [1, 0], [-1.0, 4.0]),
        ]
        trace = self._memory_encoder_case("trace", [1, 0], [-1.0, 4.0])[1]
        return MemoryEncoderGraph(self.model).eval(), trace, cases

    def _memory_encoder_case(self, label, from_pts, scores) -> Case:
        batch = len(from_pts)
        size = self.model.image_size
        low_res = (self.rng.standard_normal((batch, 1, size // 4, size // 4)) * 6).astype(
            np.float32
        )
        feeds = {
            "vision_feats": np.ascontiguousarray(self.nchw[-1][:batch]),
            "low_res_masks": low_res,
            "object_score_logits": np.array(scores, np.float32).reshape(batch, 1),
            "is_mask_from_pts": np.array(from_pts, np.float32).reshape(batch, 1),
        }
        expected = []
        for i in range(batch):  # upstream's flag is a Python bool: one call per item
            with torch.no_grad():
                high_res = F.interpolate(
                    torch.from_numpy(low_res[i : i + 1]),
                    size=(size, size),
                    mode="bilinear",
                    align_corners=False,
                )
                features, pos = self.model._encode_new_memory(
                    current_vision_feats=[self.vision[-1][:, i : i + 1]],
                    feat_sizes=self.feat_sizes,
                    pred_masks_high_res=high_res,
                    object_score_logits=torch.from_numpy(feeds["object_score_logits"][i : i + 1]),
                    is_mask_from_pts=bool(from_pts[i]),
                )
            expected.append(features.numpy())
            # The memory attention graph bakes the memories' position encoding in.
            if not torch.equal(pos[-1], self.maskmem_pos):
                raise ExportError("memory_encoder: the position encoding depends on the input")
        return label, feeds, {"maskmem_features": np.concatenate(expected)}

    def _mask_prompt(self):
        cases = [self._mask_prompt_case("a mask", [True]), self._mask_prompt_case("empty", [False])]
        trace = self._mask_prompt_case("trace", [True, False])[1]
        return MaskPromptGraph(self.model).eval(), trace, cases

    def _mask_prompt_case(self, label, filled) -> Case:
        batch = len(filled)
        size = self.model.image_size
        mask = np.zeros((batch, 1, size, size), np.float32)
        for i, fill in enumerate(filled):
            if fill:
                y, x = self.rng.integers(0, size - 300, 2)
                mask[i, 0, y : y + 300, x : x + 200] = 1.0
        feeds = {"vision_feats": np.ascontiguousarray(self.nchw[-1][:batch]), "mask": mask}
        high_res = [torch.from_numpy(np.ascontiguousarray(f[:batch])) for f in self.nchw[:2]]
        with torch.no_grad():
            out = self.model._use_mask_as_output(
                torch.from_numpy(feeds["vision_feats"]), high_res, torch.from_numpy(mask)
            )
        return label, feeds, {"obj_ptr": out[5].numpy(), "object_score_logits": out[6].numpy()}


__all__ = ["GRAPH_KEYS", "VideoExportResult", "build_video_model", "export_video", "tracker_config"]
