"""The everything-decoder graph: a batch of single-point prompts -> the masks that survive.

One run does what the official generators' ``_process_batch`` does on the device, up to
the crop-edge filter (``segment_anything/automatic_mask_generator.py``,
``sam2/automatic_mask_generator.py``):

1. P prompts of one foreground point each (crop pixels, ``serving.everything.IN_POINTS``)
   moved to the model's input frame exactly as the predictor does (SAM1
   ``ResizeLongestSide.apply_coords`` in float64; SAM2 ``transform_coords`` in float32), the
   padding point appended as the prompt encoder does without boxes;
2. the official mask decoder on the crop's features, given with batch 1 and broadcast to the
   P prompts (``repeat_image``), never sent P times;
3. the candidates: tokens 1-3 (``multimask_output``), else the single-mask selection (SAM1:
   token 0; SAM2: dynamic multimask via stability); prompt-major, as ``flatten(0, 1)``;
4. SAM2 ``use_m2m``: every candidate decoded again with its clamped low-res logits as
   ``mask_input`` and the single-mask selection (``refine_with_m2m``). Without control flow:
   the refinement runs on the candidates selected by ``use_m2m`` (all or none), the plain
   path on the others, and the two are concatenated (one of them is empty);
5. ``pred_iou_thresh`` filter (before upsampling: it needs only the scores, so rejected
   masks are never upsampled), upsampling of the survivors to the crop's size (SAM1
   ``Sam.postprocess_masks``: 1024 square, unpad, crop size; SAM2 ``postprocess_masks``:
   straight to the crop size; bilinear, ``align_corners=False``), stability score
   (``calculate_stability_score`` with the cut-offs as inputs), its filter, the binary masks
   and their boxes (``batched_mask_to_box``).

What stays in numpy (``serving/everything.py``): the crop-edge filter (needs the crop box
and the image size, costs nothing on K boxes), uncrop, RLE, NMS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from triton_sam.serving import everything as ev

MASK_CLAMP = 32.0  # SAM2ImagePredictor._predict clamps the low-res logits it returns


def _sam1_points(point_coords: torch.Tensor, crop_hw: torch.Tensor, size: int) -> torch.Tensor:
    """Normalised [P, 2] coords (float32) of crop-pixel points as SamPredictor computes them:
    ``apply_coords`` (float64), then the prompt encoder's ``+ 0.5`` and ``/ 1024`` still in
    float64 (the points stay float64 until ``_pe_encoding`` casts them)."""
    hw = crop_hw.to(torch.float64)
    scale = size * 1.0 / torch.max(hw)
    new_hw = torch.floor(hw * scale + 0.5)  # ResizeLongestSide.get_preprocess_shape
    factor = (new_hw / hw).flip(0)  # (new_w / w, new_h / h)
    coords = point_coords.to(torch.float64) * factor
    return ((coords + 0.5) / size).to(torch.float32)


def _sam1_input_size(crop_hw: torch.Tensor, size: int) -> torch.Tensor:
    hw = crop_hw.to(torch.float64)
    return torch.floor(hw * (size * 1.0 / torch.max(hw)) + 0.5).to(torch.int64)


class _Broadcast(torch.overrides.TorchFunctionMode):
    """Inside SAM1's ``predict_masks``: ``repeat_interleave`` of the batch-1 image embedding
    (or the positional encoding) to the prompts becomes a broadcast ``expand``: the same
    values without P copies made before the first add."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.repeat_interleave and len(args) >= 2 and args[0].shape[0] == 1:
            x, n = args[0], args[1]
            return x.expand(n, *x.shape[1:])
        return func(*args, **kwargs)


def batched_mask_to_box(masks: torch.Tensor) -> torch.Tensor:
    """int64 [K, 4] xyxy (inclusive) boxes of bool [K, H, W] masks, [0, 0, 0, 0] if empty
    (``batched_mask_to_box`` in integer arithmetic: ONNX has no max over bools)."""
    h, w = masks.shape[-2], masks.shape[-1]
    rows = masks.any(-1).to(torch.int64)  # [K, H]
    cols = masks.any(-2).to(torch.int64)  # [K, W]
    ys = torch.arange(h, dtype=torch.int64)[None]
    xs = torch.arange(w, dtype=torch.int64)[None]
    bottom = (rows * ys).amax(-1)
    top = (rows * ys + h * (1 - rows)).amin(-1)
    right = (cols * xs).amax(-1)
    left = (cols * xs + w * (1 - cols)).amin(-1)
    box = torch.stack([left, top, right, bottom], dim=-1)
    empty = ((right < left) | (bottom < top)).to(torch.int64)
    return box * (1 - empty)[:, None]


class EverythingDecoder(nn.Module):
    """One batch of single-point prompts -> kept masks (see the module docstring).

    Inputs: the family's features with batch 1, then :data:`serving.everything.GRAPH_INPUTS`.
    Outputs: :data:`serving.everything.GRAPH_OUTPUTS`.
    """

    def __init__(self, model: nn.Module, family: str) -> None:
        super().__init__()
        self.family = family
        if family == "sam1":
            self.prompt_encoder = model.prompt_encoder
            self.mask_decoder = model.mask_decoder
            self.size = int(model.image_encoder.img_size)
        else:
            self.prompt_encoder = model.sam_prompt_encoder
            self.mask_decoder = model.sam_mask_decoder
            self.size = int(model.image_size)

    # -- prompts and decoder ----------------------------------------------------------------
    def _sparse(self, point_coords: torch.Tensor, crop_hw: torch.Tensor) -> torch.Tensor:
        """[P, 2, C]: the point (label 1) and the padding point (label -1)."""
        pe = self.prompt_encoder.pe_layer
        if self.family == "sam1":
            point = pe._pe_encoding(_sam1_points(point_coords, crop_hw, self.size))
        else:
            # transform_coords(normalize=True) on float32 points, then _embed_points' + 0.5
            # and forward_with_coords' division, all float32 as upstream.
            hw = crop_hw.to(torch.float32)
            xy = point_coords.to(torch.float32) / hw.flip(0) * self.size
            point = pe._pe_encoding((xy + 0.5) / self.size)
        point = point + self.prompt_encoder.point_embeddings[1].weight
        pad = self.prompt_encoder.not_a_point_embed.weight.expand_as(point)
        return torch.stack([point, pad], dim=1)

    def _decode(self, features, sparse, dense):
        """Every mask token: masks [P, 4, 256, 256], iou [P, 4]."""
        n = sparse.shape[0]
        embed = features[0]
        if self.family == "sam1":
            with _Broadcast():
                masks, iou = self.mask_decoder.predict_masks(
                    image_embeddings=embed,
                    image_pe=self.prompt_encoder.get_dense_pe(),
                    sparse_prompt_embeddings=sparse,
                    dense_prompt_embeddings=dense,
                )
            return masks, iou
        masks, iou, _, _ = self.mask_decoder.predict_masks(
            image_embeddings=embed.expand(n, -1, -1, -1),
            image_pe=self.prompt_encoder.get_dense_pe(),
            sparse_prompt_embeddings=sparse,
            dense_prompt_embeddings=dense,
            repeat_image=False,
            high_res_features=list(features[1:]),
        )
        return masks, iou

    def _single(self, masks: torch.Tensor, iou: torch.Tensor):
        if self.family == "sam2" and self.mask_decoder.dynamic_multimask_via_stability:
            return self.mask_decoder._dynamic_multimask_via_stability(masks, iou)
        return masks[:, 0:1], iou[:, 0:1]

    def _no_mask(self, n: torch.Tensor | int) -> torch.Tensor:
        weight = self.prompt_encoder.no_mask_embed.weight.reshape(1, -1, 1, 1)
        grid = self.prompt_encoder.image_embedding_size
        return weight.expand(n, -1, grid[0], grid[1])

    # -- upsampling -------------------------------------------------------------------------
    def _upsample(self, low: torch.Tensor, crop_hw: torch.Tensor) -> torch.Tensor:
        """[K, 256, 256] low-res logits -> [K, H, W] logits at the crop's size."""
        x = low[:, None]
        h, w = crop_hw[0], crop_hw[1]
        if self.family == "sam1":
            x = F.interpolate(x, (self.size, self.size), mode="bilinear", align_corners=False)
            input_hw = _sam1_input_size(crop_hw, self.size)
            x = x[..., : input_hw[0], : input_hw[1]]
        x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)
        return x[:, 0]

    def forward(self, *inputs: torch.Tensor):
        n_features = 1 if self.family == "sam1" else 3
        features = inputs[:n_features]
        (
            point_coords,
            crop_hw,
            pred_iou_thresh,
            stability_thresh,
            stability_high,
            stability_low,
            mask_threshold,
            multimask,
            use_m2m,
        ) = inputs[n_features:]
        n = point_coords.shape[0]
        sparse = self._sparse(point_coords, crop_hw)
        masks, iou = self._decode(features, sparse, self._no_mask(n))
        single, single_iou = self._single(masks, iou)
        candidates = torch.cat([single, masks[:, 1:]], dim=1)  # [P, 4, 256, 256]
        candidate_iou = torch.cat([single_iou, iou[:, 1:]], dim=1)
        multi = multimask.reshape(1, 1)
        valid = torch.cat([~multi, multi.expand(1, 3)], dim=1).expand(n, 4)
        m2m = use_m2m.reshape(1, 1) & torch.tensor(self.family == "sam2")
        grid = candidates.shape[-2:]
        flat = candidates.reshape(-1, grid[0], grid[1])
        flat_iou = candidate_iou.reshape(-1)
        plain_rows = torch.nonzero((valid & ~m2m).reshape(-1))[:, 0]
        low, scores, rows = flat[plain_rows], flat_iou[plain_rows], plain_rows
        if self.family == "sam2":
            refine_rows = torch.nonzero((valid & m2m).reshape(-1))[:, 0]
            # The decoder cannot run on an empty batch (a reshape with -1 over 0 elements
            # fails in torch and onnxruntime alike): one valid candidate rides along, and its
            # result is dropped (without m2m that is the only decoder work of this branch).
            ride = torch.nonzero(valid.reshape(-1))[:1, 0]
            run_rows = torch.cat([refine_rows, ride])
            refined, refined_iou = self._refine(flat[run_rows], sparse[run_rows // 4], features)
            count = refine_rows.shape[0]
            refined, refined_iou = refined[:count], refined_iou[:count]
            low = torch.cat([low, refined], dim=0)
            scores = torch.cat([scores, refined_iou], dim=0)
            rows = torch.cat([rows, refine_rows], dim=0)
        prompt = rows // 4
        keep = torch.nonzero((scores > pred_iou_thresh) | (pred_iou_thresh <= 0))[:, 0]
        logits = self._upsample(low[keep], crop_hw)
        scores, prompt = scores[keep], prompt[keep]
        inter = (logits > stability_high).sum((-1, -2)).to(torch.float32)
        union = (logits > stability_low).sum((-1, -2)).to(torch.float32)
        stability = inter / union
        keep = torch.nonzero((stability >= stability_thresh) | (stability_thresh <= 0))[:, 0]
        binary = logits[keep] > mask_threshold
        return binary, scores[keep], stability[keep], batched_mask_to_box(binary), prompt[keep]

    def _refine(self, low: torch.Tensor, sparse: torch.Tensor, features):
        """SAM2 ``refine_with_m2m``: each candidate again, its clamped logits as mask input,
        single-mask selection."""
        mask_input = torch.clamp(low, -MASK_CLAMP, MASK_CLAMP)[:, None]
        dense = self.prompt_encoder._embed_masks(mask_input)
        masks, iou = self._decode(features, sparse, dense)
        best, best_iou = self._single(masks, iou)
        return best[:, 0], best_iou[:, 0]


def feature_names(family: str) -> tuple[str, ...]:
    """The graph's feature inputs (the family's encoder outputs, batch 1)."""
    return (
        ("image_embeddings",)
        if family == "sam1"
        else (
            "image_embed",
            "high_res_feats_0",
            "high_res_feats_1",
        )
    )


def example_inputs(family: str, *, points: int = 4, crop_hw=(96, 128), seed: int = 0):
    """Random features + a feed of :func:`serving.everything.graph_feeds` (for tracing)."""
    rng = np.random.default_rng(seed)
    shapes = {
        "image_embeddings": (1, 256, 64, 64),
        "image_embed": (1, 256, 64, 64),
        "high_res_feats_0": (1, 32, 256, 256),
        "high_res_feats_1": (1, 64, 128, 128),
    }
    feats = {n: rng.standard_normal(shapes[n]).astype(np.float32) for n in feature_names(family)}
    params = ev.EverythingParams(pred_iou_thresh=0.0, stability_score_thresh=0.0)
    pts = rng.uniform(0, 1, (points, 2)) * np.array([crop_hw[1], crop_hw[0]])
    return feats | ev.graph_feeds(params, pts, crop_hw)


def export_everything_decoder(model: nn.Module, family: str, path: Path, *, opset: int = 17):
    """Trace :class:`EverythingDecoder` of a built official model into ``path``."""
    from triton_sam.export.onnx_utils import export_graph

    feeds = example_inputs(family)
    names = list(feature_names(family)) + list(ev.GRAPH_INPUTS)
    args = tuple(torch.from_numpy(np.asarray(feeds[n])) for n in names)
    dynamic = {ev.IN_POINTS: {0: "points"}}
    dynamic |= {o: {0: "kept"} for o in ev.GRAPH_OUTPUTS}
    dynamic[ev.OUT_MASKS] = {0: "kept", 1: "height", 2: "width"}
    return export_graph(
        EverythingDecoder(model, family).eval(),
        args,
        path,
        input_names=names,
        output_names=list(ev.GRAPH_OUTPUTS),
        dynamic_axes=dynamic,
        opset=opset,
    )


def export_for_spec(
    spec: Any, checkpoint: Path | None, out_dir: Path, *, opset: int = 17, verify: bool = True
) -> Path:
    """Build ``spec``'s official model from ``checkpoint`` and export its everything-decoder
    to ``out_dir/<family>_everything_decoder.onnx``; with ``verify``, onnxruntime is checked
    against torch on random features (every case of ``verify_graph``).

    Raises:
        ExportError / ExportValidationError: the export failed or disagrees with torch.
    """
    from triton_sam.export import exporter_for

    family = spec.family.family
    model = exporter_for(spec).build_model(spec, checkpoint)
    path = export_everything_decoder(model, family, out_dir / f"{ev.graph_name(family)}.onnx")
    if verify:
        verify_graph(model, family, path)
    return path


# Masks: a pixel whose upsampled logit is within float32 rounding of mask_threshold may
# flip between torch and onnxruntime; 1e-3 of the pixels is ~100x what is measured (0 on
# the cases here). Predicted IoU: the decoder's output, float32 reassociation only
# (measured <= 2e-7, as the predictor parity tests' 1e-5 bound).
VERIFY_MASK_FRACTION = 1e-3
VERIFY_SCORE_ATOL = 1e-5
# Stability: |logits > t + o| / |logits > t - o| is a ratio of pixel counts, not a float
# computed from the outputs. A pixel whose logit sits within rounding of a cut-off flips
# between torch and onnxruntime and moves the ratio by up to 1 / union <= 1 / area (the union
# holds the mask: t - o <= mask_threshold). With logits of real SAM magnitudes (tens),
# rounding is ~1e-6 absolute and a pixel or two of a mask do flip: an absolute 1e-5 refused
# good exports (0.000169 on a seeded SAM2.1-tiny). The bound is counted in pixels, as in the
# parity tests (tests/parity/test_everything_parity.py, "stability within 4/area").
VERIFY_STABILITY_PIXELS = 4


def stability_bound(masks: np.ndarray) -> np.ndarray:
    """Per mask, how far two correct stability scores may differ: a few flipped pixels over
    the mask's area (float64 [K]; ``masks`` bool [K, H, W], an empty mask counts as 1)."""
    area = masks.reshape(masks.shape[0], -1).sum(-1)
    return VERIFY_STABILITY_PIXELS / np.maximum(area, 1)


def compare_outputs(got: list[np.ndarray], want: list[np.ndarray], case: str) -> list[str]:
    """Every output of :data:`serving.everything.GRAPH_OUTPUTS` of onnxruntime (``got``) that
    disagrees with torch's (``want``) beyond the bounds above, one line each."""
    problems = []
    masks = want[list(ev.GRAPH_OUTPUTS).index(ev.OUT_MASKS)]
    for name, a, b in zip(ev.GRAPH_OUTPUTS, got, want, strict=True):
        if a.shape != b.shape:
            problems.append(f"{name} ({case}): shape {a.shape}, torch {b.shape}")
        elif not a.size:
            continue
        elif name == ev.OUT_MASKS:
            if (a != b).mean() > VERIFY_MASK_FRACTION:
                problems.append(f"{name} ({case}): {(a != b).mean():.2%} pixels differ")
        elif name == ev.OUT_IOU:
            if np.abs(a - b).max() > VERIFY_SCORE_ATOL:
                problems.append(f"{name} ({case}): max diff {np.abs(a - b).max():.3g}")
        elif name == ev.OUT_STABILITY:
            diff = np.abs(a.astype(np.float64) - b)
            bound = stability_bound(masks)
            if (diff > bound).any():
                pixels = (diff / bound).max() * VERIFY_STABILITY_PIXELS
                problems.append(
                    f"{name} ({case}): max diff {diff.max():.3g}, {pixels:.1f} pixels of a "
                    f"mask's area (bound {VERIFY_STABILITY_PIXELS})"
                )
        elif not np.array_equal(a, b):
            problems.append(f"{name} ({case}): differs")
    return problems


def verify_graph(model: nn.Module, family: str, path: Path, *, seed: int = 1) -> None:
    """onnxruntime vs torch on random features, plain and (SAM2) m2m, multimask and single.

    Args:
        model: the built official model the graph was traced from.
        family: ``"sam1"`` or ``"sam2"``.
        path: the exported graph.
        seed: seed of the random features and prompt points.

    Raises:
        ExportValidationError: listing every output that disagrees.
    """
    import onnxruntime as ort

    from triton_sam.errors import ExportValidationError

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    module = EverythingDecoder(model, family).eval()
    names = list(feature_names(family)) + list(ev.GRAPH_INPUTS)
    problems = []
    for m2m in (False, True) if family == "sam2" else (False,):
        for multi in (True, False):
            feeds = example_inputs(family, points=5, crop_hw=(70, 90), seed=seed)
            feeds[ev.IN_USE_M2M] = np.array([m2m])
            feeds[ev.IN_MULTIMASK] = np.array([multi])
            got = session.run(list(ev.GRAPH_OUTPUTS), feeds)
            with torch.no_grad():
                want = module(*[torch.from_numpy(np.asarray(feeds[n])) for n in names])
            want = [w.numpy() for w in want]
            problems += compare_outputs(got, want, f"m2m={m2m} multimask={multi}")
    if problems:
        raise ExportValidationError(path.name, problems)
