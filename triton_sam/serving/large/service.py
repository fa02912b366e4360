"""The large model's ops over a session (see ``serving/large_model.py`` for the design).

:class:`Service` answers one parsed request at a time on the model's event loop. What it
needs from the outside is a *session* (``embed(tenant, rgb)``, ``probe(tenant, image_id)``,
``predict(tenant, image_id, points, labels, box, multimask)``: the BLS calls to
``<family>_session`` in :mod:`.bls`, a stand-in in the unit tests) and two thread pools:
``clicks`` (a prediction's block read and RLE work) and ``background`` (opens, puts,
precompute reads), so a click never waits for a thread behind someone's open or precompute.
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np

from .. import protocol as envelope
from ..bounds import RequestError
from ..click_queue import ClickQueue, QueueFull
from ..protocol import large as protocol
from ..tiles import Block, TileGrid
from . import crop, planning, requests
from .handles import Handles, Image, block_key, remembered_tiles
from .reads import read_block
from .spool import Spool, axes_of

# Blocks remembered per image (block -> the session's image id): a tile grid's worth and
# more windows than anyone clicks between two evictions; the oldest go first.
MAX_REMEMBERED = 4096


def datasets():
    """The readers (``serving/datasets``), imported on the first open: the model loads without
    them, and a server with no data roots never imports zarr or tifffile."""
    from .. import datasets as readers

    return readers


def pixel_mapping():
    """The one mapping of intensities to SAM's RGB (``serving/datasets/pixels.py``)."""
    from ..datasets import pixels

    return pixels


class Service:
    """The ops of :data:`~..protocol.large.OPS` for every tenant.

    Args:
        settings: the model's :class:`~..protocol.large.LargeSettings`.
        session: the session model's calls (see the module doc).
        clicks, background: ``concurrent.futures`` executors.
    """

    def __init__(self, settings, session, *, clicks, background) -> None:
        self.settings, self.session = settings, session
        self.clicks, self.background = clicks, background
        self.handles = Handles(settings.max_handles)
        self.spool = Spool(settings.spool_dir, settings.max_upload_bytes)
        self.opens = ClickQueue(
            settings.max_concurrent_opens,
            settings.max_waiting_opens,
            what="opens and creates wait for a slot",
        )
        self.puts = ClickQueue(
            settings.max_concurrent_puts,
            settings.max_waiting_puts,
            what="puts wait for a slot (each holds its piece in memory)",
        )
        self._roots = None

    def roots(self):
        """The data roots (``settings.data_roots``), parsed once."""
        if self._roots is None:
            self._roots = datasets().DataRoots.from_json(self.settings.data_roots)
        return self._roots

    async def answer(self, tenant: str, blob: bytes, pixels: np.ndarray | None) -> dict:
        """The JSON answer (a dict) to one request of ``tenant``."""
        request = requests.parse(blob, self.settings.max_request_bytes)
        op = request["op"]
        if (pixels is None) == (op == "put"):
            raise RequestError(
                protocol.PIXELS,
                "missing: a put carries its piece"
                if pixels is None
                else f"given to {op!r}; only a put carries pixels",
            )
        if op in ("open", "create"):
            async with self._admitted(self.opens):
                return await getattr(self, f"_{op}")(tenant, request)
        if op == "put":
            async with self._admitted(self.puts):
                return await self._put(tenant, request, pixels)
        return await getattr(self, f"_{op}")(tenant, request)

    def close(self) -> None:
        self.handles.close_all()
        self.spool.close()

    @contextlib.asynccontextmanager
    async def _admitted(self, line: ClickQueue):
        try:
            await line.acquire()
        except QueueFull as e:
            raise envelope.ProtocolError(envelope.ERR_OVERLOADED, str(e)) from None
        try:
            yield
        finally:
            line.release()

    # -- images ------------------------------------------------------------------------------
    async def _open(self, tenant, request):
        dataset = request.get("dataset")
        key = request.get("key")
        if not isinstance(dataset, str) or not dataset:
            raise RequestError("request.dataset", "expected '<root>/<path inside it>'")
        if key is not None and not isinstance(key, str):
            raise RequestError("request.key", "expected text (an array inside the dataset)")
        tile, halo = self._block_sides(request)
        readers = datasets()

        def opened():
            path = self.roots().resolve(dataset, tenant, field="request.dataset")
            return readers.open_source(path, key, field="request.dataset")

        source = await self._run(self.background, opened)
        try:
            image = self._image(source, request, tile, halo)
            await self._resolve(image)
        except BaseException:
            source.close()
            raise
        return self._describe(self.handles.add(tenant, image), image)

    async def _create(self, tenant, request):
        shape = requests.ints(request, "shape", (2, 3, 4), minimum=1)
        dtype = requests.choice(request, "dtype", protocol.DTYPES, "")
        axes = request.get("axes")
        axes = axes_of(shape, axes if axes is None or isinstance(axes, str) else repr(axes))
        tile, halo = self._block_sides(request)
        upload = self.spool.create(tenant, shape, dtype, axes)
        try:
            image = self._image(upload, request, tile, halo)
        except BaseException:
            upload.close()
            raise
        image.upload = upload
        return self._describe(self.handles.add(tenant, image), image)

    async def _put(self, tenant, request, pixels):
        image = self.handles.get(tenant, requests.handle(request))
        if image.upload is None:
            raise RequestError("request.handle", "an opened dataset takes no pieces")
        offset = requests.ints(request, "offset", (2, 3))
        most = self.settings.max_piece_pixels
        if pixels.ndim < 2 or pixels.shape[0] * pixels.shape[1] > most:
            raise envelope.ProtocolError(
                envelope.ERR_LIMIT,
                f"{protocol.PIXELS}: got {list(pixels.shape)}, expected [rows, cols(, c)] "
                f"of at most max_piece_pixels = {most} pixels",
                protocol.PIXELS,
            )
        received = await self._run(self.background, image.upload.put, offset, pixels)
        if image.upload.complete and image.resolved is None:
            await self._resolve(image)
        return {"received": received, "complete": image.upload.complete}

    async def _close(self, tenant, request):
        self.handles.close(tenant, requests.handle(request))
        return {"closed": True}

    async def _status(self, tenant, request):
        image = self.handles.get(tenant, requests.handle(request))
        z = requests.optional_z(request, image.depth)
        held = []
        for tile_id, image_id in remembered_tiles(image, z):  # never a walk of the grid
            if await self.session.probe(tenant, image_id):
                held.append(tile_id)
        return {**self._describe(request["handle"], image), "held": sorted(held)}

    def _block_sides(self, request):
        s = self.settings
        tile = requests.block_sides(request, "tile", s.tile, minimum=protocol.MIN_TILE)
        halo = requests.block_sides(request, "halo", s.halo, minimum=0)
        requests.check_block(tile, halo, s.max_block)
        return tile, halo

    def _image(self, source, request, tile, halo) -> Image:
        """An image of ``source`` (its mapping parsed, not yet resolved)."""
        plane = source.shape[1:3] if source.axes.startswith("z") else source.shape[:2]
        mapping = pixel_mapping().parse_mapping(
            request.get("mapping"), source.dtype, field="request.mapping"
        )
        window = min(self.settings.window, self.settings.max_block)
        return Image(source, TileGrid(tuple(plane), tile, halo), (window, window), mapping)

    async def _resolve(self, image: Image) -> None:
        """The mapping resolved on the pixels (a percentile's min/max), once they are all
        there: at open, or at the put that completes an upload."""
        if not image.complete:
            return
        pixels = pixel_mapping()
        image.resolved = await self._run(
            self.background,
            pixels.resolve_mapping,
            image.mapping,
            image.source,
            self.settings.sample_pixels,
            None,
        )

    def _describe(self, handle: str, image: Image) -> dict:
        grid = image.grid
        mapping = image.resolved if image.resolved is not None else image.mapping
        return {
            "handle": handle,
            "shape": [int(v) for v in image.source.shape],
            "dtype": str(np.dtype(image.source.dtype)),
            "axes": image.source.axes,
            "tile": list(grid.tile),
            "halo": list(grid.halo),
            "grid": list(grid.blocks_per_axis),
            "window": list(image.window),
            "mapping": pixel_mapping().mapping_json(mapping),
            "complete": image.complete,
        }

    def _ready(self, tenant, request) -> Image:
        image = self.handles.get(tenant, requests.handle(request))
        if not image.complete:
            raise RequestError(
                "request.handle",
                f"the image is not complete: {image.upload.received} of "
                f"{image.upload.total} pixels put",
            )
        return image

    # -- predictions and precompute ----------------------------------------------------------
    async def _predict(self, tenant, request):
        image = self._ready(tenant, request)
        z = requests.optional_z(request, image.depth)
        prompt = planning.Prompt(*requests.prompts(request))
        multimask = requests.flag(request, "multimask_output")
        mode = requests.choice(request, "mode", protocol.MODES, "auto")
        shape = image.grid.shape
        prompt.check_inside(shape)
        run = _Run(self, tenant, image, z, prompt, multimask)
        if mode == "window":
            await run.on(planning.window_block(prompt, shape, image.window), None)
        else:
            await run.on(*planning.tile_block(image.grid, prompt)[::-1])
        tried = {run.block}
        while mode == "auto" and run.cut and run.windows < planning.MAX_WINDOWS:
            best = run.masks[0]
            block = planning.window_block(prompt, shape, image.window, best["box"])
            if block in tried:
                break
            tried.add(block)
            await run.on(block, None)
        return run.answer()

    async def _read(self, tenant, request):
        image = self._ready(tenant, request)
        to_rgb, most = pixel_mapping().to_rgb, self.settings.max_block
        answer, rgb = await self._run(self.background, read_block, image, request, most, to_rgb)
        return {**answer, protocol.RGB: rgb}  # the model answers it as its own tensor

    async def _embed(self, tenant, request):
        image = self._ready(tenant, request)
        z = requests.optional_z(request, image.depth)
        most = self.settings.max_tiles_per_request
        embedded, held = [], []
        for tile_id in requests.tile_ids(request, len(image.grid), most):
            block = image.grid.outer(tile_id)
            image_id = image.embedded.get(block_key(z, block))
            if image_id is not None and await self.session.probe(tenant, image_id):
                held.append(tile_id)
                continue
            _, encoded = await self.embed_block(tenant, image, z, block, self.background)
            (embedded if encoded else held).append(tile_id)
        return {"embedded": embedded, "held": held}

    async def embed_block(self, tenant, image: Image, z, block: Block, pool):
        """(image id, whether the encoder ran) of ``block``: its pixels read on ``pool``,
        mapped to RGB and embedded by the session model, the id remembered."""
        pixels = pixel_mapping()
        mapping = image.resolved if image.resolved is not None else image.mapping

        def rgb():
            rows, cols = block.slices()
            return np.ascontiguousarray(pixels.to_rgb(image.source.read(rows, cols, z), mapping))

        image_id, encoded = await self.session.embed(tenant, await self._run(pool, rgb))
        remembered = image.embedded
        remembered[block_key(z, block)] = image_id
        remembered.move_to_end(block_key(z, block))
        while len(remembered) > MAX_REMEMBERED:
            remembered.popitem(last=False)
        return image_id, encoded

    @staticmethod
    async def _run(pool, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


class _Run:
    """One prediction's blocks: the masks of the last one, and what it cost."""

    def __init__(self, service: Service, tenant, image: Image, z, prompt, multimask) -> None:
        self.service, self.tenant, self.image, self.z = service, tenant, image, z
        self.prompt, self.multimask = prompt, multimask
        self.embedded = self.windows = 0
        self.block = self.tile_id = self.image_id = None
        self.masks: list[dict] = []
        self.dropped = 0

    @property
    def cut(self) -> bool:
        return bool(self.masks) and self.masks[0]["cut"]

    async def on(self, block: Block, tile_id: int | None) -> None:
        """Predict on ``block`` (the tile ``tile_id``, or a window when None)."""
        framed = planning.frame(self.prompt, block)
        service, remembered = self.service, self.image.embedded
        key = block_key(self.z, block)
        for attempt in range(2):  # a miss (evicted, restarted): embed again, once
            image_id = remembered.get(key)
            if image_id is None:
                pool = service.clicks
                image_id, encoded = await service.embed_block(
                    self.tenant, self.image, self.z, block, pool
                )
                self.embedded += int(encoded)
            try:
                found = await service.session.predict(
                    self.tenant,
                    image_id,
                    framed.points,
                    framed.labels,
                    framed.box,
                    self.multimask,
                )
                break
            except envelope.ProtocolError as e:
                if e.code != envelope.ERR_EMBEDDING_NOT_FOUND or attempt:
                    raise
                remembered.pop(key, None)
        shape = self.image.grid.shape

        self.masks = await Service._run(service.clicks, crop.block_answers, found, block, shape)
        self.block, self.tile_id, self.dropped = block, tile_id, framed.dropped
        self.image_id = image_id
        self.windows += tile_id is None

    def answer(self) -> dict:
        grid, block = self.image.grid, self.block
        return {
            "image_size": list(grid.shape),
            "masks": self.masks,
            "tiles": [self.tile_id] if self.tile_id is not None else grid.tiles_touching(block),
            "embedded": self.embedded,
            "mode": "tile" if self.tile_id is not None else "window",
            "block": [*block.begin, *block.end],
            "dropped": self.dropped,
            "image_id": self.image_id,  # the session model's: later clicks may go there
        }
