"""Optional CPU-oriented rewrites of an exported encoder: fused attention and int8 weights.

Both are export options, off by default (``export.fuse_attention``, ``export.quantize``), and
both run before the ORT-vs-torch check, which then uses the tolerance of what was done.

- :func:`fuse_attention` runs onnxruntime's transformer optimizer for SAM2
  (``model_type="sam2"``), which replaces each decomposed attention of the Hiera trunk
  (MatMul, scale, Softmax, MatMul, transposes; what the TorchScript exporter writes for
  ``scaled_dot_product_attention`` at opset 17) by one ``com.microsoft.MultiHeadAttention``.
  On CPU that op runs MLAS's flash attention instead of materialising the 4096x4096 score
  matrix of each head of the global-attention blocks. Same math up to float reassociation
  (measured 2.5e-6 on SAM2.1-tiny features), so the fp32 tolerance still applies. The graph
  then needs onnxruntime (CPU or CUDA provider; TensorRT cannot take the contrib op and runs
  it on CUDA), which is why it is an option. SAM3's ViT (rotary embedding between the
  projections and the attention) matches none of the optimizer's patterns; its attentions
  are fused by our own rewrite, :func:`~triton_sam.export.attention_fusion.fuse_sdpa`, to the
  same op; the same option then folds SAM3's ``conv_s0`` / ``conv_s1`` (1x1) into the FPN's
  3x3 convs before them (:mod:`~triton_sam.export.conv_folding`, exact up to rounding: 8x
  fewer FLOPs on the 288x288 level). Together: max abs difference 1.2e-7 from the unfused
  graph on the small SAM3 tracker's features.
- :func:`quantize_int8` quantizes the weights of every MatMul with a constant weight to int8
  (onnxruntime's dynamic quantization: activations quantized per run). It changes results
  (see :data:`INT8_TOLERANCE` and docs/benchmark.md for the measured agreement): an option for
  CPU throughput, never the default.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from triton_sam.errors import ExportError
from triton_sam.export.onnx_utils import (
    external_data_files,
    save_model,
    save_with_external_data,
)
from triton_sam.export.verification import Tolerance

# How each family's encoder attention is fused: onnxruntime's transformer optimizer with this
# ``model_type``, or SDPA_FUSION for our own rewrite (attention_fusion.fuse_sdpa). A family not
# listed has no fusion (see has_attention_fusion).
SDPA_FUSION = "sdpa"
ATTENTION_FUSION_TYPES = {"sam2": "sam2", "sam3": SDPA_FUSION}
# Written into a fused graph's ``metadata_props`` (value: the fused operator counts), so a
# graph is never fused twice (the embedded CPU twin fuses exports that were not).
FUSED_METADATA_KEY = "triton_sam.attention"
QUANTIZE_CHOICES = ("none", "int8")
# A guard against a broken conversion, not a statement of accuracy: on SAM2.1-tiny (random
# init, features up to |3.1|) int8 weights moved encoder outputs by up to 0.082 (2.6% of the
# scale); trained weights are smoother. int8 steps are ~1/127 of each weight row's range, so
# the errors scale with the tensor, not the element: 10% of max|torch| on the worst element,
# 3% of rms(torch) in rms (a dropped term or a wrong scale is of the order of the tensor).
# The agreement that matters (masks) is measured on the prompt matrix.
INT8_TOLERANCE = Tolerance(max_rel=0.1, rms_rel=0.03)


def has_attention_fusion(family: str) -> bool:
    """Whether :func:`fuse_attention` knows the encoder of ``family`` (e.g. ``"sam2"``)."""
    return family in ATTENTION_FUSION_TYPES


def fuse_attention(path: Path, family: str) -> dict[str, int]:
    """Fuse the attention blocks of the encoder at ``path`` in place.

    Args:
        path: the exported encoder (weights inline or in a ``.onnx_data`` sidecar).
        family: the family name (``"sam2"``, ``"sam3"``); others have no fusion pattern here.

    Returns:
        Fused operator counts, e.g. ``{"MultiHeadAttention": 12, ...}``.

    Raises:
        ExportError: the family has no fusion, or nothing was fused (the exported pattern
            changed: refusing beats silently serving the slow graph).
    """
    model_type = ATTENTION_FUSION_TYPES.get(family)
    if model_type is None:
        raise ExportError(
            f"fuse_attention: no attention fusion for family {family!r} "
            f"(available for {sorted(ATTENTION_FUSION_TYPES)})"
        )
    if model_type == SDPA_FUSION:
        return _fuse_sdpa(path)
    from onnxruntime.transformers import optimizer

    # opt_level 0: only the python fusions; onnxruntime applies its own graph optimisations
    # when the session loads, as it does for the unfused graph.
    model = optimizer.optimize_model(
        str(path), model_type=model_type, opt_level=0, use_gpu=False, num_heads=0, hidden_size=0
    )
    counts = {k: int(v) for k, v in model.get_fused_operator_statistics().items()}
    if not counts.get("MultiHeadAttention"):
        raise ExportError(
            f"fuse_attention: onnxruntime's {model_type!r} optimizer found no attention to fuse "
            f"in {path.name} ({counts}); the exported pattern changed"
        )
    model.model.metadata_props.add(key=FUSED_METADATA_KEY, value=json.dumps(counts))
    external = bool(external_data_files(path))
    _replace(path, external, lambda tmp: model.save_model_to_file(str(tmp), external))
    return counts


def _fuse_sdpa(path: Path) -> dict[str, int]:
    """Our own rewrites: :func:`~triton_sam.export.attention_fusion.fuse_sdpa`, then
    :func:`~triton_sam.export.conv_folding.fold_pointwise_convs` (SAM3's ``conv_s0`` /
    ``conv_s1`` into the FPN's 3x3 convs: on the small model most of the encoder's CPU time;
    counted as ``FoldedConv``)."""
    import onnx

    from triton_sam.export.attention_fusion import fuse_sdpa
    from triton_sam.export.conv_folding import fold_pointwise_convs

    external = bool(external_data_files(path))
    model = onnx.load(str(path))  # with its weights: the conv fold rewrites some
    fused = fuse_sdpa(model)
    if not fused:
        raise ExportError(
            f"fuse_attention: found no Softmax(MatMul(q, Transpose(k)) * scale) @ v attention "
            f"to fuse in {path.name}; the exported pattern changed"
        )
    counts = {"MultiHeadAttention": fused, "FoldedConv": fold_pointwise_convs(model)}
    model.metadata_props.add(key=FUSED_METADATA_KEY, value=json.dumps(counts))

    _replace(path, external, lambda tmp: save_model(model, tmp, external=external))
    return counts


def quantize_int8(path: Path) -> None:
    """Quantize the constant weights of every MatMul of the graph at ``path`` to int8, in place.

    Raises:
        ExportError: onnxruntime's quantizer failed (its message is kept).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    external = bool(external_data_files(path))

    def write(tmp: Path) -> None:
        quantize_dynamic(
            path,
            tmp,
            op_types_to_quantize=["MatMul"],
            weight_type=QuantType.QInt8,
            use_external_data_format=external,
            # Only weights (constant B); attention's activation x activation products stay
            # fp32. Contrib ops (fused attention) have no ONNX type inference: say fp32.
            extra_options={"MatMulConstBOnly": True, "DefaultTensorType": 1},
        )

    try:
        _replace(path, external, write)
    except ExportError:
        raise
    except Exception as e:  # the quantizer raises RuntimeError, ValueError, onnx errors...
        raise ExportError(f"quantize int8 failed for {path.name}: {e}") from e


def _replace(path: Path, external: bool, write: Callable[[Path], object]) -> None:
    """Have ``write(tmp)`` save a new version of ``path`` in a private directory, then move it
    into place (weights back into ``<stem>.onnx_data`` when the original had a sidecar)."""
    with tempfile.TemporaryDirectory(prefix=f".{path.stem}.rewrite-", dir=path.parent) as tmp:
        out = Path(tmp) / path.name
        write(out)
        if external:
            save_with_external_data(out, dest=path)
        else:
            os.replace(out, path)
