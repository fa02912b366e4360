"""Exemplar prompts of the ``sam3_concept`` model: boxes read from a request, normalised as
``Sam3Processor`` does, and the tenant-bound store of encoded exemplars.

Shipped beside ``concept_model.py`` (see :mod:`triton_sam.serving`); ``pb_utils`` is passed
in. Refusals are :class:`~.bounds.RequestError` naming the field (``exemplar_boxes[1]: ...``)
or :class:`ExemplarMiss` (``ExemplarNotFound``, status NOT_FOUND) for an id the server does
not hold for the tenant.

Why a store: SAM3's geometry encoder pools the exemplar's features out of the image it was
drawn on (ROI align) and cross-attends to that image, so an exemplar is a set of prompt
tokens computed from one image. Upstream (``Sam3Processor`` / ``Sam3Model``, and
facebookresearch/sam3) applies exemplars only to the image they were drawn on; to apply one to
other images, the server keeps those tokens under an id it issues, and a later request on
another image appends them to its prompts, after the text tokens, as ``Sam3Model.forward``
appends the geometry encoder's output. The pixels of the first image are never needed again.
"""

from __future__ import annotations

import secrets

import numpy as np

from . import cache, model_io
from . import protocol as envelope
from .bounds import RequestError
from .protocol import concept as protocol

# 128 random bits, URL-safe: an id cannot be guessed, and a leaked one is useless to another
# tenant (the store is keyed by (tenant, id)).
ID_BYTES = 16


class ExemplarMiss(envelope.ProtocolError):
    """An ``exemplar_ids`` entry this instance does not hold for the request's tenant."""

    def __init__(self, message):
        super().__init__(envelope.ERR_EXEMPLAR_NOT_FOUND, message)


def boxes(pb_utils, request, hw, max_boxes: int):
    """The request's exemplar boxes and labels, checked against its image.

    Args:
        pb_utils: Triton's python backend utilities (or a stand-in).
        request: the inference request.
        hw: (H, W) of the request's image in pixels.
        max_boxes: most boxes one request may carry.

    Returns:
        (boxes float64 [G, 4] as (x0, y0, x1, y1) in pixels, labels int64 [G] with 1 for a
        positive example and 0 for a negative one), or None when the request sends no boxes.

    Raises:
        RequestError: naming ``exemplar_boxes[i]`` or ``exemplar_labels``: a shape other than
            [G, 4], more than ``max_boxes``, a coordinate that is not finite, outside the
            image, or x1 <= x0 / y1 <= y0; labels without boxes, of another count, or not 0/1.
    """
    given = model_io.tensor(pb_utils, request, protocol.EXEMPLAR_BOXES)
    labels_given = model_io.tensor(pb_utils, request, protocol.EXEMPLAR_LABELS)
    return checked_boxes(
        None if given is None else model_io.single(given.as_numpy(), protocol.EXEMPLAR_BOXES),
        None
        if labels_given is None
        else model_io.single(labels_given.as_numpy(), protocol.EXEMPLAR_LABELS),
        hw,
        max_boxes,
    )


def checked_boxes(found, labels, hw, max_boxes: int):
    """Exemplar boxes and labels as numpy arrays, checked against the image they are drawn on
    (what :func:`boxes` reads from a request, for callers that hold plain arrays: the
    ``sam3_concept_video`` service).

    Args:
        found: the boxes, [G, 4] (x0, y0, x1, y1) in pixels, or None when none were sent.
        labels: [G] 1 / 0, or None for all positive.
        hw: (H, W) of the image the boxes are drawn on, in pixels.
        max_boxes: most boxes one request may carry.

    Returns:
        As :func:`boxes`.

    Raises:
        RequestError: as :func:`boxes`.
    """
    if found is None:
        if labels is not None:
            raise RequestError(
                protocol.EXEMPLAR_LABELS, f"sent without {protocol.EXEMPLAR_BOXES}; send both"
            )
        return None
    found = np.asarray(found)
    if found.ndim != 2 or found.shape[-1] != 4 or not 1 <= found.shape[0] <= max_boxes:
        raise RequestError(
            protocol.EXEMPLAR_BOXES,
            f"shape {list(found.shape)}, expected [G, 4] (x0, y0, x1, y1) with G from 1 to "
            f"{max_boxes}",
        )
    found = found.astype(np.float64)
    height, width = hw
    for i, (x0, y0, x1, y1) in enumerate(found):
        field = f"{protocol.EXEMPLAR_BOXES}[{i}]"
        box = f"({x0:g}, {y0:g}, {x1:g}, {y1:g})"
        if not np.isfinite(found[i]).all():
            raise RequestError(field, f"{box} is not finite")
        if min(x0, y0) < 0 or x1 > width or y1 > height:
            raise RequestError(
                field, f"{box} is outside the image, expected 0 <= x <= {width}, 0 <= y <= {height}"
            )
        if not (x0 < x1 and y0 < y1):
            raise RequestError(field, f"{box} is empty, expected x0 < x1 and y0 < y1")
    return found, _labels(labels, len(found))


def _labels(given, count):
    if given is None:  # Sam3Processor's default: every box a positive example
        return np.ones(count, np.int64)
    values = np.asarray(given).reshape(-1)
    if values.size != count:
        raise RequestError(
            protocol.EXEMPLAR_LABELS,
            f"got {values.size} labels for {count} boxes, expected one each",
        )
    for i, value in enumerate(values):
        if value not in (0, 1):
            raise RequestError(
                f"{protocol.EXEMPLAR_LABELS}[{i}]",
                f"got {value}, expected 1 (positive example) or 0 (negative example)",
            )
    return values.astype(np.int64)


def normalised_cxcywh(found, hw):
    """Pixel boxes [G, 4] (x0, y0, x1, y1) -> float32 [G, 4] (cx, cy, w, h) / (W, H, W, H).

    ``Sam3Processor``'s ``input_boxes``: it divides x by the width and y by the height in
    float32, then converts to centre and size (``box_xyxy_to_cxcywh``), in that order.
    """
    height, width = hw
    scaled = found.astype(np.float32) / np.array([width, height, width, height], np.float32)
    x0, y0, x1, y1 = scaled.T
    return np.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], axis=-1).astype(np.float32)


def with_exemplars(text, token_mask, exemplars):
    """Prompts with exemplar tokens appended: text [N, 32, C] and its mask [N, 32], each
    followed by the exemplar tokens [T, C] (all valid) when there are any: [N, 32 + T, C],
    [N, 32 + T] (what ``Sam3Model.forward`` concatenates: text tokens, then the geometry
    encoder's). Without exemplars (None) the text and mask are returned as they are."""
    if exemplars is None:
        return text, token_mask
    count = len(text)
    tokens = np.broadcast_to(exemplars[None], (count, *exemplars.shape)).astype(text.dtype)
    prompts = np.concatenate([text, tokens], axis=1)
    valid = np.ones((count, len(exemplars)), token_mask.dtype)
    return prompts, np.concatenate([token_mask, valid], axis=1)


def exemplar_ids(pb_utils, request, max_ids: int) -> list[str]:
    """The ids of kept exemplars the request applies ([] when it sends none).

    Raises:
        RequestError: (``exemplar_ids`` / ``exemplar_ids[i]``) more than ``max_ids``, an
            entry that is not UTF-8 or not of the issued form.
    """
    tensor = model_io.tensor(pb_utils, request, protocol.EXEMPLAR_IDS)
    if tensor is None:
        return []
    values = model_io.single(tensor.as_numpy(), protocol.EXEMPLAR_IDS).reshape(-1)
    if not 1 <= values.size <= max_ids:
        raise RequestError(
            protocol.EXEMPLAR_IDS, f"got {values.size} ids, expected 1 to {max_ids} per request"
        )
    found = []
    for i, value in enumerate(values):
        field = f"{protocol.EXEMPLAR_IDS}[{i}]"
        if len(value) > protocol.EXEMPLAR_ID_MAX_BYTES:
            raise RequestError(
                field, f"{len(value)} bytes, expected an id this server answered in exemplar_id"
            )
        found.append(model_io.utf8(value, field))
    return found


class ExemplarStore:
    """Encoded exemplars by (tenant, id): ids issued here, at most ``max_entries`` kept, the
    least recently used of a tenant above its fair share evicted first (:mod:`.cache`).

    Only the tenant that encoded an exemplar can use its id: another tenant's lookup is a miss,
    exactly as for an id never issued, so an id reveals nothing across tenants.
    """

    def __init__(self, max_entries: int) -> None:
        self._entries = cache.LruCache(max_entries)

    def __len__(self) -> int:
        return len(self._entries)

    def keep(self, tenant: str, tokens: np.ndarray) -> str:
        """Keep ``tokens`` [T, C] (one encode call's exemplar tokens) for ``tenant``; its new
        id (128 random bits, URL-safe base64)."""
        exemplar_id = secrets.token_urlsafe(ID_BYTES)
        self._entries.put((tenant, exemplar_id), tokens, tokens.nbytes, owner=tenant)
        return exemplar_id

    def tokens(self, tenant: str, ids: list[str]) -> list[np.ndarray]:
        """The kept tokens of ``ids`` for ``tenant``, in order.

        Raises:
            ExemplarMiss: naming the first id not held for ``tenant`` (never issued, evicted,
                another tenant's, or the server restarted).
        """
        found = []
        for i, exemplar_id in enumerate(ids):
            tokens = self._entries.get((tenant, exemplar_id))
            if tokens is None:
                raise ExemplarMiss(
                    f"{protocol.EXEMPLAR_IDS}[{i}]: {exemplar_id[:40]!r} is not held on this "
                    "server (never issued, evicted, or the server restarted); send the boxes "
                    "with their image again"
                )
            found.append(tokens)
        return found
