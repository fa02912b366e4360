"""Masks from Triton for the backend, through the public client only.

Each call takes a :class:`triton_sam.SpeculativeSAM2Client` that sends the caller's tenant in
the tenant header, exactly as the proxy would, sets the image (the server's session model
keeps its features per tenant, keyed by the image's content, so a second click on the same
image costs no encode) and asks for the prompts' mask. Clients are kept open between calls,
per tenant (a new one would open a channel and check the server's models before every click:
round trips the click does not need). One call uses a client at a time, so a client's current
image never changes under another call. Heavy calls are admitted up to a bound; past it a
request is refused at once (:class:`Overloaded`), never queued without end.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import numpy as np

from triton_sam import SpeculativeSAM2Client
from triton_sam.errors import ImageFetchError, InputValidationError
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


#: Tenants whose idle clients are kept (the least recently used one's are closed past it).
MAX_TENANTS_KEPT = 64


class Overloaded(Exception):
    """More heavy requests than :attr:`TritonOptions.max_in_flight`."""


class Segmenter:
    """Embeds images and segments prompts on Triton, per tenant."""

    def __init__(self, options: TritonOptions) -> None:
        self.options = options
        self._in_flight = 0
        # tenant -> open clients no call is using; at most max_in_flight each, since no more
        # calls than that run at once
        self._idle: OrderedDict[str, list[SpeculativeSAM2Client]] = OrderedDict()

    def admit(self) -> _Admission:
        """A slot for one heavy request (``with segmenter.admit(): ...``).

        Raises:
            Overloaded: every slot is taken.
        """
        if self._in_flight >= self.options.max_in_flight:
            raise Overloaded(f"{self._in_flight} requests in flight, at most the bound")
        return _Admission(self)

    @asynccontextmanager
    async def _client(self, tenant: str) -> AsyncIterator[SpeculativeSAM2Client]:
        """An open client of ``tenant``'s, this call's alone until it ends. A call that fails
        for another reason than its input closes its client: its channel may be broken."""
        idle = self._idle.get(tenant)
        if idle:
            client = idle.pop()
        else:
            o = self.options
            headers = {TENANT_HEADER: tenant} if tenant != DEFAULT_TENANT else None
            client = SpeculativeSAM2Client(
                o.url, o.model_type, o.protocol, timeout_s=o.timeout_s, headers=headers
            )
            await client.__aenter__()
        try:
            yield client
        except (InputValidationError, asyncio.CancelledError):
            self._keep(tenant, client)
            raise
        except BaseException:
            await client.aclose()
            raise
        else:
            self._keep(tenant, client)

    def _keep(self, tenant: str, client: SpeculativeSAM2Client) -> None:
        self._idle.setdefault(tenant, []).append(client)
        self._idle.move_to_end(tenant)
        while len(self._idle) > MAX_TENANTS_KEPT:
            _, old = self._idle.popitem(last=False)
            for c in old:
                asyncio.ensure_future(c.aclose())

    async def aclose(self) -> None:
        """Close every kept client (the gateway's shutdown)."""
        clients = [c for kept in self._idle.values() for c in kept]
        self._idle.clear()
        for client in clients:
            await client.aclose()

    async def embed(self, image: bytes | np.ndarray, *, tenant: str, field: str = "image") -> None:
        """Have the server embed ``image`` for ``tenant`` and keep it.

        Args:
            image: the image file's bytes (sent as they are on a miss: smaller than pixels)
                or HxWx3 uint8 RGB.
            tenant: whose cache.
            field: where the image came from, named by errors.

        Raises:
            ImageFetchError: the bytes are not an image the client reads.
        """
        async with self._client(tenant) as client:
            await _set_image(client, image, field)

    async def segment(
        self, image: bytes | np.ndarray, prompt: Prompt, *, tenant: str, field: str = "image"
    ) -> tuple[np.ndarray, float]:
        """The mask of ``prompt`` on ``image`` (as :meth:`embed` takes it). The server is
        asked whether it holds the image first (a few bytes); the image goes only on a miss.

        Returns:
            ``(mask, score)``: bool [H, W] at the original size (logits > 0) and its predicted
            IoU; for a lone click the best of SAM's three candidates, else the single mask
            (:attr:`Prompt.multimask`).
        """
        async with self._client(tenant) as client:
            await _set_image(client, image, field)
            points = prompt.points if len(prompt.points) else None
            labels = prompt.labels if len(prompt.labels) else None
            _, task = await client.predict_async(
                points, labels, box=prompt.box, multimask_output=prompt.multimask
            )
            masks, scores = await task
        best = int(np.argmax(scores[0]))
        return np.asarray(masks[0, best] > 0), float(scores[0, best])


async def _set_image(client: SpeculativeSAM2Client, image: bytes | np.ndarray, field: str) -> None:
    try:
        await client.set_image_async(image)
    except InputValidationError as e:
        if e.field != "image":
            raise
        # the client read the bytes: name the task field they came from
        raise ImageFetchError(field, str(e).removeprefix("image: ")) from None


class _Admission:
    def __init__(self, segmenter: Segmenter) -> None:
        self._segmenter = segmenter

    def __enter__(self) -> None:
        self._segmenter._in_flight += 1

    def __exit__(self, *exc: object) -> None:
        self._segmenter._in_flight -= 1
