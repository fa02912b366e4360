"""One HTTP POST driven through an ASGI app in-process, with the client optionally going away
mid-response (tests/unit/test_web_everything_route.py, test_web_concept_video_route.py)."""

from __future__ import annotations

import asyncio
from typing import Any


async def asgi_post(
    app: Any,
    path: str,
    body: bytes,
    headers: dict[str, str] | None = None,
    disconnect_after: int = 0,
) -> tuple[int, bytes]:
    """(status, body) of one request to ``app``; with ``disconnect_after``, the client goes
    away after that many non-empty body messages."""
    messages: list[dict[str, Any]] = []
    sent = False
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)
        chunks = [m for m in messages if m["type"] == "http.response.body" and m.get("body")]
        if disconnect_after and len(chunks) >= disconnect_after:
            gone.set()

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("test", 80),
        "client": ("test", 1),
        "root_path": "",
    }
    await asyncio.wait_for(app(scope, receive, send), 10)
    status = next(m["status"] for m in messages if m["type"] == "http.response.start")
    chunks = [m.get("body", b"") for m in messages if m["type"] == "http.response.body"]
    return status, b"".join(chunks)
