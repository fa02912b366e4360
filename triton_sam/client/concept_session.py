"""A concept family's image on the server, for the sync client: the image sent once (a probe
first: the server may hold it already), then phrases in, instances out.

The requests and their parsing are :mod:`triton_sam.client.concepts`' (no I/O); this module
adds the blocking transport and the one retry after a miss.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from triton_sam.client import concepts
from triton_sam.client.transport import Transport
from triton_sam.errors import EmbeddingNotFoundError


class ConceptSession:
    """The serving model ``model`` of a concept family over ``transport``.

    Attributes:
        image: the current image, or None.
        last_timings_ms: the last call's milliseconds by stage.
    """

    def __init__(self, transport: Transport, model: str) -> None:
        self.transport, self.model = transport, model
        self.image: concepts.ConceptImage | None = None
        self.last_timings_ms: dict[str, float] = {}

    def set_image(self, rgb: np.ndarray) -> None:
        """Send ``rgb`` (HxWx3 uint8) to the serving model unless it holds its content id."""
        t0 = time.perf_counter()
        image = concepts.ConceptImage.of(rgb, self.model)
        try:  # a probe of a few bytes saves sending the pixels when the server has them
            self._infer(image.probe_inputs(), (concepts.protocol.ENCODED,))
        except EmbeddingNotFoundError:
            out = self._infer(
                image.embed_inputs(), (concepts.protocol.ENCODED, concepts.protocol.IMAGE_ID)
            )
            server_id = bytes(out["image_id"].reshape(-1)[0]).decode()
            if server_id != image.image_id:  # the same function on both sides: a version skew
                image.image_id = server_id
        self.image = image
        self.last_timings_ms = {"set_image": (time.perf_counter() - t0) * 1e3}

    def predict(
        self,
        phrases: Sequence[str],
        options: dict[str, object],
        mask_format: str,
    ) -> concepts.ConceptPrediction:
        """Every instance of ``phrases`` (checked; [] with exemplars alone) and the exemplars
        in ``options`` in the current image (set)."""
        image = self.image
        assert image is not None
        outputs = concepts.output_names(mask_format)
        t0 = time.perf_counter()
        try:
            out = self._infer(image.predict_inputs(phrases, **options), outputs)
        except EmbeddingNotFoundError:  # evicted, or the server restarted: send the pixels
            inputs = image.predict_inputs(phrases, **options, with_pixels=True)
            out = self._infer(inputs, outputs)
        t1 = time.perf_counter()
        prediction = concepts.parse_prediction(out, phrases, mask_format)
        self.last_timings_ms = {
            "predict": (t1 - t0) * 1e3,
            "decode_masks": (time.perf_counter() - t1) * 1e3,
        }
        return prediction

    def _infer(
        self, inputs: dict[str, np.ndarray], outputs: tuple[str, ...]
    ) -> dict[str, np.ndarray]:
        # Idempotent: embed and probe are; a predict keeps nothing on the server but the
        # exemplar of its boxes, and a retried one only keeps an unused second copy (evicted
        # in LRU order), with the same answer.
        return self.transport.infer(self.model, inputs, outputs, idempotent=True)
