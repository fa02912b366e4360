"""Exemplar boxes in concept tracking in video: the reference through transformers'
``Sam3VideoModel`` and ours, on the clip and model of ``tests/concept_video_e2e_support.py``.

transformers' video model has no box input (``Sam3VideoProcessor.add_text_prompt`` only), so
the reference fills the prompt's cached embeddings before the propagation: ``run_detection``
reads ``inference_session.prompt_embeddings[prompt_id]`` (the text features it would
otherwise compute once) and ``prompt_attention_masks[prompt_id]``. :func:`add_exemplar` puts
there upstream's own text features followed by upstream's own geometry encoder output on the
exemplar's frame (``Sam3Model.forward``'s concatenation of ``text_embeds`` and the
``input_boxes`` tokens, with the boxes as ``Sam3Processor`` normalises them), so every frame's
detection runs upstream's detector on the phrase plus that exemplar. Nothing else of upstream
changes.

The exemplar: on frame 1, a positive box around the red rectangle and a negative one around
the green rectangle (:func:`sam3_video_support.frames`: frame 1 has them at rows 64:144,
columns 58:158 and rows 100:200, columns 195:275).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np
from concept_video_e2e_support import SETTINGS as PHRASE_SETTINGS
from concept_video_e2e_support import THRESHOLD_NAMES, clip, tokens

FRAME = 1
BOXES = ((58.0, 64.0, 158.0, 144.0), (195.0, 100.0, 275.0, 200.0))  # (x0, y0, x1, y1) pixels
LABELS = (1, 0)
# The thresholds of the prompt of these boxes alone ("visual"): the exemplar moves every
# query's score, so the phrase's thresholds would keep 150 or more queries per frame.
# Measured: frame 0's third highest probability is 0.7758 and its fourth 0.7729, above any of
# frames 1 and 2 (at most 0.7636); 0.7744 sits 1.4e-3 from the nearest.
THRESHOLD = 0.7744
SETTINGS = replace(PHRASE_SETTINGS, **dict.fromkeys(THRESHOLD_NAMES, THRESHOLD))


def upstream_boxes(frame_idx: int = FRAME, boxes=BOXES, labels=LABELS):
    """(float32 [1, G, 4] normalised cxcywh, int64 [1, G]) as ``Sam3Processor`` makes
    ``input_boxes`` / ``input_boxes_labels`` from pixel boxes on the frame."""
    from transformers import Sam3ImageProcessor, Sam3Processor

    from triton_sam.export.sam3_concept import toy_tokenizer

    proc = Sam3Processor(image_processor=Sam3ImageProcessor(), tokenizer=toy_tokenizer())
    out = proc(
        images=clip()[frame_idx],
        input_boxes=[[list(b) for b in boxes]],
        input_boxes_labels=[list(labels)],
        return_tensors="pt",
    )
    return out["input_boxes"].float(), out["input_boxes_labels"].long()


@lru_cache(maxsize=4)
def exemplar_preparation(frame_idx: int = FRAME, boxes=BOXES, labels=LABELS):
    """``prepare(model, session)`` for ``transformers_run``: prompt 0's cached embeddings
    become its text features followed by the geometry encoder's tokens of the boxes on
    ``frame_idx`` (cached so that equal arguments give the same function, and the run's
    cache hits)."""

    def add_exemplar(model, session) -> None:
        import torch

        detector = model.detector_model
        input_boxes, input_labels = upstream_boxes(frame_idx, boxes, labels)
        with torch.no_grad():
            text = detector.get_text_features(
                input_ids=session.prompt_input_ids[0],
                attention_mask=session.prompt_attention_masks[0],
                return_dict=True,
            )
            pixels = session.get_frame(frame_idx).unsqueeze(0)
            vision = detector.get_vision_features(pixel_values=pixels)
            # as Sam3Model.forward calls it with input_boxes (every box valid)
            geometry = detector.geometry_encoder(
                box_embeddings=input_boxes,
                box_mask=torch.ones(input_labels.shape, dtype=torch.bool),
                box_labels=input_labels,
                img_feats=vision.fpn_hidden_states[:-1],
                img_pos_embeds=vision.fpn_position_encoding[:-1],
            )
        mask = session.prompt_attention_masks[0]
        text.pooler_output = torch.cat([text.pooler_output, geometry.last_hidden_state], dim=1)
        session.prompt_embeddings[0] = text
        session.prompt_attention_masks[0] = torch.cat(
            [mask, geometry.attention_mask.to(mask.dtype)], dim=1
        )

    return add_exemplar


def our_prompt(phrase: str, frame_idx: int = FRAME, boxes=BOXES, labels=LABELS):
    """Our ``ConceptPrompt`` of ``phrase`` with the boxes on ``frame_idx``, normalised by the
    serving code (:func:`triton_sam.serving.concept_exemplars.normalised_cxcywh`)."""
    from triton_sam.serving.concept_exemplars import normalised_cxcywh
    from triton_sam.serving.concept_video.prompts import ConceptPrompt, Exemplar

    hw = clip()[frame_idx].shape[:2]
    exemplar = Exemplar(
        frame_idx,
        normalised_cxcywh(np.array(boxes, np.float64), hw),
        np.array(labels, np.int64),
    )
    return ConceptPrompt(*tokens(phrase), exemplar)


__all__ = ["SETTINGS", "THRESHOLD", "exemplar_preparation", "our_prompt", "upstream_boxes"]
