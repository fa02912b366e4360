"""Our SDPA -> com.microsoft.MultiHeadAttention rewrite (``fuse_attention(path, "sam3")``) on
tiny exported attentions: what it fuses, what it refuses, and that the fused graph computes
what the unfused one (and torch) does, within the fp32 export tolerance.

The full path (the small random-init SAM3 tracker exported with ``fuse_attention=True`` and
checked against torch) is in tests/export/test_sam3_export.py.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from triton_sam.errors import ExportError
from triton_sam.export import onnx_utils
from triton_sam.export.optimize import fuse_attention, has_attention_fusion

TOL = onnx_utils.FP32_TOLERANCE
HEADS, DIM, TOKENS = 2, 16, 40


class _Attentions(nn.Module):
    """x [B, N, C] -> two attentions in a row, written the two ways exporters see them:
    ``F.scaled_dot_product_attention`` on [B, heads, N, D] (what SAM3's ViT calls) and an
    eager ``softmax(q @ k^T / sqrt(D)) @ v`` on windows, [B, windows, heads, N/2, D] (rank 5:
    every leading dim is folded into the op's batch)."""

    def __init__(self, probabilities_out: bool = False) -> None:
        super().__init__()
        self.qkv = nn.Linear(HEADS * DIM, 3 * HEADS * DIM)
        self.qkv2 = nn.Linear(HEADS * DIM, 3 * HEADS * DIM)
        self.probabilities_out = probabilities_out

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, HEADS, DIM).permute(2, 0, 3, 1, 4)
        # An explicit scale, as transformers' attention passes it: without one the exporter
        # computes 1/sqrt(D) from q's runtime shape, a tensor the op cannot take as attribute.
        y = F.scaled_dot_product_attention(q, k, v, scale=DIM**-0.5)
        y = y.transpose(1, 2).reshape(b, n, c)
        q, k, v = self.qkv2(y).reshape(b, 2, n // 2, 3, HEADS, DIM).permute(3, 0, 1, 4, 2, 5)
        p = torch.softmax(q @ k.transpose(-2, -1) / DIM**0.5, dim=-1)
        out = (p @ v).permute(0, 1, 3, 2, 4).reshape(b, n, c)
        return (out, p) if self.probabilities_out else (out,)


def _export(module: nn.Module, path, outputs=("y",), **kwargs):
    torch.manual_seed(0)
    module = module.eval()
    x = torch.randn(1, TOKENS, HEADS * DIM)
    onnx_utils.export_graph(
        module,
        (x,),
        path,
        input_names=["x"],
        output_names=list(outputs),
        dynamic_axes={"x": {0: "batch"}},
        opset=17,
        **kwargs,
    )
    return path


def _ops(path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


@pytest.fixture(scope="module")
def attentions():
    torch.manual_seed(0)
    return _Attentions().eval()


def test_fused_graph_matches_the_unfused_one_and_torch(attentions, tmp_path):
    plain = _export(attentions, tmp_path / "plain.onnx")
    fused = _export(attentions, tmp_path / "fused.onnx")
    assert _ops(plain).count("Softmax") == 2

    assert fuse_attention(fused, "sam3") == {"MultiHeadAttention": 2, "FoldedConv": 0}
    assert _ops(fused).count("MultiHeadAttention") == 2
    assert "Softmax" not in _ops(fused)
    # Batch 3: the symbolic batch dim survives the rewrite (the op's batch is B * heads...).
    x = np.random.default_rng(1).standard_normal((3, TOKENS, HEADS * DIM)).astype(np.float32)
    expected = onnx_utils.run_onnx(plain, {"x": x})["y"]
    got = onnx_utils.run_onnx(fused, {"x": x})["y"]
    assert got.shape == (3, TOKENS, HEADS * DIM)
    assert TOL.mismatch(got, expected) is None
    with torch.no_grad():
        (reference,) = attentions(torch.from_numpy(x))
    assert TOL.mismatch(got, reference.numpy()) is None
    # The scores matter: a fusion that dropped the scale or a softmax would be far off.
    assert np.abs(got).max() > 0.1


def test_weights_in_a_sidecar_stay_there(attentions, tmp_path):
    fused = _export(attentions, tmp_path / "ext.onnx", external_data=True)
    sidecars = onnx_utils.external_data_files(fused)
    assert sidecars
    fuse_attention(fused, "sam3")
    assert onnx_utils.external_data_files(fused) == sidecars
    x = np.zeros((1, TOKENS, HEADS * DIM), np.float32)
    assert onnx_utils.run_onnx(fused, {"x": x})["y"].shape == x.shape


def test_an_attention_whose_probabilities_are_used_elsewhere_is_left_alone(tmp_path):
    # The eager attention's softmax is also a graph output: fusing it would lose that output.
    torch.manual_seed(0)
    path = _export(_Attentions(probabilities_out=True), tmp_path / "p.onnx", outputs=("y", "p"))
    assert fuse_attention(path, "sam3")["MultiHeadAttention"] == 1
    assert _ops(path).count("Softmax") == 1


def test_a_graph_without_the_pattern_is_refused(tmp_path):
    class _NoAttention(nn.Module):
        def forward(self, x):
            return torch.softmax(x @ x.transpose(-2, -1), dim=-1) + 1.0  # no "@ v"

    path = _export(_NoAttention(), tmp_path / "none.onnx")
    before = path.read_bytes()
    with pytest.raises(ExportError, match="found no .*attention"):
        fuse_attention(path, "sam3")
    assert path.read_bytes() == before


def test_families_without_a_fusion_are_refused(tmp_path):
    assert has_attention_fusion("sam2") and has_attention_fusion("sam3")
    assert not has_attention_fusion("sam1")
    with pytest.raises(ExportError, match="no attention fusion for family 'sam1'"):
        fuse_attention(tmp_path / "unused.onnx", "sam1")
