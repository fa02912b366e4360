"""The page's JSON request bodies, read within a bound: one JSON object, or a typed refusal
naming ``body`` (413 ``LimitExceeded`` past the bound, read chunk by chunk so a large body is
refused before it is held; 400 ``InvalidInput`` when it is not a JSON object)."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from triton_sam.gateway.errors import ERR_LIMIT, GatewayError, invalid


async def json_object(request: Request, max_bytes: int, expected: str) -> dict[str, Any]:
    """The body as a JSON object.

    Args:
        request: the page's request.
        max_bytes: the largest body accepted.
        expected: what the object holds, for the refusal's message (e.g. ``{command, ...}``).

    Raises:
        GatewayError: 413 past ``max_bytes``; 400 not JSON, or JSON but not an object.
    """
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise GatewayError(413, ERR_LIMIT, "body", f"more than {max_bytes} bytes")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise invalid("body", f"not JSON: {e}") from e
    if not isinstance(data, dict):
        raise invalid("body", f"a JSON object {expected} expected")
    return data
