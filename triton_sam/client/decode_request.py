"""What both clients build before anything is sent (no I/O): the encoded image a prompt is
decoded on, and one validated prompt on it.

- :class:`EncodedImage`: the current image, either with its features here (the stateless
  decoder is sent them with every prompt) or as a :class:`~triton_sam.client.embedding_path.
  CachedImage` whose features the server keeps (the ``<family>_session`` model).
- :func:`decode_request`: validate a prompt (raising before anything is sent) and build the
  request for whichever path the image takes; :mod:`triton_sam.client.flow` sends it
  (:func:`~triton_sam.client.flow.predict`).
- :func:`check_embedding`: features encoded earlier, checked against the family's encoder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from triton_sam.client import embedding_path, prompts
from triton_sam.errors import InputValidationError
from triton_sam.models.spec import FamilySpec


@dataclass(eq=False)
class EncodedImage:
    """One encoded image: what every request made for it needs.

    Attributes:
        features: the encoder outputs by name (empty while the server keeps them).
        orig_hw: (H, W) of the original image.
        prepared: per asyncio transport (by ``id``), ``features`` encoded for the wire once,
            reused by every prompt on this image (see :meth:`prepared_for`).
        cached: the server's copy (server-side embeddings), else None.
    """

    features: dict[str, np.ndarray]
    orig_hw: tuple[int, int]
    prepared: dict[int, list[Any]] = field(default_factory=dict)
    cached: embedding_path.CachedImage | None = None

    def prepared_for(self, transport: Any) -> list[Any]:
        """``features`` as ``transport.prepare_inputs`` encodes them, made once per transport."""
        prepared = self.prepared.get(id(transport))
        if prepared is None:
            prepared = self.prepared.setdefault(
                id(transport), transport.prepare_inputs(self.features)
            )
        return prepared


@dataclass(frozen=True)
class Click:
    """One validated click for the session model (:meth:`CachedImage.click_inputs`).

    Attributes:
        inputs: the request (may refer to kept logits instead of carrying the mask).
        fallback: the request to resend after a miss (carries the mask itself).
        outputs: the (masks, scores) outputs of the family's layout, plus ``logits_key``
            where the server keeps logits (it answers the key it issued for this click's).
        multimask: three candidate masks instead of one.
    """

    inputs: dict[str, np.ndarray]
    fallback: dict[str, np.ndarray]
    outputs: tuple[str, ...]
    multimask: bool


@dataclass(frozen=True)
class DecodeRequest:
    """One validated prompt on one image, ready to send (stateless or session path).

    Attributes:
        image: the image it was made for (later images do not change it).
        inputs: the prompt tensors (stateless path) or the session model's request.
        outputs: the (masks, scores) decoder outputs of the family's layout.
        multimask: three candidate masks instead of one.
        click: session path: the click on the session model; None on the stateless path.
    """

    image: EncodedImage
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, str]
    multimask: bool = False
    click: Click | None = None


def decode_request(
    image: EncodedImage,
    family: FamilySpec,
    point_coords: Any,
    point_labels: Any,
    box: Any,
    mask_input: Any,
    multimask: bool,
) -> DecodeRequest:
    """Validate a prompt on ``image`` and build its request (the prompts as
    :meth:`SAM2TritonClient.predict` documents them).

    Raises:
        InputValidationError: a prompt has the wrong shape, values or range (named).
    """
    outputs = prompts.output_names(multimask, family)
    inputs = prompts.build_decoder_prompts(
        point_coords=point_coords,
        point_labels=point_labels,
        box=box,
        mask_input=mask_input,
        orig_hw=image.orig_hw,
        family=family,
    )
    if image.cached is None:
        return DecodeRequest(image, inputs, outputs, bool(multimask))
    click_inputs, fallback = image.cached.click_inputs(inputs, mask_input)
    click_outputs = embedding_path.click_outputs(outputs, family)
    click = Click(click_inputs, fallback, click_outputs, bool(multimask))
    return DecodeRequest(image, click_inputs, outputs, bool(multimask), click=click)


def check_embedding(
    embedding: Mapping[str, np.ndarray], original_size: tuple[int, int], family: FamilySpec
) -> EncodedImage:
    """An :class:`EncodedImage` of features encoded earlier.

    Args:
        embedding: every output of the family's encoder by name, float32 with batch
            dimension 1 (``image_embed`` [1, 256, 64, 64]...).
        original_size: (H, W) of the image they were computed from.

    Raises:
        InputValidationError: naming ``embedding`` or ``original_size``.
    """
    features = {}
    for spec in family.encoder_outputs:
        if spec.name not in embedding:
            raise InputValidationError(
                "embedding", f"missing {spec.name!r}; expected {list(family.embedding_names)}"
            )
        array = np.asarray(embedding[spec.name], dtype=np.float32)
        if array.shape != (1, *spec.shape):
            raise InputValidationError(
                "embedding", f"{spec.name!r} has shape {array.shape}, expected {(1, *spec.shape)}"
            )
        features[spec.name] = array
    size = tuple(original_size)
    if len(size) != 2 or not all(isinstance(v, int | np.integer) and v > 0 for v in size):
        raise InputValidationError(
            "original_size", f"got {original_size!r}, expected (H, W) positive integers"
        )
    return EncodedImage(features, (int(size[0]), int(size[1])))
