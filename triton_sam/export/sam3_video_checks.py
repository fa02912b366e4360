"""Verification cases of the SAM3 video graphs: feeds and the outputs upstream's own code
path gives for them (``Sam3TrackerVideoModel``'s methods, not the export wrappers).

- video_encoder: ``get_image_features``;
- video_decoder: ``_single_frame_forward`` on an initial conditioning frame (box + click,
  one mask), a tracked frame with one click (multimask) and a frame without prompts;
- memory_encoder: ``_encode_new_memory`` (binarised and sigmoid masks, a present and an
  absent object), compared with its stored bfloat16 memory;
- memory_attention: ``_prepare_memory_conditioned_features`` on a real inference session
  holding conditioning and recent frames, the graph fed what ``tracking.memory`` selects
  (so the selection is checked against upstream's too).

The last case of each graph is the one traced.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from triton_sam.serving.tracking.config import TrackerConfig
from triton_sam.serving.tracking.memory import select_memories

Case = tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]
_F32 = np.float32


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy().astype(_F32)


def verification_cases(
    model: nn.Module, config: TrackerConfig, rng: np.random.Generator
) -> dict[str, list[Case]]:
    """Cases per graph key (see the module docstring)."""
    from triton_sam.export.sam3_video_graphs import (
        memory_position_encoding,
        vision_position_encoding,
    )

    size, feat, hidden = config.image_size, config.feat_size, config.hidden_dim
    with torch.no_grad():
        image = torch.from_numpy(rng.standard_normal((1, 3, size, size)).astype(_F32))
        out = model.get_image_features(image, return_dict=True)
        sizes = [tuple(s) for s in model.backbone_feature_sizes]
        levels = [
            f.permute(1, 2, 0).reshape(1, f.shape[2], *s)
            for f, s in zip(out.fpn_hidden_states, sizes, strict=True)
        ]
        vision, high_0, high_1 = levels[2], levels[0], levels[1]
        cases: dict[str, list[Case]] = {
            "video_encoder": [
                (
                    "frame",
                    {"image": image.numpy()},
                    {
                        "vision_feats": _np(vision),
                        "high_res_feats_0": _np(high_0),
                        "high_res_feats_1": _np(high_1),
                    },
                )
            ]
        }
        decoder = [
            _decoder_case(model, "init box+click", vision, (high_0, high_1), rng, 1, True, False),
            _decoder_case(model, "no prompt", vision, (high_0, high_1), rng, 0, False, True),
            _decoder_case(model, "tracked click", vision, (high_0, high_1), rng, 1, False, True),
        ]
        cases["video_decoder"] = decoder
        # Logits of a disc, +-10 as a trained decoder gives (a random one's are ~0.01, where
        # binarising turns every rounding difference of the resize into a flipped pixel)
        side = 4 * feat
        yy, xx = np.mgrid[:side, :side]
        dist = np.hypot(yy - side * 0.4, xx - side * 0.55)
        low_res = torch.from_numpy((10 * np.tanh((side / 5 - dist) / 8)).astype(_F32)[None, None])
        cases["memory_encoder"] = [
            _memory_encoder_case(model, "binarised, present", vision, low_res, 3.0, True),
            _memory_encoder_case(model, "sigmoid, absent", vision, low_res, -2.0, False),
        ]
        cases["mask_prompt"] = [
            _mask_prompt_case(model, "empty mask", vision, (high_0, high_1), None),
            _mask_prompt_case(model, "disc", vision, (high_0, high_1), (0.45, 0.4, 0.2)),
        ]
        vision_pos = vision_position_encoding(model)
        memory_pos = memory_position_encoding(model)
        cases["memory_attention"] = [
            _memory_case(
                model,
                config,
                "cond 0 and 5, frame 3",
                vision,
                vision_pos,
                memory_pos,
                rng,
                frame=3,
                cond=(0, 5),
                non_cond=(1, 2),
                num_frames=6,
            ),
            _memory_case(
                model,
                config,
                "cond 0, frame 4",
                vision,
                vision_pos,
                memory_pos,
                rng,
                frame=4,
                cond=(0,),
                non_cond=(1, 2, 3),
                num_frames=6,
            ),
        ]
    _ = hidden
    return cases


def _decoder_case(
    model: nn.Module,
    label: str,
    vision: torch.Tensor,
    high_res: tuple[torch.Tensor, torch.Tensor],
    rng: np.random.Generator,
    clicks: int,
    init: bool,
    multimask: bool,
) -> Case:
    size = int(model.config.image_size)
    coords = rng.uniform(0, size, (clicks + (2 if init else 0), 2)).astype(_F32)
    labels = np.array(([2, 3] if init else []) + [1] * clicks, _F32)
    pix = vision + model.no_memory_embedding.reshape(1, -1, 1, 1) if init else vision
    points = torch.from_numpy(coords)[None, None] if len(coords) else None
    point_labels = torch.from_numpy(labels).to(torch.int32)[None, None] if len(coords) else None
    out = model._single_frame_forward(
        input_points=points,
        input_labels=point_labels,
        image_embeddings=[high_res[0], high_res[1], pix],
        multimask_output=multimask,
    )
    iou = out.iou_scores.reshape(1, -1)
    best = iou.max(dim=-1, keepdim=True).values if multimask else iou[:, :1]
    # the graph takes upstream's padding explicitly: (0, 0) labelled -1 once after the points,
    # twice (the "no point" point and its padding) when there are none
    pads = 1 if len(coords) else 2
    feed_coords = np.concatenate([coords, np.zeros((pads, 2), _F32)])
    feed_labels = np.concatenate([labels, np.full(pads, -1.0, _F32)])
    mask_size = model.prompt_encoder.mask_input_size[0]
    feeds = {
        "pix_feat": vision.numpy(),
        "high_res_feats_0": high_res[0].numpy(),
        "high_res_feats_1": high_res[1].numpy(),
        "point_coords": feed_coords[None],
        "point_labels": feed_labels[None],
        "mask_input": np.zeros((1, 1, mask_size, mask_size), _F32),
        "has_mask_input": np.zeros((1, 1), _F32),
        "multimask_output": np.full((1, 1), float(multimask), _F32),
        "add_no_mem_embed": np.full((1, 1), float(init), _F32),
    }
    expected = {
        "low_res_masks": _np(out.pred_masks.reshape(1, 1, mask_size, mask_size)),
        "obj_ptr": _np(out.object_pointer.reshape(1, -1)),
        "object_score_logits": _np(out.object_score_logits.reshape(1, 1)),
        "iou": _np(best),
    }
    return label, feeds, expected


def _memory_encoder_case(
    model: nn.Module,
    label: str,
    vision: torch.Tensor,
    low_res: torch.Tensor,
    score: float,
    from_pts: bool,
) -> Case:
    size = int(model.config.image_size)
    high_res = F.interpolate(low_res, size=(size, size), mode="bilinear", align_corners=False)
    scores = torch.full((1, 1), score)
    features, _ = model._encode_new_memory(
        current_vision_feats=vision.flatten(2).permute(2, 0, 1),
        pred_masks_high_res=high_res,
        object_score_logits=scores,
        is_mask_from_pts=from_pts,
    )
    feat = vision.shape[-1]
    stored = features.float().permute(1, 2, 0).reshape(1, -1, feat, feat)
    feeds = {
        "vision_feats": vision.numpy(),
        "low_res_masks": low_res.numpy(),
        "object_score_logits": scores.numpy(),
        "is_mask_from_pts": np.full((1, 1), float(from_pts), _F32),
    }
    return label, feeds, {"maskmem_features": _np(stored)}


class _Stored:
    """One frame's stored output, as the selection sees it."""

    def __init__(self, maskmem: torch.Tensor, pointer: torch.Tensor) -> None:
        self.maskmem, self.pointer = maskmem, pointer


def _memory_case(
    model: nn.Module,
    config: TrackerConfig,
    label: str,
    vision: torch.Tensor,
    vision_pos: torch.Tensor,
    memory_pos: torch.Tensor,
    rng: np.random.Generator,
    *,
    frame: int,
    cond: tuple[int, ...],
    non_cond: tuple[int, ...],
    num_frames: int,
) -> Case:
    from transformers.models.sam3_tracker_video.modeling_sam3_tracker_video import (
        Sam3TrackerVideoInferenceSession,
    )

    feat, mem, hidden = config.feat_size, config.mem_dim, config.hidden_dim
    session = Sam3TrackerVideoInferenceSession(
        video=torch.zeros(num_frames, 3, 4, 4), dtype=torch.float32
    )
    obj_idx = session.obj_id_to_idx(1)
    stored: dict[str, dict[int, Any]] = {"cond_frame_outputs": {}, "non_cond_frame_outputs": {}}
    for key, frames in (("cond_frame_outputs", cond), ("non_cond_frame_outputs", non_cond)):
        for t in frames:
            maskmem = torch.from_numpy(rng.standard_normal((feat * feat, 1, mem)).astype(_F32))
            maskmem = maskmem.to(torch.bfloat16)
            pointer = torch.from_numpy(rng.standard_normal((1, hidden)).astype(_F32))
            session.output_dict_per_obj[obj_idx][key][t] = {
                "maskmem_features": maskmem,
                "maskmem_pos_enc": memory_pos,
                "object_pointer": pointer,
            }
            stored[key][t] = _Stored(maskmem, pointer)
    expected = model._prepare_memory_conditioned_features(
        inference_session=session,
        frame_idx=frame,
        obj_idx=obj_idx,
        is_initial_conditioning_frame=False,
        current_vision_features=vision.flatten(2).permute(2, 0, 1),
        current_vision_positional_embeddings=vision_pos,
        num_total_frames=num_frames,
    )
    selection = select_memories(
        config, frame, stored["cond_frame_outputs"], stored["non_cond_frame_outputs"], num_frames
    )
    memory = torch.stack(
        [o.maskmem.float().permute(1, 2, 0).reshape(mem, feat, feat) for o in selection.memories]
    )
    pointers = torch.cat([o.pointer for o in selection.pointers])
    feeds = {
        "vision_feats": vision.numpy(),
        "memory": memory[None].numpy(),
        "memory_tpos": np.array([selection.memory_tpos], np.int64),
        "obj_ptrs": pointers[None].numpy(),
        "obj_ptr_tpos": selection.pointer_tpos[None],
    }
    return label, feeds, {"pix_feat": _np(expected)}


def _mask_prompt_case(
    model: nn.Module,
    label: str,
    vision: torch.Tensor,
    high_res: tuple[torch.Tensor, torch.Tensor],
    disc: tuple[float, float, float] | None,
) -> Case:
    """A binary mask through ``_use_mask_as_output`` and the memory upstream's ``forward``
    encodes of its output (binarised: a prompt's mask)."""
    size = int(model.config.image_size)
    mask = np.zeros((1, 1, size, size), _F32)
    if disc is not None:
        yy, xx = np.mgrid[:size, :size] / size
        cy, cx, radius = disc
        mask[0, 0] = np.hypot(yy - cy, xx - cx) < radius
    inputs = torch.from_numpy(mask)
    out = model._use_mask_as_output(vision, [high_res[0], high_res[1]], inputs)
    features, _ = model._encode_new_memory(
        current_vision_feats=vision.flatten(2).permute(2, 0, 1),
        pred_masks_high_res=out.high_res_masks,
        object_score_logits=out.object_score_logits.reshape(1, 1),
        is_mask_from_pts=True,
    )
    feat = vision.shape[-1]
    stored = features.float().permute(1, 2, 0).reshape(1, -1, feat, feat)
    expected = {
        "obj_ptr": _np(out.object_pointer.reshape(1, -1)),
        "object_score_logits": _np(out.object_score_logits.reshape(1, 1)),
        "maskmem_features": _np(stored),
    }
    return label, {"vision_feats": vision.numpy(), "mask": mask}, expected
