"""Server-side embeddings, client side: pure request builders shared by both clients (no I/O).

With the ``<family>_session`` model on the server (``serving/embedding_cache_model.py``), an image
is sent once (``embed``: the file's bytes unchanged, or uint8 pixels for an array; the server
decodes and preprocesses them) and its features stay on the server;
a click then carries the image id and the prompt tensors only (a few hundred bytes instead of
4-21 MiB of features). This module builds those requests; :class:`CachedImage` is the
client-side state of one embedded image. The sync and async clients only add the I/O and the
one retry: on :class:`~triton_sam.errors.EmbeddingNotFoundError` (evicted, server restarted)
they embed again (:meth:`CachedImage.embed_inputs`) and resend
:meth:`CachedImage.fallback_inputs`.

The image id is computed by the SERVER from what it received (``serving/intake.py``: blake2b-128
over the session and encoder model names, the family's preprocessing and the decoded RGB
pixels with their shape) and answered with the embed; the client computes the same function
of the same pixels only to probe before uploading, and adopts the server's answer when they
differ (e.g. a server whose JPEG decoder differs). A client can never make the server keep
features under an id of its choosing.

Refinement without resending the mask: every click asks for the output ``logits_key``, so the
server keeps its low-res logits and answers a key it issued for them (random, bound to the
image and the tenant: a client never chooses one); when a later ``mask_input`` is exactly one
of the masks of a recent prediction of this image, the click names it (``previous_key`` +
index) instead of sending 256 KiB. If the server no longer has it (evicted, restarted, or a
key it never issued), the retry sends the mask itself.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from triton_sam.errors import InputValidationError
from triton_sam.models.spec import FamilySpec
from triton_sam.serving import bounds, images, intake
from triton_sam.serving.protocol.embedding_cache import (  # the protocol's names, re-exported
    DEFAULT_LOGITS_PER_IMAGE,
    ENCODED,
    HAS_MASK_INPUT,
    IMAGE_BYTES,
    IMAGE_ID,
    IMAGE_RGB,
    LOGITS_KEY,
    MASK_INPUT,
    MASK_OUTPUTS,
    PREVIOUS_KEY,
    PREVIOUS_MASK_INDEX,
    keeps_logits,
)

# Recent predictions remembered per image for refinement by reference; the server keeps
# ``logits_per_image`` (SessionOptions) of them.
RECENT_PREDICTIONS = DEFAULT_LOGITS_PER_IMAGE


EMBED_OUTPUTS = (ENCODED, IMAGE_ID)


def image_id(
    rgb: np.ndarray, family: FamilySpec, encoder_model: str, session_model: str | None = None
) -> str:
    """The id the session model computes for ``rgb``: 32 hex chars of blake2b-128.

    Args:
        rgb: HxWx3 uint8 RGB image (``image_io.load_image``'s output).
        family: the family (its preprocessing is part of the id).
        encoder_model: the Triton encoder the features come from.
        session_model: the session model (default the family's).
    """
    namespace = intake.session_namespace(
        session_model or family.session_model,
        encoder_model,
        intake.preprocessing_json(family.preprocessing),
        "rgb",
    )
    return images.image_id(rgb, namespace)


def bytes_tensor(value: str) -> np.ndarray:
    """A [1, 1] BYTES tensor (numpy object array) holding ``value`` as utf-8."""
    return np.array([[value.encode("utf-8")]], dtype=np.object_)


def probe_inputs(image: str) -> dict[str, np.ndarray]:
    """Inputs asking whether the server holds ``image`` (answers ``encoded`` = 0, or a miss)."""
    return {IMAGE_ID: bytes_tensor(image)}


def embed_inputs(rgb: np.ndarray, encoded: bytes | None = None) -> dict[str, np.ndarray]:
    """Inputs that embed an image: the file's bytes as they are (``image_bytes``) when given
    and within :data:`~triton_sam.serving.bounds.MAX_IMAGE_BYTES`, else the uint8 pixels
    (``image_rgb`` [1, H, W, 3]). The server decodes, preprocesses and ids them itself.

    Raises:
        InputValidationError: (``image``) more pixels than the server accepts.
    """
    try:
        bounds.check_image_size(
            int(rgb.shape[0]), int(rgb.shape[1]), max_pixels=bounds.MAX_IMAGE_PIXELS
        )
    except bounds.RequestError as e:
        raise InputValidationError("image", str(e).removeprefix("image: ")) from None
    if encoded is not None and len(encoded) <= bounds.MAX_IMAGE_BYTES:
        return {IMAGE_BYTES: np.array([[encoded]], dtype=np.object_)}
    return {IMAGE_RGB: np.ascontiguousarray(rgb)[None]}


def click_outputs(outputs: tuple[str, ...], family: FamilySpec) -> tuple[str, ...]:
    """The outputs of a click on the session model: the decoder's ``outputs``, plus
    ``logits_key`` (keep this click's logits for refinement by reference) where the family's
    session model offers it (``protocol.embedding_cache.keeps_logits``)."""
    decoder_inputs = [t.name for t in family.decoder_inputs]
    decoder_outputs = [t.name for t in family.decoder_outputs]
    if keeps_logits(decoder_inputs, decoder_outputs) and set(outputs) & set(MASK_OUTPUTS):
        return (*outputs, LOGITS_KEY)
    return tuple(outputs)


def issued_key(outputs: dict[str, np.ndarray]) -> str | None:
    """The key the server issued for a click's kept logits, or None (not asked for, or the
    server keeps none)."""
    answered = outputs.get(LOGITS_KEY)
    if answered is None or answered.size == 0:
        return None
    value = answered.reshape(-1)[0]
    key = value.decode() if isinstance(value, bytes) else str(value)
    return key or None


def matching_mask(mask_input: Any, low_res_logits: np.ndarray) -> int | None:
    """Index i such that ``mask_input`` equals ``low_res_logits[0, i]`` exactly, else None.

    Args:
        mask_input: what the user passed as ``mask_input`` (any accepted shape).
        low_res_logits: [1, M, S, S] logits of a previous prediction.
    """
    if not isinstance(mask_input, np.ndarray) or mask_input.dtype != low_res_logits.dtype:
        return None
    size = low_res_logits.shape[-2:]
    if mask_input.size != size[0] * size[1]:
        return None
    mask = mask_input.reshape(size)
    for i in range(low_res_logits.shape[1]):
        if np.array_equal(mask, low_res_logits[0, i]):
            return i
    return None


@dataclass
class CachedImage:
    """One image embedded on the server, from a client's side.

    Attributes:
        image_id: the id the server keeps its features under.
        orig_hw: (H, W) of the original image.
        rgb: the image, kept to embed it again after a miss (the server restarted or evicted
            it); None when it cannot be re-embedded.
        encoded: the image file's bytes when the user gave a path or bytes (sent as they
            are), else None (the pixels are sent).
    """

    image_id: str
    orig_hw: tuple[int, int]
    rgb: np.ndarray | None = None
    encoded: bytes | None = field(default=None, repr=False)
    _recent: deque[tuple[str, np.ndarray]] = field(
        default_factory=lambda: deque(maxlen=RECENT_PREDICTIONS), repr=False
    )

    @classmethod
    def of(
        cls,
        rgb: np.ndarray,
        family: FamilySpec,
        encoder_model: str,
        session_model: str | None = None,
        encoded: bytes | None = None,
    ) -> CachedImage:
        """The session image of ``rgb`` (HxWx3 uint8, decoded from ``encoded`` if given)."""
        hw = (int(rgb.shape[0]), int(rgb.shape[1]))
        return cls(image_id(rgb, family, encoder_model, session_model), hw, rgb, encoded)

    def adopt(self, outputs: dict[str, np.ndarray]) -> None:
        """Take the id the server answered to an embed (it computed it; it is the key)."""
        answered = outputs.get(IMAGE_ID)
        if answered is not None:
            value = answered.reshape(-1)[0]
            self.image_id = value.decode() if isinstance(value, bytes) else str(value)

    def click_inputs(
        self, decoder_prompts: dict[str, np.ndarray], mask_input: Any
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Session-model inputs of one click (its outputs: :func:`click_outputs`).

        Args:
            decoder_prompts: ``prompts.build_decoder_prompts`` output (validated prompts).
            mask_input: the user's ``mask_input`` argument, as given (or None).

        Returns:
            ``(inputs, fallback)``: the request, and the request to resend after a miss (the
            mask itself instead of a reference to it).
        """
        # The layout's prompt tensors (point_coords/point_labels, or input_points/...), the
        # mask apart: it may travel by reference.
        base = {k: v for k, v in decoder_prompts.items() if k not in (MASK_INPUT, HAS_MASK_INPUT)}
        base[IMAGE_ID] = bytes_tensor(self.image_id)
        flag = decoder_prompts.get(HAS_MASK_INPUT)  # layouts without a mask input have none
        has_mask = flag is not None and bool(flag.reshape(-1)[0])
        full = dict(base)
        if has_mask:  # a zero mask with has_mask_input = 0 is the server's default
            full[MASK_INPUT] = decoder_prompts[MASK_INPUT]
            full[HAS_MASK_INPUT] = decoder_prompts[HAS_MASK_INPUT]
        reference = self._reference(mask_input) if has_mask else None
        if reference is None:
            return full, full
        previous_key, index = reference
        inputs = dict(base)
        inputs[PREVIOUS_KEY] = bytes_tensor(previous_key)
        inputs[PREVIOUS_MASK_INDEX] = np.array([[index]], dtype=np.int32)
        return inputs, full

    def with_current_id(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``inputs`` naming this image by its current id (after :meth:`adopt`)."""
        return {**inputs, IMAGE_ID: bytes_tensor(self.image_id)}

    def remember(self, key: str, low_res_logits: np.ndarray) -> None:
        """Record the (clipped) low-res logits the server kept under ``key`` (the key it
        issued for them, :func:`issued_key` of the click's answer)."""
        self._recent.append((key, low_res_logits))

    def embed_inputs(self, family: FamilySpec | None = None) -> dict[str, np.ndarray]:
        """Inputs that embed this image (again): its file bytes, else its pixels.

        Args:
            family: unused (the server preprocesses); kept for callers of the old signature.

        Raises:
            EmbeddingNotFoundError: the image was not kept (cannot be re-embedded).
            InputValidationError: more pixels than the server accepts.
        """
        from triton_sam.errors import EmbeddingNotFoundError

        if self.rgb is None:
            raise EmbeddingNotFoundError(
                f"image_id {self.image_id!r}: not on the server any more, and the client kept "
                "no copy of the image to embed it again; call set_image again"
            )
        # The expected id goes along as a hint: the server ignores it for binding (it keys
        # features by what it decodes), but a proxy routes the embed by it, to the replica
        # the clicks on this image will reach (image-affine routing: docs/deployment.md,
        # "Scaling out").
        return {IMAGE_ID: bytes_tensor(self.image_id), **embed_inputs(self.rgb, self.encoded)}

    def _reference(self, mask_input: Any) -> tuple[str, int] | None:
        for key, logits in reversed(self._recent):
            index = matching_mask(mask_input, logits)
            if index is not None:
                return key, index
        return None
