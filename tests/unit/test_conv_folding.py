"""Folding a 1x1 Conv into the Conv before it (part of ``fuse_attention(path, "sam3")``):
exact up to float rounding, borders included, and only where it is valid and saves work."""

from __future__ import annotations

import onnx
import torch
from torch import nn

from triton_sam.export import onnx_utils
from triton_sam.export.conv_folding import fold_pointwise_convs

TOL = onnx_utils.FP32_TOLERANCE


class _Neck(nn.Module):
    """x [B, 8, 20, 20] -> (folded: 3x3 pad 1 -> 1x1 narrowing, as SAM3's proj2 -> conv_s0;
    kept: 1x1 widening after a 3x3; kept: a 3x3 whose output is also read elsewhere)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv2d(8, 32, 3, padding=1)
        self.narrow = nn.Conv2d(32, 4, 1)
        self.proj_b = nn.Conv2d(8, 8, 3, padding=1)
        self.widen = nn.Conv2d(8, 64, 1)
        self.shared = nn.Conv2d(8, 32, 3, padding=1)
        self.narrow_b = nn.Conv2d(32, 4, 1)
        for p in self.parameters():  # biases non-zero: they must be carried through
            nn.init.normal_(p, std=0.3)

    def forward(self, x):
        s = self.shared(x)
        return self.narrow(self.proj(x)), self.widen(self.proj_b(x)), self.narrow_b(s) + s.mean()


def test_narrowing_pointwise_conv_is_folded_exactly(tmp_path):
    torch.manual_seed(0)
    module = _Neck().eval()
    path = tmp_path / "neck.onnx"
    x = torch.randn(2, 8, 20, 20)
    onnx_utils.export_graph(
        module,
        (x,),
        path,
        input_names=["x"],
        output_names=["a", "b", "c"],
        dynamic_axes={"x": {0: "batch"}},
        opset=17,
    )
    feeds = {"x": x.numpy()}
    before = onnx_utils.run_onnx(path, feeds)
    model = onnx.load(str(path))
    assert sum(n.op_type == "Conv" for n in model.graph.node) == 6
    assert fold_pointwise_convs(model) == 1
    assert sum(n.op_type == "Conv" for n in model.graph.node) == 5
    onnx.save(model, str(path))
    after = onnx_utils.run_onnx(path, feeds)
    with torch.no_grad():
        reference = [t.numpy() for t in module(x)]
    for name, ref in zip("abc", reference, strict=True):
        assert TOL.mismatch(after[name], before[name]) is None
        # Against torch: every pixel, the zero-padded borders of the 3x3 included.
        assert TOL.mismatch(after[name], ref) is None
