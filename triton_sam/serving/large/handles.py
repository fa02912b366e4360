"""The images each tenant holds, under handles the server issues (capabilities).

A handle is 128 random bits (``secrets.token_hex(16)``), bound to the tenant that opened it:
looked up under (tenant, handle), so another tenant's handle, a forged one and one evicted or
lost in a restart are the same miss (``HandleNotFound``). At most ``max_handles`` images per
tenant; opening one more forgets that tenant's least recently used image (its source closed,
its uploaded pixels deleted), never another tenant's. Used on the model's event loop only:
no locks.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from .. import protocol as envelope
from ..tiles import Block, TileGrid


@dataclass
class Image:
    """One open image.

    Attributes:
        source: its pixels (a dataset reader, or the upload spool's source): ``shape``,
            ``dtype``, ``axes``, ``read(rows, cols, z=None, level=0)``, ``close()``.
        grid: the tiles of one slice, with their halo.
        window: [rows, cols] of a window.
        mapping: the mapping asked for; ``resolved``: as resolved on the pixels (once all
            are there).
        upload: the spool's source when created by a client (its ``complete`` counts).
        embedded: (z, block begin, block end) -> the session model's image id.
    """

    source: Any
    grid: TileGrid
    window: tuple[int, int]
    mapping: Any
    upload: Any = None
    resolved: Any = None
    embedded: OrderedDict = field(default_factory=OrderedDict)

    @property
    def complete(self) -> bool:
        return self.upload is None or self.upload.complete

    @property
    def depth(self) -> int | None:
        """Slices of a volume (None for a 2D image)."""
        return self.source.shape[0] if self.source.axes.startswith("z") else None

    def close(self) -> None:
        self.source.close()


def block_key(z, block: Block) -> tuple:
    """The key an image remembers a block's session id by (``Image.embedded``)."""
    return (z, block.begin, block.end)


def remembered_tiles(image: Image, z) -> list[tuple[int, str]]:
    """(tile id, image id) of the remembered blocks of slice ``z`` that are tiles' outer
    blocks. A tile's core starts within ``halo`` of its outer block's start (less where the
    halo was clipped at 0), so only the tiles starting there are candidates, each checked
    (tiles whose clipped blocks coincide share the block's features: all are held).
    """
    grid, found = image.grid, []
    rows, cols = grid.blocks_per_axis
    for (zz, begin, end), image_id in list(image.embedded.items()):
        if zz != z:
            continue
        near = [
            range(-(-b // t), min((b + h) // t, n - 1) + 1)
            for b, h, t, n in zip(begin, grid.halo, grid.tile, (rows, cols), strict=True)
        ]
        for r in near[0]:
            for c in near[1]:
                if grid.outer(r * cols + c) == Block(begin, end):
                    found.append((r * cols + c, image_id))
    return found


class Handles:
    """Open images by (tenant, handle), LRU per tenant.

    Args:
        max_handles: images per tenant.
    """

    def __init__(self, max_handles: int) -> None:
        self.max_handles = max(1, max_handles)
        self._tenants: dict[str, OrderedDict[str, Image]] = {}

    def add(self, tenant: str, image: Image) -> str:
        """Hold ``image`` for ``tenant`` under a new handle; the tenant's least recently used
        images are closed first when it holds ``max_handles``."""
        images = self._tenants.setdefault(tenant, OrderedDict())
        while len(images) >= self.max_handles:
            _, old = images.popitem(last=False)
            old.close()
        handle = secrets.token_hex(16)
        images[handle] = image
        return handle

    def get(self, tenant: str, handle: str) -> Image:
        """The tenant's image (now its most recently used).

        Raises:
            ProtocolError: ``HandleNotFound`` (unknown, evicted, closed or another tenant's).
        """
        images = self._tenants.get(tenant)
        if images is None or handle not in images:
            raise envelope.ProtocolError(
                envelope.ERR_HANDLE_NOT_FOUND,
                "request.handle: not an image this server holds for you (closed, evicted, "
                "the server restarted, or never issued); open it again",
                "request.handle",
            )
        images.move_to_end(handle)
        return images[handle]

    def close(self, tenant: str, handle: str) -> None:
        """Forget the image (its source closed)."""
        image = self.get(tenant, handle)
        del self._tenants[tenant][handle]
        if not self._tenants[tenant]:
            del self._tenants[tenant]
        image.close()

    def count(self, tenant: str) -> int:
        return len(self._tenants.get(tenant, ()))

    def close_all(self) -> None:
        for images in self._tenants.values():
            for image in images.values():
                image.close()
        self._tenants.clear()
