"""Image-affine routing past one server: the header a proxy hashes to pick a replica.

Each Triton replica keeps the features of the images embedded on it (the session model's
cache), so every request about one image (probe, embed, click) must reach the same replica.
An L7 proxy in front of the replicas (``triton_sam.scaleout``, ``deploy/``) hashes one HTTP
header with a consistent hash; HTTP requests carry it as a header, gRPC calls as metadata
(HTTP/2 headers, which the proxy sees the same way). The routing key is the image id the
session calls already carry in their ``image_id`` input: a content hash the client computes
(``embedding_path.image_id``) and the server can reproduce, so equal images land on one replica
whichever client sent them. Video/volume tracking keeps its state per tracking session, so
tracker calls are keyed by their ``session_id`` (the client's random token). Requests
without either (encoder, stateless decoder, metadata) carry no header and are spread by the
proxy.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

# Lower case: gRPC metadata keys must be; nginx reads it as $http_x_sam_image_id.
ROUTING_HEADER = "x-sam-image-id"
# Inputs naming server-side state, first match wins: the image of the session models
# (embedding_path.IMAGE_ID; the concept model too), the tracking session of the tracker
# (tracking.protocol.SESSION_ID).
_KEY_INPUTS = ("image_id", "session_id")
# The tracker accepts session ids up to 256 characters; longer is not echoed into a header.
_MAX_KEY_CHARS = 256


def routing_key(inputs: Mapping[str, np.ndarray]) -> str | None:
    """The replica-affinity key of a request: the image id (or tracking session id) it
    names, or None.

    This is the one place that decides the key: switch it here (e.g. to an id computed
    from the image bytes) and every client follows.

    Args:
        inputs: the request's tensors by name; ``image_id`` / ``session_id`` are
            one-element BYTES tensors ([1, 1] / [1]).
    """
    for name in _KEY_INPUTS:
        tensor = inputs.get(name)
        if tensor is None or tensor.dtype != np.object_ or tensor.size != 1:
            continue
        value = tensor.reshape(-1)[0]
        key = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        if key and len(key) <= _MAX_KEY_CHARS and key.isprintable():
            return key
    return None


def routing_headers(inputs: Mapping[str, np.ndarray]) -> dict[str, str] | None:
    """``{ROUTING_HEADER: key}`` for a request that names an image, else None (tritonclient's
    ``headers=`` argument, HTTP and gRPC alike)."""
    key = routing_key(inputs)
    return None if key is None else {ROUTING_HEADER: key}
