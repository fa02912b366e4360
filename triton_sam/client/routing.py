"""Image-affine routing past one server: the header a proxy hashes to pick a replica.

Each Triton replica keeps the features of the images embedded on it (the session model's
cache), so every request about one image (probe, embed, click) must reach the same replica.
An L7 proxy in front of the replicas (``triton_sam.scaleout``, ``deploy/``) hashes one HTTP
header with a consistent hash; HTTP requests carry it as a header, gRPC calls as metadata
(HTTP/2 headers, which the proxy sees the same way). The routing key is the image id the
session calls already carry in their ``image_id`` input: a content hash the client computes
(``session_path.image_id``) and the server can reproduce, so equal images land on one replica
whichever client sent them. Requests without an image (encoder, stateless decoder, metadata)
carry no header and are spread by the proxy.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

# Lower case: gRPC metadata keys must be; nginx reads it as $http_x_sam_image_id.
ROUTING_HEADER = "x-sam-image-id"
# The session models' input naming the image (session_path.IMAGE_ID; concept model too).
_IMAGE_INPUT = "image_id"
# An image id is 32 hex chars; anything longer is not ours and is not echoed into a header.
_MAX_KEY_CHARS = 128


def routing_key(inputs: Mapping[str, np.ndarray]) -> str | None:
    """The replica-affinity key of a request: the image id it names, or None.

    This is the one place that decides the key: switch it here (e.g. to an id computed
    from the image bytes) and every client follows.

    Args:
        inputs: the request's tensors by name; ``image_id`` is a [1, 1] BYTES tensor.
    """
    tensor = inputs.get(_IMAGE_INPUT)
    if tensor is None or tensor.dtype != np.object_ or tensor.size != 1:
        return None
    value = tensor.reshape(-1)[0]
    key = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    if not key or len(key) > _MAX_KEY_CHARS or not key.isprintable():
        return None
    return key


def routing_headers(inputs: Mapping[str, np.ndarray]) -> dict[str, str] | None:
    """``{ROUTING_HEADER: key}`` for a request that names an image, else None (tritonclient's
    ``headers=`` argument, HTTP and gRPC alike)."""
    key = routing_key(inputs)
    return None if key is None else {ROUTING_HEADER: key}
