"""Concept segmentation, client side: pure request builders and the result type (no I/O).

The ``sam3_concept`` serving model (``triton_sam/serving/concept_model.py``) keeps each image's
features; :class:`ConceptImage` is one image from the client's side. The clients add the I/O:
``set_image`` asks whether the server holds the image's content id (:meth:`ConceptImage.
probe_inputs`) and sends the pixels only when it does not (:meth:`ConceptImage.embed_inputs`);
``predict_concepts`` sends the id and the prompts (:meth:`ConceptImage.predict_inputs`: phrases,
exemplar boxes, ids of exemplars kept by the server), and after a miss (evicted, server
restarted) resends them with the pixels, once.

Limits are the protocol's (``triton_sam.serving.protocol.concept``), checked here first so a
bad call fails before anything is sent; the server checks them again (and counts tokens).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from triton_sam.client.concept_exemplars import Exemplars
from triton_sam.errors import InputValidationError
from triton_sam.serving import images, masks
from triton_sam.serving.protocol import concept as protocol

MaskFormat = Literal["rle", "png", "logits", "none"]
MASK_FORMATS: tuple[str, ...] = ("rle", "png", "logits", "none")
_MASK_OUTPUT = {
    "rle": protocol.MASKS_RLE,
    "png": protocol.MASKS_PNG,
    "logits": protocol.MASKS_LOGITS,
}
_COMMON_OUTPUTS = (
    protocol.IMAGE_ID,
    protocol.IMAGE_SIZE,
    protocol.ENCODED,
    protocol.PRESENCE,
    protocol.NUM_INSTANCES,
    protocol.PHRASE_INDEX,
    protocol.QUERY_INDEX,
    protocol.SCORES,
    protocol.BOXES,
    protocol.EXEMPLAR_ID,
)


@dataclass(frozen=True)
class ConceptPrediction:
    """The instances of N prompts on one image, prompt by prompt, each in query order.

    Attributes:
        phrases: the phrases, as given; with exemplars and no phrase, the one prompt's
            phrase, ``"visual"`` (``Sam3Processor``'s for that case).
        image_size: (H, W) of the image.
        presence: float32 [N] probability that phrase i is in the image at all.
        phrase_index: int32 [K] which phrase each instance belongs to.
        query_index: int32 [K] the DETR query it came from (``Sam3Model``'s order).
        scores: float32 [K] sigmoid(logit) x presence, all above the threshold asked for.
        boxes: float32 [K, 4] (x0, y0, x1, y1) in pixels of the original image.
        masks: bool [K, H, W] at the original size (``mask_format`` "rle" or "png"), else None.
        rle: COCO RLE of each mask, ``{"size": [H, W], "counts": str}`` (``pycocotools``
            decodes it), for ``mask_format="rle"``; else None.
        low_res_logits: float32 [K, 288, 288] mask logits (``mask_format="logits"``), else None.
        exemplar_id: the id the server keeps this call's boxes under, for ``exemplar_ids``
            of later calls (on any image, this tenant only); None when no boxes were sent.
    """

    phrases: tuple[str, ...]
    image_size: tuple[int, int]
    presence: np.ndarray
    phrase_index: np.ndarray
    query_index: np.ndarray
    scores: np.ndarray
    boxes: np.ndarray
    masks: np.ndarray | None = None
    rle: list[dict[str, Any]] | None = None
    low_res_logits: np.ndarray | None = None
    exemplar_id: str | None = None

    def __len__(self) -> int:
        return int(self.scores.shape[0])

    def for_phrase(self, phrase: int | str) -> ConceptPrediction:
        """The instances of one phrase (by index or by text)."""
        i = self.phrases.index(phrase) if isinstance(phrase, str) else int(phrase)
        keep = np.flatnonzero(self.phrase_index == i)
        return ConceptPrediction(
            phrases=(self.phrases[i],),
            image_size=self.image_size,
            presence=self.presence[i : i + 1],
            phrase_index=np.zeros(len(keep), np.int32),
            query_index=self.query_index[keep],
            scores=self.scores[keep],
            boxes=self.boxes[keep],
            masks=None if self.masks is None else self.masks[keep],
            rle=None if self.rle is None else [self.rle[k] for k in keep],
            low_res_logits=None if self.low_res_logits is None else self.low_res_logits[keep],
        )

    def to_coco(self, *, image_id: int = 1, file_name: str = "") -> dict[str, Any]:
        """A COCO-style dict: one image, one category per phrase, one annotation per instance
        (``segmentation`` as RLE when the masks are known, ``bbox`` as [x, y, w, h])."""
        h, w = self.image_size
        annotations = []
        for k in range(len(self)):
            x0, y0, x1, y1 = (float(v) for v in self.boxes[k])
            annotation: dict[str, Any] = {
                "id": k + 1,
                "image_id": image_id,
                "category_id": int(self.phrase_index[k]) + 1,
                "bbox": [x0, y0, x1 - x0, y1 - y0],
                "score": float(self.scores[k]),
                "iscrowd": 0,
            }
            if self.masks is not None:
                rle = self.rle[k] if self.rle is not None else rle_of(self.masks[k])
                annotation["segmentation"] = rle
                annotation["area"] = int(self.masks[k].sum())
            annotations.append(annotation)
        return {
            "images": [{"id": image_id, "file_name": file_name, "height": h, "width": w}],
            "categories": [{"id": i + 1, "name": p} for i, p in enumerate(self.phrases)],
            "annotations": annotations,
        }


def rle_of(mask: np.ndarray) -> dict[str, Any]:
    """COCO RLE (``{"size": [H, W], "counts": str}``) of a bool [H, W] mask."""
    return {
        "size": [int(mask.shape[0]), int(mask.shape[1])],
        "counts": masks.encode_rle(mask).decode(),
    }


def check_phrases(
    text: str | Sequence[str], *, max_phrases: int = protocol.MAX_PHRASES
) -> list[str]:
    """Validate ``text`` (one phrase or several) as the server will.

    Raises:
        InputValidationError: (field ``text``) no phrase, too many, an empty one, one that is
            not a str, or one longer than the protocol's byte limit. Token counts (at most
            32) are checked by the server, which holds the tokenizer.
    """
    phrases = [text] if isinstance(text, str) else list(text)
    if not 1 <= len(phrases) <= max_phrases:
        raise InputValidationError(
            "text", f"got {len(phrases)} phrases, expected 1 to {max_phrases} per call"
        )
    for i, phrase in enumerate(phrases):
        if not isinstance(phrase, str):
            raise InputValidationError(
                "text", f"phrase {i} is {type(phrase).__name__}, expected str"
            )
        if not phrase.strip():
            raise InputValidationError(
                "text", f"phrase {i} is empty, expected a noun phrase such as 'red car'"
            )
        size = len(phrase.encode("utf-8"))
        if size > protocol.MAX_PHRASE_BYTES:
            raise InputValidationError(
                "text", f"phrase {i} is {size} bytes, expected at most {protocol.MAX_PHRASE_BYTES}"
            )
    return phrases


def check_options(
    threshold: float, mask_threshold: float, max_instances: int | None, mask_format: str
) -> None:
    """Validate the scalar options of ``predict_concepts``.

    Raises:
        InputValidationError: naming the option.
    """
    for name, value in (("threshold", threshold), ("mask_threshold", mask_threshold)):
        if not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
            raise InputValidationError(name, f"got {value!r}, expected a number in [0, 1]")
    if max_instances is not None and (
        not isinstance(max_instances, (int, np.integer))
        or isinstance(max_instances, bool)
        or max_instances < 1
    ):
        raise InputValidationError(
            "max_instances", f"got {max_instances!r}, expected an integer >= 1"
        )
    if mask_format not in MASK_FORMATS:
        raise InputValidationError(
            "mask_format", f"got {mask_format!r}, expected one of {list(MASK_FORMATS)}"
        )


def output_names(mask_format: str) -> tuple[str, ...]:
    """The outputs to ask for: boxes, scores and indices, plus the masks in one encoding."""
    extra = (_MASK_OUTPUT[mask_format],) if mask_format in _MASK_OUTPUT else ()
    return (*_COMMON_OUTPUTS, *extra)


def bytes_tensor(values: Sequence[str]) -> np.ndarray:
    """A [1, N] BYTES tensor (numpy object array) of UTF-8 strings."""
    return np.array([[v.encode("utf-8") for v in values]], dtype=np.object_)


@dataclass
class ConceptImage:
    """One image held by the serving model, from a client's side.

    Attributes:
        image_id: the content id the server keeps the features under (computed here the
            same way, :func:`triton_sam.serving.images.image_id`).
        orig_hw: (H, W) of the image.
        rgb: the HxWx3 uint8 pixels, kept to send them again after a miss.
    """

    image_id: str
    orig_hw: tuple[int, int]
    rgb: np.ndarray

    @classmethod
    def of(cls, rgb: np.ndarray, model: str) -> ConceptImage:
        """The image ``rgb`` (HxWx3 uint8) for the serving model ``model``.

        Raises:
            InputValidationError: (field ``image``) more pixels than the protocol allows.
        """
        try:
            rgb = images.check_rgb(rgb, max_pixels=protocol.MAX_IMAGE_PIXELS)
        except ValueError as e:
            raise InputValidationError("image", str(e).split(": ", 1)[-1]) from None
        hw = (int(rgb.shape[0]), int(rgb.shape[1]))
        return cls(images.image_id(rgb, protocol.image_namespace(model)), hw, rgb)

    def probe_inputs(self) -> dict[str, np.ndarray]:
        """Asks whether the server holds this image (a few bytes; a miss if it does not)."""
        return {protocol.IMAGE_ID: bytes_tensor([self.image_id])}

    def embed_inputs(self) -> dict[str, np.ndarray]:
        """Sends the pixels; the server keeps the features under the id it computes."""
        return {protocol.IMAGE: self.rgb[None]}

    def predict_inputs(
        self,
        phrases: Sequence[str],
        *,
        threshold: float,
        mask_threshold: float,
        max_instances: int | None,
        exemplars: Exemplars | None = None,
        with_pixels: bool = False,
    ) -> dict[str, np.ndarray]:
        """One call's inputs: the image id (or the pixels, after a miss), the phrases (none:
        the exemplars alone) and the exemplars."""
        inputs = self.embed_inputs() if with_pixels else self.probe_inputs()
        if phrases:
            inputs[protocol.TEXT] = bytes_tensor(phrases)
        if exemplars is not None and exemplars.boxes is not None:
            inputs[protocol.EXEMPLAR_BOXES] = exemplars.boxes[None]
            if exemplars.labels is not None:
                inputs[protocol.EXEMPLAR_LABELS] = exemplars.labels[None]
        if exemplars is not None and exemplars.ids:
            inputs[protocol.EXEMPLAR_IDS] = bytes_tensor(exemplars.ids)
        inputs[protocol.THRESHOLD] = np.array([[threshold]], np.float32)
        inputs[protocol.MASK_THRESHOLD] = np.array([[mask_threshold]], np.float32)
        if max_instances is not None:
            inputs[protocol.MAX_INSTANCES] = np.array([[max_instances]], np.int32)
        return inputs


def parse_prediction(
    out: dict[str, np.ndarray], phrases: Sequence[str], mask_format: str
) -> ConceptPrediction:
    """Turn the serving model's outputs (batch dim 1) into a :class:`ConceptPrediction`;
    RLE or PNG masks are decoded to bool [K, H, W]. ``phrases`` empty: exemplars alone, whose
    one prompt has the phrase ``"visual"``."""
    h, w = (int(v) for v in out[protocol.IMAGE_SIZE].reshape(-1))
    k = int(out[protocol.SCORES].shape[-1])
    exemplar_id = None
    if protocol.EXEMPLAR_ID in out:
        exemplar_id = bytes(out[protocol.EXEMPLAR_ID].reshape(-1)[0]).decode() or None
    prediction = {
        "exemplar_id": exemplar_id,
        "phrases": tuple(phrases) or (protocol.EXEMPLAR_ONLY_PHRASE,),
        "image_size": (h, w),
        "presence": out[protocol.PRESENCE].reshape(-1).astype(np.float32),
        "phrase_index": out[protocol.PHRASE_INDEX].reshape(-1).astype(np.int32),
        "query_index": out[protocol.QUERY_INDEX].reshape(-1).astype(np.int32),
        "scores": out[protocol.SCORES].reshape(-1).astype(np.float32),
        "boxes": out[protocol.BOXES].reshape(k, 4).astype(np.float32),
    }
    if mask_format == "rle":
        counts = [bytes(c) for c in out[protocol.MASKS_RLE].reshape(-1)]
        prediction["masks"] = _stack([masks.decode_rle(c, (h, w)) for c in counts], (h, w))
        prediction["rle"] = [{"size": [h, w], "counts": c.decode()} for c in counts]
    elif mask_format == "png":
        pngs = [bytes(p) for p in out[protocol.MASKS_PNG].reshape(-1)]
        prediction["masks"] = _stack([decode_png(p) for p in pngs], (h, w))
    elif mask_format == "logits":
        logits = out[protocol.MASKS_LOGITS]
        prediction["low_res_logits"] = logits.reshape(k, *logits.shape[-2:]).astype(np.float32)
    return ConceptPrediction(**prediction)


def decode_png(data: bytes) -> np.ndarray:
    """A mask PNG (``masks_png``) as a bool [H, W] array."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("L")) > 127


def _stack(arrays: list[np.ndarray], hw: tuple[int, int]) -> np.ndarray:
    return np.stack(arrays) if arrays else np.zeros((0, *hw), dtype=bool)
