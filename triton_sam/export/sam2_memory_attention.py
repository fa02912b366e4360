"""The memory-attention graph of the SAM2.1 video export (see ``sam2_video.py``).

The official ``MemoryAttention`` layers (their norms, projections and MLPs) over Nm spatial
memories and Np object pointers, with two ONNX quirks worked around:

- RoPE: upstream rotates queries and keys with complex tensors (``torch.view_as_complex``),
  which ONNX cannot express; here the same angles rotate (real, imaginary) channel pairs:
  ``(a + ib)(c + id) = (ac - bd) + i(ad + bc)``.
- ``num_k_exclude_rope`` is a Python int upstream (the tracer would bake it in): spatial
  memories and pointer tokens are separate inputs, projected separately, rotated only where
  upstream rotates, then concatenated in upstream's order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from triton_sam.errors import ExportError


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
