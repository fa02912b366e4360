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

``mask_prompt`` is not exported: upstream encodes a mask prompt's memory from the
full-resolution mask, not from low-resolution logits, so the tracker refuses mask prompts for
this family instead of serving them differently.

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
import torch.nn.functional as F
from torch import nn

from triton_sam.errors import CheckpointError, ExportError, ExportValidationError
from triton_sam.export import ExportOptions, GraphExport, finish_graph, trace_graphs, verification
from triton_sam.export.wrapper import ModelWrapper
from triton_sam.models.spec import GraphSpec, TensorSpec
from triton_sam.serving.protocol import tracker as protocol
from triton_sam.serving.tracking.config import TrackerConfig

GRAPH_KEYS = protocol.SAM3_GRAPH_KEYS
TRACKER_CONFIG_FILENAME = "tracker_config.json"
NO_OBJ_SCORE = protocol.NO_OBJ_SCORE
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
    )


# -- wrappers -------------------------------------------------------------------------------
def _nchw(tokens: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Upstream's (HW)BC token layout -> BCHW."""
    return tokens.permute(1, 2, 0).reshape(tokens.shape[1], tokens.shape[2], *size)


class VideoEncoder(ModelWrapper):
    """image [B,3,1008,1008] -> vision_feats [B,256,72,72], high_res_feats_0 [B,32,288,288],
    high_res_feats_1 [B,64,144,144] (``get_image_features``, NCHW)."""

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        feats = self.model.get_image_features(image, return_dict=True).fpn_hidden_states
        sizes = [tuple(s) for s in self.model.backbone_feature_sizes]
        level0, level1, level2 = (_nchw(f, s) for f, s in zip(feats, sizes, strict=True))
        return level2, level0, level1


def vision_position_encoding(model: nn.Module) -> torch.Tensor:
    """The lowest level's sine position encoding [HW, 1, C]: a constant of the feature size,
    taken from one run of the vision encoder (upstream recomputes it every frame)."""
    size = int(model.config.image_size)
    with torch.no_grad():
        out = model.get_image_features(torch.zeros(1, 3, size, size), return_dict=True)
    return out.fpn_position_encoding[-1].detach().clone()


def memory_position_encoding(model: nn.Module) -> torch.Tensor:
    """The memory encoder's sine position encoding [HW, 1, mem_dim] (a constant)."""
    feat = tuple(model.backbone_feature_sizes[-1])
    shape = torch.Size((1, model.mem_dim, *feat))
    with torch.no_grad():
        pos = model.memory_encoder.position_encoding(shape, torch.device("cpu"), torch.float32)
    return pos.flatten(2).permute(2, 0, 1).detach().clone()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    from transformers.models.sam3_tracker_video.modeling_sam3_tracker_video import (
        rotate_pairwise,
    )

    return x * cos + rotate_pairwise(x) * sin


class MemoryAttentionGraph(ModelWrapper):
    """``_prepare_memory_conditioned_features`` step 2-5 (see protocol's memory_attention).

    Inputs: vision_feats [B,C,F,F], memory [B,Nm,mem,F,F], memory_tpos [B,Nm] int64 (0 =
    conditioning frame, 1..num_maskmem-1 = how recent), obj_ptrs [B,Np,C], obj_ptr_tpos [B,Np]
    (offset / (max pointers - 1)). Output: pix_feat [B,C,F,F].
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.register_buffer("vision_pos", vision_position_encoding(model), persistent=False)
        self.register_buffer("memory_pos", memory_position_encoding(model), persistent=False)

    def forward(
        self,
        vision_feats: torch.Tensor,
        memory: torch.Tensor,
        memory_tpos: torch.Tensor,
        obj_ptrs: torch.Tensor,
        obj_ptr_tpos: torch.Tensor,
    ) -> torch.Tensor:
        from transformers.models.sam3_tracker_video.modeling_sam3_tracker_video import (
            get_1d_sine_pe,
        )

        model = self.model
        attention = model.memory_attention
        batch, channels, height, width = vision_feats.shape
        mem_dim, maskmem = model.mem_dim, model.num_maskmem
        queries = vision_feats.flatten(2).transpose(1, 2)  # [B,HW,C]
        queries = queries + 0.1 * self.vision_pos.transpose(0, 1)
        # spatial memories and their position: sine + temporal encoding of their slot
        spatial = memory.flatten(3).transpose(2, 3)  # [B,Nm,HW,mem]
        slot = (maskmem - 1 - memory_tpos).clamp(0, maskmem - 1)
        temporal = model.memory_temporal_positional_encoding.reshape(maskmem, mem_dim)[slot]
        spatial_pos = self.memory_pos.transpose(0, 1)[None] + temporal[:, :, None, :]
        # pointers: each split into C / mem tokens, each with its pointer's projected sine
        splits = channels // mem_dim
        pointers = obj_ptrs.reshape(batch, -1, mem_dim)  # [B,Np*splits,mem]
        sine = get_1d_sine_pe(obj_ptr_tpos, dim=channels)
        pointer_pos = model.temporal_positional_encoding_projection_layer(sine)
        pointer_pos = pointer_pos.repeat_interleave(splits, dim=1)
        cos, sin = attention.rotary_emb(queries, attention.position_ids)  # [1,HW,head_dim]
        for layer in attention.layers:
            query = layer.layer_norm1(queries)
            queries = queries + self._attend(
                layer.self_attn, query, (query, None), (query, None), cos, sin
            )
            query = layer.layer_norm2(queries)
            keys = (spatial + spatial_pos, pointers + pointer_pos)
            values = (spatial, pointers)
            queries = queries + self._attend(layer.cross_attn_image, query, keys, values, cos, sin)
            query = layer.layer_norm3(queries)
            queries = queries + layer.linear2(layer.activation(layer.linear1(query)))
        out = attention.layer_norm(queries)
        return out.transpose(1, 2).reshape(batch, channels, height, width)

    @staticmethod
    def _attend(
        attn: nn.Module,
        query: torch.Tensor,
        keys: tuple[torch.Tensor, torch.Tensor | None],
        values: tuple[torch.Tensor, torch.Tensor | None],
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        """``Sam3TrackerVideoRoPEAttention`` with the rotated keys (queries' grid, per memory
        frame for a cross-attention) and the unrotated pointer keys as separate tensors."""
        heads, head_dim = attn.num_attention_heads, attn.head_dim
        batch = query.shape[0]

        def split(x: torch.Tensor) -> torch.Tensor:  # [..., L, heads*d] -> [B, heads, L, d]
            return x.reshape(batch, -1, heads, head_dim).transpose(1, 2)

        q = _rotate(split(attn.q_proj(query)), cos, sin)
        rotated_keys, pointer_keys = keys
        # rotated keys: [B,HW,*] (self) or [B,Nm,HW,*] (memories), each frame on the grid
        k = attn.k_proj(rotated_keys)
        k = k.reshape(batch, -1, cos.shape[1], heads, head_dim).permute(0, 3, 1, 2, 4)
        k = _rotate(k, cos[:, None], sin[:, None]).flatten(2, 3)
        v = split(attn.v_proj(values[0]))
        if pointer_keys is not None:
            k = torch.cat([k, split(attn.k_proj(pointer_keys))], dim=2)
            v = torch.cat([v, split(attn.v_proj(values[1]))], dim=2)
        weights = torch.softmax(torch.matmul(q, k.transpose(2, 3)) * attn.scaling, dim=-1)
        out = torch.matmul(weights, v).transpose(1, 2).reshape(batch, -1, heads * head_dim)
        return attn.o_proj(out)


class VideoDecoderGraph(ModelWrapper):
    """``_single_frame_forward`` on memory-conditioned features, for every flag value by
    arithmetic (protocol's video_decoder contract)."""

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
        encoder, decoder = model.prompt_encoder, model.mask_decoder
        batch = pix_feat.shape[0]
        no_mem = model.no_memory_embedding.reshape(1, -1, 1, 1)
        pix = pix_feat + add_no_mem_embed.reshape(-1, 1, 1, 1) * no_mem
        labels = point_labels.round().to(torch.int64)[:, None]
        # the caller appended upstream's padding point (0, 0, -1): no second padding
        sparse = encoder._embed_points(point_coords[:, None], labels, pad=False)
        has_mask = has_mask_input.reshape(-1, 1, 1, 1)
        no_mask = encoder.no_mask_embed.weight.reshape(1, -1, 1, 1)
        dense = has_mask * encoder.mask_embed(mask_input) + (1 - has_mask) * no_mask
        # one decoder run gives every token: the single-mask selection (dynamic multimask via
        # stability) is captured from inside it, the mask tokens from its hypernetwork inputs
        captured: list[tuple[torch.Tensor, torch.Tensor]] = []
        tokens: list[torch.Tensor] = []
        select = decoder._dynamic_multimask_via_stability

        def capture(masks: torch.Tensor, iou: torch.Tensor) -> Any:
            captured.append((masks, iou))
            return select(masks, iou)

        hooks = [
            mlp.register_forward_pre_hook(lambda _, args: tokens.append(args[0]))
            for mlp in decoder.output_hypernetworks_mlps
        ]
        decoder._dynamic_multimask_via_stability = capture
        try:
            single, single_iou, _, scores = decoder(
                image_embeddings=pix,
                image_positional_embeddings=model.get_image_wide_positional_embeddings().repeat(
                    batch, 1, 1, 1
                ),
                sparse_prompt_embeddings=sparse,
                dense_prompt_embeddings=dense,
                multimask_output=False,
                high_resolution_features=[high_res_feats_0, high_res_feats_1],
            )
        finally:
            del decoder._dynamic_multimask_via_stability
            for hook in hooks:
                hook.remove()
        if not captured or len(tokens) != decoder.num_mask_tokens:
            raise ExportError("mask decoder: did not run its single-mask selection and MLPs")
        masks, ious = captured[0][0][:, 0], captured[0][1][:, 0]  # [B,4,h,w], [B,4]
        scores = scores[:, 0]  # [B,1]
        appearing = scores > 0
        all_tokens = torch.stack(tokens, dim=2)[:, 0]  # [B,4,C]
        best = torch.argmax(ious[:, 1:], dim=-1, keepdim=True)  # [B,1]
        multi_mask = masks[:, 1:].gather(
            1, best[:, :, None, None].expand(-1, -1, *masks.shape[-2:])
        )
        multi_iou = ious[:, 1:].gather(1, best)
        multi_token = all_tokens[:, 1:].gather(
            1, best[:, :, None].expand(-1, -1, all_tokens.shape[-1])
        )
        multi = multimask_output.reshape(batch, 1) > 0.5
        low_res = torch.where(multi[:, :, None, None], multi_mask, single[:, 0])
        low_res = torch.where(appearing[:, :, None, None], low_res, NO_OBJ_SCORE)
        iou = torch.where(multi, multi_iou, single_iou[:, 0])
        token = torch.where(multi, multi_token[:, 0], all_tokens[:, 0])
        lam = appearing.float()
        obj_ptr = lam * model.object_pointer_proj(token) + (1 - lam) * model.no_object_pointer
        return low_res, obj_ptr, scores, iou


class MemoryEncoderGraph(ModelWrapper):
    """``_encode_new_memory`` from low-resolution logits (protocol's memory_encoder)."""

    def forward(
        self,
        vision_feats: torch.Tensor,
        low_res_masks: torch.Tensor,
        object_score_logits: torch.Tensor,
        is_mask_from_pts: torch.Tensor,
    ) -> torch.Tensor:
        model = self.model
        size = int(model.config.image_size)
        # upstream's high-resolution masks, then its resize to the memory encoder's input
        # (an upsampling, where its antialiasing changes nothing)
        high_res = F.interpolate(
            low_res_masks, size=(size, size), mode="bilinear", align_corners=False
        )
        mem_size = 4 * model.prompt_encoder.mask_input_size[0]
        if mem_size != size:
            high_res = F.interpolate(
                high_res, size=(mem_size, mem_size), mode="bilinear", align_corners=False
            )
        binarize = is_mask_from_pts.reshape(-1, 1, 1, 1) > 0.5
        mask = torch.where(binarize, (high_res > 0).float(), torch.sigmoid(high_res))
        mask = mask * model.config.sigmoid_scale_for_mem_enc + model.config.sigmoid_bias_for_mem_enc
        features, _ = model.memory_encoder(vision_feats, mask)
        if model.occlusion_spatial_embedding_parameter is not None:
            absent = 1 - (object_score_logits > 0).float()
            features = (
                features
                + absent[..., None, None]
                * model.occlusion_spatial_embedding_parameter[..., None, None]
            )
        return features


WRAPPERS = {
    "video_encoder": VideoEncoder,
    "memory_attention": MemoryAttentionGraph,
    "video_decoder": VideoDecoderGraph,
    "memory_encoder": MemoryEncoderGraph,
}


def video_graphs() -> tuple[GraphSpec, ...]:
    """The SAM3 video graphs, declared from ``protocol.SAM3_GRAPHS`` (role = graph key)."""
    return tuple(
        GraphSpec(
            key,
            protocol.SAM3_MODEL_NAMES[key],
            tuple(TensorSpec(*t) for t in inputs),
            tuple(TensorSpec(*t) for t in outputs),
        )
        for key, (inputs, outputs) in protocol.SAM3_GRAPHS.items()
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
        tolerance = BF16_TOLERANCE if key == "memory_encoder" else verification.FP32_TOLERANCE
        t0 = time.perf_counter()
        try:
            errors = verification.verify_graph(path, cases[key], tolerance)
        except ExportValidationError as e:
            mismatches += [f"{key}: {line}" for line in e.mismatches]
        else:
            result.max_abs_error.update({f"{key}.{k}": v for k, v in errors.items()})
        seconds[f"verify_{key}"] = time.perf_counter() - t0
    if mismatches:
        raise ExportValidationError("the SAM3 video graphs", mismatches)
    (out_dir / TRACKER_CONFIG_FILENAME).write_text(hyper.to_json())
    return result


__all__ = [
    "GRAPH_KEYS",
    "Sam3VideoExportResult",
    "build_video_model",
    "export_sam3_video",
    "random_model",
    "small_config",
    "tracker_config",
    "video_graphs",
]
