"""The SAM3 video graphs' torch modules: what ``export/sam3_video.py`` traces (one per role of
``protocol.SAM3_GRAPHS``), each calling ``Sam3TrackerVideoModel``'s own submodules."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from triton_sam.errors import ExportError
from triton_sam.export.wrapper import ModelWrapper
from triton_sam.serving.protocol import tracker as protocol

NO_OBJ_SCORE = protocol.NO_OBJ_SCORE


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


class MaskPromptGraph(ModelWrapper):
    """``_use_mask_as_output`` for a binary mask [B,1,1008,1008] in the input frame: the object
    pointer and score, and the memory ``_encode_new_memory`` makes of it (protocol's
    ``SAM3_GRAPHS["mask_prompt"]``)."""

    def forward(
        self, vision_feats: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        model = self.model
        batch, feat = vision_feats.shape[0], vision_feats.shape[-1]
        # The high-resolution levels only shape the decoder's mask upsampling, whose output
        # this graph drops: zeros of the right shape do.
        high_res = [
            torch.zeros(batch, 32, 4 * feat, 4 * feat),
            torch.zeros(batch, 64, 2 * feat, 2 * feat),
        ]
        small = model.mask_downsample(mask)
        size = tuple(model.prompt_encoder.mask_input_size)
        # upstream's antialiased resize is an upsampling here (252 -> 288): plain bilinear
        small = F.interpolate(small, size=size, mode="bilinear", align_corners=False)
        pointer = model._single_frame_forward(
            input_masks=small, image_embeddings=[*high_res, vision_feats]
        ).object_pointer.reshape(batch, -1)
        lam = (mask.flatten(1) > 0).float().amax(dim=1, keepdim=True)  # any pixel set
        pointer = lam * pointer + (1 - lam) * model.no_object_pointer
        score = protocol.MASK_AS_OUTPUT_SCALE * lam + protocol.MASK_AS_OUTPUT_BIAS
        # the memory: the mask as logits (-10 / +10), resized to the memory encoder's input,
        # binarised (a prompt's memory always is), scaled
        high = mask * protocol.MASK_AS_OUTPUT_SCALE + protocol.MASK_AS_OUTPUT_BIAS
        mem_size = 4 * size[0]
        high = F.interpolate(high, size=(mem_size, mem_size), mode="bilinear", align_corners=False)
        memory_mask = (high > 0).float() * model.config.sigmoid_scale_for_mem_enc
        memory_mask = memory_mask + model.config.sigmoid_bias_for_mem_enc
        features, _ = model.memory_encoder(vision_feats, memory_mask)
        if model.occlusion_spatial_embedding_parameter is not None:
            absent = 1 - (score > 0).float()
            features = (
                features
                + absent[..., None, None]
                * model.occlusion_spatial_embedding_parameter[..., None, None]
            )
        return pointer, score, features


WRAPPERS = {
    "video_encoder": VideoEncoder,
    "memory_attention": MemoryAttentionGraph,
    "video_decoder": VideoDecoderGraph,
    "memory_encoder": MemoryEncoderGraph,
    "mask_prompt": MaskPromptGraph,
}
