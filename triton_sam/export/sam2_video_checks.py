"""Verification of the SAM2.1 video graphs: trace inputs and check cases per graph.

Each expected output comes from the official torch code path of ``SAM2Base`` /
``SAM2VideoPredictor`` (``_prepare_memory_conditioned_features``, ``_forward_sam_heads``,
``_encode_new_memory``, ``_use_mask_as_output``), not from the export wrappers, so a check
proves the wrapper and the graph together. Random-init weights decide which side of the
object-score gate a case lands on; the tests' checkpoint makes both occur.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from triton_sam.errors import ExportError
from triton_sam.export.sam2_memory_attention import MemoryAttentionGraph
from triton_sam.export.sam2_video import (
    MaskPromptGraph,
    MemoryEncoderGraph,
    VideoDecoderGraph,
    VideoEncoder,
)
from triton_sam.serving.tracking.config import TrackerConfig

Case = tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]


class VerificationCases:
    """Trace inputs and verification cases per graph, each expected output computed by the
    official torch code path of SAM2Base / SAM2VideoPredictor."""

    def __init__(self, model: nn.Module, tracker_config: TrackerConfig, rng: np.random.Generator):
        self.model, self.tracker_config, self.rng = model, tracker_config, rng
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
        from triton_sam.serving.tracking.memory import select_memories

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
            self.tracker_config,
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
