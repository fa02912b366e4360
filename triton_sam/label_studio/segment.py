"""Masks from Triton for the backend, through the public client only.

Each call opens a :class:`triton_sam.SpeculativeSAM2Client` that sends the caller's tenant in
the tenant header, exactly as the proxy would, sets the image (the server's session model
keeps its features per tenant, keyed by the image's content, so a second click on the same
image costs no encode) and asks for the prompts' mask. Heavy calls are admitted up to a bound;
past it a request is refused at once (:class:`Overloaded`), never queued without end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from triton_sam import SpeculativeSAM2Client
from triton_sam.label_studio.prompts import Prompt
from triton_sam.scaleout.access import DEFAULT_TENANT, TENANT_HEADER


@dataclass(frozen=True)
class TritonOptions:
    """Where the models are.

    Attributes:
        url: Triton's address (``host:port``, gRPC by default).
        protocol: ``"grpc"`` or ``"http"``.
        model_type: the family served (``sam2``, ``sam1``, ``sam3``).
        timeout_s: per request to Triton.
        max_in_flight: images being fetched, embedded or segmented at once; more are refused
            with 503 (Label Studio shows the error; the annotator clicks again).
    """

    url: str = "localhost:8001"
    protocol: str = "grpc"
    model_type: str = "sam2"
    timeout_s: float = 120.0
    max_in_flight: int = 4


class Overloaded(Exception):
    """More heavy requests than :attr:`TritonOptions.max_in_flight`."""


class Segmenter:
    """Embeds images and segments prompts on Triton, per tenant."""

    def __init__(self, options: TritonOptions) -> None:
        self.options = options
        self._in_flight = 0

    def admit(self) -> _Admission:
        """A slot for one heavy request (``with segmenter.admit(): ...``).

        Raises:
            Overloaded: every slot is taken.
        """
        if self._in_flight >= self.options.max_in_flight:
            raise Overloaded(f"{self._in_flight} requests in flight, at most the bound")
        return _Admission(self)

    def _client(self, tenant: str) -> SpeculativeSAM2Client:
        o = self.options
        headers = {TENANT_HEADER: tenant} if tenant != DEFAULT_TENANT else None
        return SpeculativeSAM2Client(
            o.url, o.model_type, o.protocol, timeout_s=o.timeout_s, headers=headers
        )

    async def embed(self, rgb: np.ndarray, *, tenant: str) -> None:
        """Have the server embed ``rgb`` (HxWx3 uint8) for ``tenant`` and keep it."""
        async with self._client(tenant) as client:
            await client.set_image_async(rgb)

    async def segment(
        self, rgb: np.ndarray, prompt: Prompt, *, tenant: str
    ) -> tuple[np.ndarray, float]:
        """The mask of ``prompt`` on ``rgb``.

        Returns:
            ``(mask, score)``: bool [H, W] at the original size (logits > 0) and its predicted
            IoU; for a lone click the best of SAM's three candidates, else the single mask
            (:attr:`Prompt.multimask`).
        """
        async with self._client(tenant) as client:
            await client.set_image_async(rgb)
            points = prompt.points if len(prompt.points) else None
            labels = prompt.labels if len(prompt.labels) else None
            _, task = await client.predict_async(
                points, labels, box=prompt.box, multimask_output=prompt.multimask
            )
            masks, scores = await task
        best = int(np.argmax(scores[0]))
        return np.asarray(masks[0, best] > 0), float(scores[0, best])


class _Admission:
    def __init__(self, segmenter: Segmenter) -> None:
        self._segmenter = segmenter

    def __enter__(self) -> None:
        self._segmenter._in_flight += 1

    def __exit__(self, *exc: object) -> None:
        self._segmenter._in_flight -= 1
