"""Image-affine routing past one server: the header a proxy hashes to pick a replica.

Each Triton replica keeps the features of the images embedded on it (the session model's
cache), so every request about one image (probe, embed, click) must reach the same replica.
An L7 proxy in front of the replicas (``triton_sam.scaleout``, ``deploy/``) hashes one HTTP
header with a consistent hash; HTTP requests carry it as a header, gRPC calls as metadata
(HTTP/2 headers, which the proxy sees the same way). The routing key is the image id the
session calls already carry in their ``image_id`` input: a content hash the client computes
(``embedding_path.image_id``) and the server can reproduce, so equal images land on one replica
whichever client sent them. Video/volume tracking keeps its state per tracking session, so
every call of one video carries one key the video client draws at random for it (an explicit
``key``), ``init`` included: the session id itself is issued by the server in the answer to
``init``, after the replica is chosen, and is a secret that must not reach a header (the
proxy logs the routing key). Requests without a key (encoder, stateless decoder, metadata)
carry no header and are spread by the proxy.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

# Lower case: gRPC metadata keys must be; nginx reads it as $http_x_sam_image_id.
ROUTING_HEADER = "x-sam-image-id"
# Inputs naming server-side state: the image of the session models (embedding_path.IMAGE_ID;
# the concept model too). Never the tracker's session_id: a bearer capability (see above).
_KEY_INPUTS = ("image_id",)
# Longer keys are not ours and are not echoed into a header.
_MAX_KEY_CHARS = 256


def routing_key(inputs: Mapping[str, np.ndarray], key: str | None = None) -> str | None:
    """The replica-affinity key of a request: ``key`` when the caller gives one (a tracked
    video's), else the image id it names, or None.

    This is the one place that decides the key: switch it here (e.g. to an id computed
    from the image bytes) and every client follows.

    Args:
        inputs: the request's tensors by name; ``image_id`` is a one-element BYTES tensor.
        key: an explicit key (printable, at most 256 characters, else none is sent).
    """
    if key is not None:
        return key if key and len(key) <= _MAX_KEY_CHARS and key.isprintable() else None
    for name in _KEY_INPUTS:
        tensor = inputs.get(name)
        if tensor is None or tensor.dtype != np.object_ or tensor.size != 1:
            continue
        value = tensor.reshape(-1)[0]
        key = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        if key and len(key) <= _MAX_KEY_CHARS and key.isprintable():
            return key
    return None


def routing_headers(
    inputs: Mapping[str, np.ndarray], key: str | None = None
) -> dict[str, str] | None:
    """``{ROUTING_HEADER: key}`` for a request with a routing key (:func:`routing_key`), else
    None (tritonclient's ``headers=`` argument, HTTP and gRPC alike)."""
    key = routing_key(inputs, key)
    return None if key is None else {ROUTING_HEADER: key}
