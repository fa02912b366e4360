"""Label Studio's ML backend protocol on top of Triton (``triton-sam gateway --label-studio``).

Pure protocol code (:mod:`.config`, :mod:`.prompts`, :mod:`.rle`, :mod:`.polygon`,
:mod:`.results`, :mod:`.auth`) is separate from what does I/O: the bounded image fetcher
(:mod:`.fetch`), the masks from Triton through the public client (:mod:`.segment`), the routes
(:mod:`.routes`) and the project-wide precompute (:mod:`.precompute`). Needs the
``label-studio`` extra (starlette, uvicorn). docs/label-studio.md is the user's guide.
"""

from __future__ import annotations

from triton_sam.label_studio.fetch import Fetcher, FetchPolicy
from triton_sam.label_studio.routes import PREFIX, LabelStudioOptions, label_studio_routes
from triton_sam.label_studio.segment import Segmenter, TritonOptions

__all__ = [
    "PREFIX",
    "FetchPolicy",
    "Fetcher",
    "LabelStudioOptions",
    "Segmenter",
    "TritonOptions",
    "label_studio_routes",
]
