"""The ONNX-exportable wrappers of ``Sam3Model``: vision, text, exemplar and decoder graphs.

Each calls upstream's own code (``get_vision_features``, ``get_text_features``,
``geometry_encoder``, ``Sam3Model.forward``), so the graphs compute what transformers
computes; the decoder adds the processor's scoring, the threshold and a top-k, as arithmetic
(no data-dependent branch).
"""

from __future__ import annotations

import torch

from triton_sam.export.wrapper import ModelWrapper


class ConceptVision(ModelWrapper):
    """pixel_values [B,3,1008,1008] -> fpn_features.0/1/2 [B,C,288,288], [B,C,144,144],
    [B,C,72,72]."""

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.model.get_vision_features(pixel_values).fpn_hidden_states[:-1])


class ConceptText(ModelWrapper):
    """input_ids, attention_mask [B,32] int64 -> text_features [B,32,C]."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model.get_text_features(
            input_ids=input_ids, attention_mask=attention_mask
        ).pooler_output


class ConceptExemplars(ModelWrapper):
    """One image's coarsest features and its exemplar boxes -> the exemplar prompt tokens.

    What ``Sam3Model.forward`` computes from ``input_boxes`` / ``input_boxes_labels`` when
    none is padding (label -10): ``geometry_encoder`` on the 72x72 level (ROI-aligned box
    features, the box coordinates and their sine encoding, a positive/negative label
    embedding, then one CLS token and the encoder's layers, which cross-attend to the image).

    Inputs (G = boxes, at least 1):
        fpn_features.2 [1,C,72,72] as the vision graph returns it; exemplar_boxes [1,G,4]
        float32 (cx, cy, w, h) normalised to [0, 1] by the original image's width and height
        (what ``Sam3Processor`` sends as ``input_boxes``); exemplar_labels [1,G] int64, 1 for a
        positive example of the concept, 0 for a negative one.
    Outputs:
        exemplar_features [1,G+1,C]: the G box tokens then the CLS token, every one valid.
        They follow the text tokens in the decoder's prompt.

    One image per call: upstream hands ``roi_align`` one box tensor per image
    (``boxes.unbind(0)``), which the tracer unrolls for the traced batch, so the graph is
    served with a batch of 1 (the serving model encodes one image's boxes per call anyway).
    """

    def forward(
        self, fpn_2: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        position = position_encoding(self.model, fpn_2)
        valid = torch.ones(labels.shape, dtype=torch.bool)
        out = self.model.geometry_encoder(
            box_embeddings=boxes,
            box_mask=valid,
            box_labels=labels,
            img_feats=(fpn_2,),
            img_pos_embeds=(position,),
        )
        return out.last_hidden_state


class ConceptDecoder(ModelWrapper):
    """One image's features x N prompts -> the instances each prompt keeps.

    Inputs (B = images, N = prompts per image, C = width, P = tokens per prompt):
        fpn_features.0/1/2 as the vision graph returns them; prompt_features [B,N,P,C] and
        prompt_mask [B,N,P] int64: a phrase's 32 text tokens and their attention mask (as the
        text graph / tokenizer give them), followed by its exemplar tokens (the exemplar
        graph's, every one valid: mask 1) if it has any; threshold [B,1] float32;
        max_instances [B,1] int64 (>= 1).

    ``Sam3Model.forward`` with ``input_boxes`` concatenates the same tokens and masks (text,
    then geometry) before the DETR encoder; past that point it reads only the concatenation,
    so passing it as ``text_embeds`` computes what upstream computes with boxes.
    Outputs (K = the most instances any phrase of the batch keeps, at least 1):
        scores [B,N,K] = sigmoid(logit) x sigmoid(presence); boxes [B,N,K,4] (x0, y0, x1, y1)
        normalised to [0, 1]; masks [B,N,K,288,288] mask logits; query_index [B,N,K] int64;
        num_instances [B,N] int64; presence [B,N] = sigmoid(presence logit).

    Prompt (b, n) keeps the queries whose score exceeds ``threshold`` (Sam3Processor's
    ``scores > threshold``), at most ``max_instances`` of them (the highest scores), in query
    order as the processor returns them: its first ``num_instances[b, n]`` entries; the rest
    of its K entries are padding (the next-best queries, scores at or below the threshold).
    """

    def forward(
        self,
        fpn_0: torch.Tensor,
        fpn_1: torch.Tensor,
        fpn_2: torch.Tensor,
        prompt_features: torch.Tensor,
        prompt_mask: torch.Tensor,
        threshold: torch.Tensor,
        max_instances: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        from transformers.modeling_outputs import BaseModelOutputWithPooling
        from transformers.models.sam3.modeling_sam3 import Sam3VisionEncoderOutput

        batch, phrases = prompt_features.shape[0], prompt_features.shape[1]
        features = [_tile(f, phrases) for f in (fpn_0, fpn_1, fpn_2)]
        vision = Sam3VisionEncoderOutput(
            # Sam3Model.forward drops the last level (the 0.5 scale); None stands in for it.
            fpn_hidden_states=(*features, None),
            fpn_position_encoding=(*(position_encoding(self.model, f) for f in features), None),
        )
        text = BaseModelOutputWithPooling(pooler_output=prompt_features.flatten(0, 1))
        out = self.model(
            vision_embeds=vision, text_embeds=text, attention_mask=prompt_mask.flatten(0, 1)
        )
        presence = out.presence_logits.sigmoid()  # [BN, 1]
        scores = out.pred_logits.sigmoid() * presence  # [BN, Q], post_process_* order
        selected, kept = _select(scores, _per_phrase(threshold, phrases), max_instances, phrases)
        flat = selected + scores.shape[-1] * torch.arange(scores.shape[0])[:, None]
        flat = flat.reshape(-1)
        size = out.pred_masks.shape[-2:]
        masks = out.pred_masks.flatten(0, 1).index_select(0, flat)
        return (
            scores.reshape(-1).index_select(0, flat).reshape(batch, phrases, -1),
            out.pred_boxes.flatten(0, 1).index_select(0, flat).reshape(batch, phrases, -1, 4),
            masks.reshape(batch, phrases, -1, *size),
            selected.reshape(batch, phrases, -1),
            kept.reshape(batch, phrases),
            presence.reshape(batch, phrases),
        )


def position_encoding(model: torch.nn.Module, features: torch.Tensor) -> torch.Tensor:
    """The sine position encoding of a feature level [B, C, H, W], as upstream's vision neck
    builds it: a constant of the level's shape. Built for batch 1 and expanded, so the traced
    graph keeps the batch dim symbolic instead of baking it in."""
    encode = model.vision_encoder.neck.position_encoding
    one = encode((1, *features.shape[1:]), features.device, features.dtype)
    return one.expand(features.shape[0], -1, -1, -1)


def _tile(features: torch.Tensor, phrases: int) -> torch.Tensor:
    """[B, C, H, W] -> [B*N, C, H, W]: each image once per phrase (a view, then one copy)."""
    return features[:, None].expand(-1, phrases, -1, -1, -1).flatten(0, 1)


def _per_phrase(values: torch.Tensor, phrases: int) -> torch.Tensor:
    """[B, 1] per-image values -> [B*N, 1], one row per (image, phrase)."""
    return values.reshape(-1, 1).expand(-1, phrases).reshape(-1, 1)


def _select(
    scores: torch.Tensor, threshold: torch.Tensor, max_instances: torch.Tensor, phrases: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices [BN, K] of the kept queries (query order, padding last) and counts [BN].

    Arithmetic, not branches: sort all queries by score, take the first K = max kept count
    (at least 1, so no tensor has a zero dim), then order each row's kept entries by query
    index and push its padding entries (index + Q) behind them.
    """
    queries = scores.shape[-1]
    limit = _per_phrase(max_instances, phrases).reshape(-1)
    kept = torch.minimum((scores > threshold).sum(-1), limit)  # [BN]
    k = kept.max().clamp(min=1)
    _, order = torch.topk(scores, queries, dim=-1)  # every query, best first
    rank = torch.arange(k)  # traced as a Range on the computed k
    candidates = order.index_select(1, rank)
    is_kept = rank[None, :] < kept[:, None]
    keys, _ = torch.sort(torch.where(is_kept, candidates, candidates + queries), dim=-1)
    return torch.remainder(keys, queries), kept
