"""The prompts of a concept-tracking session: a phrase, exemplar boxes drawn on one frame, or
both.

A prompt is a phrase's 32 tokens, optionally followed by the tokens of exemplar boxes
(``Sam3Model``'s geometry encoder: the boxes' ROI-aligned features, their coordinates and
labels, then a CLS token, cross-attending to the frame's 72x72 level). The exemplar is encoded
once, on the features of the frame it was drawn on, and its tokens follow the phrase's text
tokens in every frame's detection, as the ``sam3_concept`` model applies an exemplar kept from
one image to later images (``Sam3Model.forward`` concatenates text then geometry tokens). A
prompt of boxes alone carries ``Sam3Processor``'s phrase for that case, ``"visual"``.

Upstream differs on later frames: transformers' ``Sam3VideoModel`` takes no boxes at all, and
facebookresearch/sam3 (``Sam3VideoInference.add_prompt``) encodes a box on its own frame and
applies it to that frame's detection only; with boxes alone, later frames find nothing new and
only track what that frame found. Here the exemplar keeps finding its concept on every frame,
so an instance that enters later (a cell appearing deeper in a z-stack) is found too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Exemplar:
    """Exemplar boxes drawn on one frame.

    Attributes:
        frame_idx: the frame whose features encode them.
        boxes: float32 [G, 4] (cx, cy, w, h) normalised by the frame's (W, H, W, H), as
            ``Sam3Processor`` sends ``input_boxes``
            (:func:`triton_sam.serving.concept_exemplars.normalised_cxcywh`).
        labels: int64 [G] 1 for a positive example, 0 for a negative one.
    """

    frame_idx: int
    boxes: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True)
class ConceptPrompt:
    """One prompt: a phrase's tokens and, optionally, an exemplar.

    Attributes:
        input_ids: int64 [32] the phrase's token ids (``Sam3Processor``'s tokenisation).
        attention_mask: int64 [32] 1 for a token, 0 for padding.
        exemplar: boxes whose tokens follow the phrase's, or None.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    exemplar: Exemplar | None = None


def as_prompt(value: ConceptPrompt | tuple[np.ndarray, np.ndarray]) -> ConceptPrompt:
    """A :class:`ConceptPrompt`; a (token ids, attention mask) pair is a phrase alone."""
    if isinstance(value, ConceptPrompt):
        return value
    ids, mask = value
    return ConceptPrompt(np.asarray(ids, np.int64), np.asarray(mask, np.int64))
