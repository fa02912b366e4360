"""The page's view of a large image: a tile pyramid served from the server's copy.

``GET /web/large/{model}/{handle}/tile?level=L&row=R&col=C[&z=Z]`` answers a PNG of
:data:`TILE_PX` pixels a side (less at the image's right and bottom edges): the pixels of the
``<family>_large`` model's image under ``handle`` as SAM sees them (its ``read`` op answers
them mapped to uint8 RGB), reduced ``2**L`` times. Tile ``(R, C)`` of level ``L`` covers the
full-resolution pixels ``[R * TILE_PX * 2**L, (R + 1) * TILE_PX * 2**L)`` down (the same
across), cut at the image's edge: the page draws it there, so the browser never holds more
than the tiles around its viewport, whatever the image's size.

How a tile is read, bounded by the model's ``max_block`` (its config parameter; the
contract's default when it has none):

- a level whose tile covers at most :data:`MAX_READS_PER_TILE` reads of ``max_block``
  pixels a side: those reads at full resolution, each area-reduced (a mean of ``2**L`` by
  ``2**L`` pixels) as it comes, so the gateway holds one read at a time;
- a coarser level: the source's own pyramid level ``L`` (``read`` with ``level``: OME-Zarr
  multiscales and pyramidal TIFFs have one), resized to the tile; a source without one
  refuses it, answered as 413 ``LimitExceeded`` naming ``level`` (the page then stays at the
  coarsest level it can have: :data:`MAX_READS_PER_TILE` bounds what one tile costs).

Every call goes over the gateway's backend connection of the request's tenant (the tenant
header, as the gateway's other routes read it), so a handle opened by one tenant is a miss
for another: the model's ``HandleNotFound`` is answered 404 with that code. A tile of an
image whose pieces are not all there yet is 409 (not cached); a served tile is immutable
(a handle's pixels never change once complete) and is sent with ``Cache-Control: private``
and a long ``max-age``, so the browser asks for each tile once.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from triton_sam import errors
from triton_sam.gateway.errors import ERR_LIMIT, GatewayError, from_client_error, invalid
from triton_sam.gateway.sam_service import tenant_of
from triton_sam.serving import protocol
from triton_sam.serving.protocol import large as contract
from triton_sam.serving.protocol.tenancy import TENANT_HEADER

TILE_PX = 512  # a tile's side on screen pixels at its level: few requests, small PNGs
MAX_READS_PER_TILE = 16  # max_block reads one tile may cost (4 x 4: level 4 at 2048)
MAX_LEVEL = 24  # 2**24 * 512 px: past any image a reader opens
MAX_SHAPES = 256  # images whose shape the gateway remembers (least recently used goes)
CACHE_CONTROL = "private, max-age=86400, immutable"
_MODEL = re.compile(r"^(sam1|sam2)_large$")
_HANDLE = re.compile(r"^[0-9a-f]{32}$")

ConfigOf = Callable[[str], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class TilePlan:
    """Where a tile lies and how it is read.

    Attributes:
        block: ``(row0, col0, row1, col1)`` full-resolution pixels it covers.
        size: ``(rows, cols)`` of the tile's PNG.
        factor: full-resolution pixels per tile pixel, a side (``2**level``).
        reads: the full-resolution blocks read one by one (empty: one read of the source's
            pyramid level instead).
    """

    block: tuple[int, int, int, int]
    size: tuple[int, int]
    factor: int
    reads: tuple[tuple[int, int, int, int], ...]


def levels(image_size: tuple[int, int]) -> int:
    """How many levels the pyramid of an image of ``(rows, cols)`` has: the last one fits in
    one tile."""
    side = max(image_size)
    return 1 + max(0, math.ceil(math.log2(max(1, side) / TILE_PX)))


def plan(image_size: tuple[int, int], level: int, row: int, col: int, max_block: int) -> TilePlan:
    """The tile ``(row, col)`` of ``level``, and its reads of at most ``max_block`` a side.

    Raises:
        GatewayError: 404 naming ``level``, ``row`` or ``col`` for a tile outside the image.
    """
    rows, cols = image_size
    if not 0 <= level < levels(image_size):
        raise GatewayError(
            404, "NotFound", "level", f"got {level}, expected 0..{levels(image_size) - 1}"
        )
    factor = 2**level
    span = TILE_PX * factor  # full-resolution pixels a tile covers, a side
    for name, index, side in (("row", row, rows), ("col", col, cols)):
        count = math.ceil(side / span)
        if not 0 <= index < count:
            raise GatewayError(
                404, "NotFound", name, f"got {index}, expected 0..{count - 1} at level {level}"
            )
    block = (row * span, col * span, min(rows, (row + 1) * span), min(cols, (col + 1) * span))
    size = (math.ceil((block[2] - block[0]) / factor), math.ceil((block[3] - block[1]) / factor))
    # A read's side is a multiple of the factor, so each reduces to whole tile pixels.
    step = (max_block // factor) * factor
    if (
        step == 0
        or math.ceil((block[2] - block[0]) / step) * math.ceil((block[3] - block[1]) / step)
        > MAX_READS_PER_TILE
    ):
        return TilePlan(block, size, factor, ())
    reads = tuple(
        (r, c, min(r + step, block[2]), min(c + step, block[3]))
        for r in range(block[0], block[2], step)
        for c in range(block[1], block[3], step)
    )
    return TilePlan(block, size, factor, reads)


def reduce(rgb: np.ndarray, factor: int) -> np.ndarray:
    """The mean of each ``factor`` x ``factor`` cell of ``rgb`` (uint8 [h, w, 3]), rounded;
    a cell cut by the right or bottom edge averages the pixels it has (Pillow's ``reduce``)."""
    if factor == 1:
        return rgb
    from PIL import Image

    return np.asarray(Image.fromarray(rgb).reduce(factor))


def png(rgb: np.ndarray) -> bytes:
    """``rgb`` (uint8 [h, w, 3]) as PNG bytes (lossless: the page shows the mapped pixels)."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="PNG", compress_level=1)  # speed over bytes
    return out.getvalue()


class TileSource:
    """Reads tiles of large images through the gateway's backend (``app.state.gateway``).

    Args:
        config_of: a model's Triton config (the JSON form), for its ``max_block``.
    """

    def __init__(self, config_of: ConfigOf) -> None:
        self.config_of = config_of
        self._shapes: OrderedDict[tuple[str, str, str], tuple[int, ...]] = OrderedDict()
        self._max_block: dict[str, int] = {}

    async def call(
        self, backend: Any, tenant: str, model: str, request: dict[str, Any], rgb: bool = False
    ) -> tuple[dict[str, Any], np.ndarray | None]:
        """One op of the large model as ``tenant``: its JSON answer, and its pixels."""
        transport = backend.connection(tenant).transport()
        inputs = {contract.REQUEST: np.array([json.dumps(request).encode()], dtype=np.object_)}
        outputs = [contract.ANSWER, contract.RGB] if rgb else [contract.ANSWER]
        try:
            result = await transport.infer(model, inputs, outputs, idempotent=True)
        except errors.TritonSamError as e:
            raise _refusal(e) from e
        answer = json.loads(bytes(np.asarray(result[contract.ANSWER]).reshape(-1)[0]))
        return answer, (np.asarray(result[contract.RGB], dtype=np.uint8) if rgb else None)

    async def max_block(self, model: str) -> int:
        """The model's ``max_block`` config parameter (the contract's default without it)."""
        if model not in self._max_block:
            config = await self.config_of(model)
            value = protocol.config_parameters(config).get("max_block", "")
            self._max_block[model] = int(value) if value.isdigit() else contract.DEFAULT_MAX_BLOCK
        return self._max_block[model]

    async def image_size(
        self, backend: Any, tenant: str, model: str, handle: str, z: int | None
    ) -> tuple[int, int]:
        """``(rows, cols)`` of the image under ``handle`` (asked once, then remembered).

        Raises:
            GatewayError: 404 for a miss, 409 while pieces are missing, 400 naming ``z``.
        """
        key = (tenant, model, handle)
        shape = self._shapes.get(key)
        if shape is None:
            answer, _ = await self.call(backend, tenant, model, {"op": "status", "handle": handle})
            if answer.get("complete") is False:  # an upload with pieces missing
                raise GatewayError(
                    409, "Incomplete", "handle", "not every piece of the image is there yet"
                )
            shape = tuple(int(s) for s in answer["shape"])
            axes = answer.get("axes", "yx")
            shape = shape[1:3] + (shape[0],) if axes.startswith("z") else shape[:2] + (-1,)
            self._shapes[key] = shape
            if len(self._shapes) > MAX_SHAPES:
                self._shapes.popitem(last=False)
        self._shapes.move_to_end(key)
        depth = shape[2]
        if (depth < 0) != (z is None) or (z is not None and not 0 <= z < depth):
            expected = "none (not a volume)" if depth < 0 else f"0..{depth - 1}"
            raise invalid("z", f"got {z}, expected {expected}")
        return shape[0], shape[1]

    async def tile(
        self,
        backend: Any,
        tenant: str,
        model: str,
        handle: str,
        z: int | None,
        where: tuple[int, int, int],
    ) -> np.ndarray:
        """The tile ``(level, row, col)`` as uint8 [h, w, 3]."""
        size = await self.image_size(backend, tenant, model, handle, z)
        tile_plan = plan(size, *where, await self.max_block(model))
        base = {"op": "read", "handle": handle, **({} if z is None else {"z": z})}
        if not tile_plan.reads:
            return await self._from_source_level(backend, tenant, model, base, tile_plan, where[0])
        out = np.zeros((*tile_plan.size, 3), np.uint8)
        f, (top, left) = tile_plan.factor, tile_plan.block[:2]
        for block in tile_plan.reads:
            _, rgb = await self.call(
                backend, tenant, model, {**base, "block": list(block)}, rgb=True
            )
            part = reduce(rgb, f)
            r, c = (block[0] - top) // f, (block[1] - left) // f
            out[r : r + part.shape[0], c : c + part.shape[1]] = part
        return out

    async def _from_source_level(
        self, backend: Any, tenant: str, model: str, base: dict, tile_plan: TilePlan, level: int
    ) -> np.ndarray:
        request = {**base, "block": list(tile_plan.block), "level": level}
        try:
            _, rgb = await self.call(backend, tenant, model, request, rgb=True)
        except GatewayError as e:
            if e.status != 400:
                raise
            raise GatewayError(
                413,
                ERR_LIMIT,
                "level",
                f"level {level} needs more than {MAX_READS_PER_TILE} reads of max_block and the "
                f"source has no pyramid level {level} ({e}); use a finer level",
            ) from e
        if rgb.shape[:2] == tile_plan.size:
            return rgb
        from PIL import Image

        rows, cols = tile_plan.size  # the source's level is not exactly 2**level smaller
        return np.asarray(Image.fromarray(rgb).resize((cols, rows), Image.Resampling.BOX))


def _refusal(e: errors.TritonSamError) -> GatewayError:
    """What the large model (or Triton) answered, as the gateway's typed refusal."""
    status = {
        contract.ERR_HANDLE_NOT_FOUND: 404,
        protocol.ERR_INVALID_INPUT: 400,
        protocol.ERR_LIMIT: 413,
        protocol.ERR_OVERLOADED: 503,
    }
    code = protocol.error_code(str(e))
    if code in status:
        field = "handle" if code == contract.ERR_HANDLE_NOT_FOUND else "request"
        message = str(e)[str(e).find(protocol.ERROR_PREFIX) :]
        return GatewayError(
            status[code],
            code,
            field,
            message,
            retry_after_s=1 if code == protocol.ERR_OVERLOADED else 0,
        )
    if isinstance(e, errors.ModelNotReadyError):
        return GatewayError(404, "NotFound", "model", str(e))
    return from_client_error(e, "request")


def _int(request: Request, name: str, required: bool = True, top: int = 2**31) -> int | None:
    value = request.query_params.get(name)
    if value is None and not required:
        return None
    if value is None or not value.isdigit() or int(value) > top:
        raise invalid(name, f"got {value!r}, expected an integer 0..{top}")
    return int(value)


def tile_routes(config_of: ConfigOf) -> list[Route]:
    """The tile route, reading models' configs with ``config_of``."""
    source = TileSource(config_of)

    async def handle(request: Request) -> Response:
        try:
            model, handle = request.path_params["model"], request.path_params["handle"]
            if _MODEL.match(model) is None:
                raise GatewayError(
                    404, "NotFound", "model", f"{model!r} is not a large-image model"
                )
            if _HANDLE.match(handle) is None:
                raise GatewayError(
                    404, contract.ERR_HANDLE_NOT_FOUND, "handle", "not a handle the server issued"
                )
            where = (
                _int(request, "level", top=MAX_LEVEL),
                _int(request, "row"),
                _int(request, "col"),
            )
            z = _int(request, "z", required=False)
            backend = request.app.state.gateway.backend
            rgb = await source.tile(backend, tenant_of(request), model, handle, z, where)
        except GatewayError as e:
            refused = e.response()
            refused.headers["Cache-Control"] = "no-store"
            return refused
        headers = {"Cache-Control": CACHE_CONTROL, "Vary": TENANT_HEADER}
        return Response(png(rgb), media_type="image/png", headers=headers)

    return [Route("/web/large/{model}/{handle}/tile", handle, methods=["GET"])]
