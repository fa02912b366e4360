"""The browser annotator: a page served by the gateway, on the same origin as Triton's API.

:func:`web_routes` gives the routes to mount on the gateway (``create_app(extra_routes=...)``):
the page's static files under ``/web/``, ``/web/models`` (the models the page can use) and a
pass-through of Triton's KServe v2 inference API under ``/v2`` (:mod:`.passthrough`). The page
(``static/``: plain ES modules, no build step) sends an image file's bytes once to a session
model and each click as the image id plus prompts, and draws the RLE mask the server answers.
``triton-sam serve --web`` and ``triton-sam gateway --web`` serve it.
"""

from __future__ import annotations

from triton_sam.web.passthrough import PassThrough, PassThroughOptions
from triton_sam.web.routes import STATIC_DIR, web_routes

__all__ = ["STATIC_DIR", "PassThrough", "PassThroughOptions", "web_routes"]
