"""One request to the session model: its inputs read and checked before any work is done
(numpy only; ``pb_utils`` comes from the model).

Every input but ``image_id`` is optional and carries Triton's batch dim first (1 per request).
A request outside the bounds (``serving/bounds.py``) raises ``bounds.RequestError`` naming the
field, answered ``InvalidInput``.
"""

from __future__ import annotations

import numpy as np

from .. import bounds
from ..protocol import embedding_cache as protocol
from ..protocol import tenancy

POINTS, LABELS, BOX, MULTIMASK = protocol.POINTS, protocol.LABELS, protocol.BOX, protocol.MULTIMASK


class Inputs:
    """The inputs of one python-backend request, read by name."""

    def __init__(self, pb_utils, request):
        self._pb_utils = pb_utils
        self.request = request

    def tensor(self, name):
        """The input tensor ``name``, or None when the request does not carry it."""
        return self._pb_utils.get_input_tensor_by_name(self.request, name)

    def string(self, name):
        """The first item of BYTES input ``name`` as text, or None when absent or empty."""
        tensor = self.tensor(name)
        if tensor is None:
            return None
        value = tensor.as_numpy().reshape(-1)
        if value.size == 0:
            return None
        item = value[0]
        return item.decode("utf-8") if isinstance(item, bytes) else str(item)

    def requested(self):
        """The output names the request asks for (none: every output)."""
        if hasattr(self.request, "requested_output_names"):
            return list(self.request.requested_output_names())
        return []

    def cancelled(self):
        # is_cancelled() arrived in Triton 23.10's stub; older stubs cannot tell.
        return hasattr(self.request, "is_cancelled") and self.request.is_cancelled()

    def tenant(self):
        """The request's tenant (a forged second value: ``ProtocolError``)."""
        return tenancy.request_tenant(self.request)

    def cache_area(self):
        """The cache area an embed names (``protocol.CACHE_AREA``); the image area by default."""
        parameters = self.request.parameters() if hasattr(self.request, "parameters") else None
        return protocol.cache_area(parameters)

    def carries_image(self, encoder_inputs):
        """Whether the request sends an image (file bytes, pixels or every encoder input)."""
        if self.tensor(protocol.IMAGE_BYTES) is not None:
            return True
        if self.tensor(protocol.IMAGE_RGB) is not None:
            return True
        return bool(encoder_inputs) and all(self.tensor(n) is not None for n in encoder_inputs)

    def check_one_prompt_set(self):
        """Refuse a request whose inputs carry more than one prompt set (batch dim > 1): the
        model would merge them or keep the first. The image id is named first when it is one."""
        tensors = sorted(
            self.request.inputs(), key=lambda t: (t.name() != protocol.IMAGE_ID, t.name())
        )
        for tensor in tensors:
            shape = tensor.shape() if hasattr(tensor, "shape") else tensor.as_numpy().shape
            bounds.check_batch(tensor.name(), tuple(shape))

    def image_id_hint(self):
        """The ``image_id`` the client sent (checked), or None."""
        hint = self.string(protocol.IMAGE_ID)
        if hint is not None:
            bounds.check_key(protocol.IMAGE_ID, hint)
        return hint

    def prompts(self, prompt_inputs, settings):
        """The decoder prompt tensors of the request (name -> array), checked against the
        bounds, and the control inputs that go with them."""
        prompts = {}
        for name in prompt_inputs:
            tensor = self.tensor(name)
            if tensor is not None:
                prompts[name] = tensor.as_numpy()
        if prompts:
            bounds.check_prompts(
                prompts, max_points=settings.max_points, max_boxes=settings.max_boxes
            )
        if self.tensor(protocol.LOGITS_KEY) is not None:
            raise bounds.RequestError(
                protocol.LOGITS_KEY,
                "sent as an input; the server issues the key: ask for the output "
                f"{protocol.LOGITS_KEY} and send the key it answers as {protocol.PREVIOUS_KEY} "
                "later",
            )
        value = self.string(protocol.PREVIOUS_KEY)
        if value is not None:
            bounds.check_key(protocol.PREVIOUS_KEY, value)
            if protocol.MASK_INPUT in prompts:
                raise bounds.RequestError(
                    protocol.PREVIOUS_KEY,
                    f"sent with {protocol.MASK_INPUT}; send one of them (one mask)",
                )
        return prompts

    def pixel_prompts(self, prompts, max_points):
        """(clicks, box, multimask) in original pixels, checked, or None when absent.

        ``clicks`` is ``(points float64 [N, 2] (X, Y), labels float32 [N])`` or None, ``box``
        a float [4] (x0, y0, x1, y1) or None.
        """
        given = {n: self.tensor(n) for n in protocol.PIXEL_INPUTS}
        given = {n: t.as_numpy() for n, t in given.items() if t is not None}
        if not given:
            return None
        if prompts:
            raise bounds.RequestError(
                POINTS, f"got both pixel prompts and {sorted(prompts)}; send one kind"
            )
        points, labels, box = given.get(POINTS), given.get(LABELS), given.get(BOX)
        if (points is None) != (labels is None):
            raise bounds.RequestError(LABELS, "points and labels must be given together")
        if points is None and box is None:
            raise bounds.RequestError(POINTS, "no prompt: send points with labels, a box, or both")
        clicks = None if points is None else _clicks(points, labels, max_points)
        if box is not None:
            box = box.reshape(-1)
            if box.shape != (4,) or not np.isfinite(box).all():
                raise bounds.RequestError(BOX, "expected 4 finite values (x0, y0, x1, y1) pixels")
        multimask = given.get(MULTIMASK)
        return clicks, box, bool(multimask is not None and multimask.reshape(-1)[0])


def _clicks(points, labels, max_points):
    points = points.reshape(-1, 2) if points.size % 2 == 0 else points
    if points.ndim != 2 or points.shape[0] > max_points:
        raise bounds.RequestError(
            POINTS,
            f"got shape {list(points.shape)}, expected [N, 2] (X, Y) pixels with N <= {max_points}",
        )
    labels = labels.reshape(-1)
    if labels.shape[0] != points.shape[0] or not np.isin(labels, (0, 1)).all():
        raise bounds.RequestError(
            LABELS, f"got {labels[:8].tolist()}, expected one 0/1 label per point"
        )
    if not np.isfinite(points).all():
        raise bounds.RequestError(POINTS, "got NaN or infinity, expected finite pixels")
    return points.astype(np.float64), labels.astype(np.float32)
