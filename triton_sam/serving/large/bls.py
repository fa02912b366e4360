"""The session calls of the large model: ``<family>_session`` over BLS, as a tenant.

Each tile or window is one image to the session model (``image_rgb``), so its cache,
admission (an embed beyond ``max_waiting_embeds`` is refused ``Overloaded``, relayed as is),
tenancy and parity apply unchanged. ``pb_utils`` is passed in, never imported.
"""

from __future__ import annotations

import numpy as np

from .. import protocol as envelope
from ..protocol import embedding_cache as session
from ..session_call import SessionCall, SessionError
from .planning import Framed, session_inputs


class BlsSession:
    """``embed`` / ``probe`` / ``predict`` against the session model ``model``."""

    def __init__(self, pb_utils, model: str) -> None:
        self.pb, self.call = pb_utils, SessionCall(pb_utils, model)

    def _id(self, image_id: str):
        return self.pb.Tensor(session.IMAGE_ID, np.array([[image_id.encode()]], np.object_))

    async def embed(self, tenant: str, rgb: np.ndarray) -> tuple[str, bool]:
        """(image id, whether the encoder ran) of uint8 [h, w, 3] pixels."""
        tensor = self.pb.Tensor(session.IMAGE_RGB, rgb[None])
        out = await self.call.acall(tenant, [tensor], [session.IMAGE_ID, session.ENCODED])
        image_id = out[session.IMAGE_ID].as_numpy().reshape(-1)[0]
        image_id = image_id.decode() if isinstance(image_id, bytes) else str(image_id)
        return image_id, bool(out[session.ENCODED].as_numpy().reshape(-1)[0])

    async def probe(self, tenant: str, image_id: str) -> bool:
        """Whether the session model holds the tenant's ``image_id``."""
        try:
            await self.call.acall(tenant, [self._id(image_id)], [session.ENCODED])
        except SessionError as e:
            if e.code == envelope.ERR_EMBEDDING_NOT_FOUND:
                return False
            raise
        return True

    async def predict(self, tenant, image_id, points, labels, box, multimask):
        """[(COCO RLE counts of the image-size mask, score), ...] of pixel prompts in the
        image's frame (points float32 [N, 2] x, y; labels int32 [N]; box float32 [4])."""
        framed = Framed(points, labels, box, dropped=0)
        inputs = session_inputs(image_id, framed, multimask)
        tensors = [self.pb.Tensor(name, value) for name, value in inputs.items()]
        wanted = [session.MASKS_RLE, session.MASK_SCORES]
        out = await self.call.acall(tenant, tensors, wanted)
        counts = out[session.MASKS_RLE].as_numpy().reshape(-1)
        scores = out[session.MASK_SCORES].as_numpy().reshape(-1)
        return [(c, float(s)) for c, s in zip(counts, scores, strict=True)]
