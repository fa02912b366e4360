"""Embeds: admitted on their own line, the image received and hashed, the encoder's BLS call.

At most ``max_concurrent_embeds`` images are decoded, hashed, preprocessed (on as many threads,
off the event loop that serves clicks) and encoded at once, at most ``max_waiting_embeds``
wait, one more is refused at once (``QueueFull``, answered ``Overloaded``). Two requests that
embed the same image of one tenant share one encoder run. The id is computed here from what
was received, never taken from the client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures

import numpy as np

from .. import bounds, images, intake
from ..click_queue import ClickQueue
from ..protocol import embedding_cache as protocol
from . import disk
from .disk import FeatureStore
from .store import Scoped

IMAGE_BYTES, IMAGE_RGB = protocol.IMAGE_BYTES, protocol.IMAGE_RGB


class EmbedCancelledWhileWaiting(Exception):
    """The embed's request was cancelled while it waited for an encoder slot."""


def preferred_memory(pb_utils, *, gpu, device_id=0):
    """BLS keyword arguments asking for outputs in GPU (``device_id``) or CPU memory."""
    # PreferredMemory arrived in Triton 23.xx; older stubs take outputs where they come.
    if not hasattr(pb_utils, "PreferredMemory"):
        return {}
    if gpu:
        memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, device_id)
    else:
        memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
    return {"preferred_memory": memory}


class Embedder:
    """Runs the embeds of one session model instance (on its event loop).

    Args:
        pb_utils: ``triton_python_backend_utils``.
        settings: the model's :class:`~.settings.SessionSettings`.
        cache: its :class:`~.store.EmbeddingCache`.
        metrics: its :class:`~.metrics.Metrics`.
        pre: the family's preprocessing (None: only preprocessed float images).
        namespaces: what an image id depends on besides the pixels, per kind of input
            (``"rgb"`` and each encoder input; ``intake.session_namespace``).
        on_gpu / device_id: where the encoder's outputs are asked for.
    """

    def __init__(self, pb_utils, settings, cache, metrics, *, pre, namespaces, on_gpu, device_id):
        self._pb = pb_utils
        self.settings, self.cache, self.metrics = settings, cache, metrics
        self.pre, self.namespaces = pre, namespaces
        self.on_gpu, self.device_id = on_gpu, device_id
        self.queue = ClickQueue(
            settings.max_concurrent_embeds,
            settings.max_waiting_embeds,
            what="embeds wait for an encoder slot",
        )
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.queue.slots or 4, thread_name_prefix="triton_sam_intake"
        )
        self.in_flight = {}  # Scoped -> task of the encoder run in flight for it
        self.store = None
        if settings.feature_store_dir:  # evicted features go to disk and come back from it
            self.store = FeatureStore(
                settings.feature_store_dir,
                settings.feature_store_bytes,
                settings.embedding_names,
                self.pool,
            )
            cache.on_evict(self.spill)

    def spill(self, scoped, entry):
        """The cache evicted ``scoped``: its features go to the feature store (in the
        background: the request that caused the eviction does not wait for the disk)."""
        arrays = disk.host_arrays(entry.features)
        if arrays is not None:
            asyncio.ensure_future(self.store.spill(scoped, arrays, entry.hw))

    async def restore(self, scoped, *, crop=False):
        """The entry of ``scoped`` read back from the feature store into the cache (counted as
        ``restored``), or None: not in the cache and not on disk (or no store)."""
        if self.store is None or scoped in self.cache:
            return None
        found = await self.store.restore(scoped)
        if found is None or scoped in self.cache:  # an embed may have put it meanwhile
            return None
        features, hw = found
        nbytes = self.settings.embedding_bytes or sum(v.nbytes for v in features.values())
        evicted = self.cache.put(scoped, features, nbytes, hw, crop=crop)
        self.metrics.count("evictions", len(evicted))
        self.metrics.count("restored")
        return self.cache.entry(scoped)

    def close(self):
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def wait(self, scoped):
        """Wait for an embed of ``scoped`` in flight; whether there was one."""
        task = self.in_flight.get(scoped)
        if task is None:
            return False
        await task
        return True

    async def admitted(self, inputs, tenant, *, crop=False):
        """``(image id, scoped key, encoded, entry)`` of the image ``inputs`` carries, decoded,
        hashed, preprocessed and encoded under one of ``max_concurrent_embeds`` slots
        (QueueFull: refused at once); kept in the crop area when ``crop``.

        An embed that waited and was cancelled meanwhile is answered unrun. An image another
        request is already encoding shares that run and gives its own slot back at once.
        """
        waited = await self.queue.acquire()
        self.metrics.embeds(self.queue)
        held = True
        try:
            if waited and inputs.cancelled():
                raise EmbedCancelledWhileWaiting
            loop = asyncio.get_running_loop()
            image_id, kind, value = await loop.run_in_executor(
                self.pool, self.received_image, inputs
            )
            scoped = Scoped(tenant, image_id)
            task = self.in_flight.get(scoped)
            if task is None:
                task = asyncio.ensure_future(self.encode(scoped, kind, value, crop=crop))
                self.in_flight[scoped] = task
                task.add_done_callback(lambda _, i=scoped: self.in_flight.pop(i, None))
            else:  # the run in flight holds its own slot
                held = False
                self.queue.release()
            del value  # the run holds what it needs; a shared run needs none of it
            encoded, entry = await task  # a second embed of this image shares the run
            return image_id, scoped, encoded, entry
        finally:
            if held:
                self.queue.release()
            self.metrics.embeds(self.queue)

    def received_image(self, inputs):
        """(image id, kind, pixels or encoder feeds) of the image a request carries, or None.

        The id is computed here from what was received: the decoded uint8 pixels (raw or
        from file bytes: the same picture gets the same id either way) or, for the
        preprocessed float input, that tensor.
        """
        data = inputs.tensor(IMAGE_BYTES)
        if data is not None:
            rgb = self._decoded(data)
            return images.image_id(rgb, self.namespaces["rgb"]), "rgb", rgb
        raw = inputs.tensor(IMAGE_RGB)
        if raw is not None:
            if self.pre is None:
                raise bounds.RequestError(IMAGE_RGB, "this server's config has no preprocessing")
            rgb = intake.check_rgb(
                raw.as_numpy(), max_pixels=self.settings.max_image_pixels, field=IMAGE_RGB
            )
            return images.image_id(rgb, self.namespaces["rgb"]), "rgb", rgb
        names = self.settings.encoder_inputs
        feeds = [inputs.tensor(n) for n in names]
        if not feeds or any(t is None for t in feeds):
            return None
        digest = []
        for name, tensor in zip(names, feeds, strict=True):
            array = tensor.as_numpy()
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise bounds.RequestError(name, "got NaN or infinity, expected finite values")
            digest.append(images.image_id(array, self.namespaces[name]))
        if len(digest) == 1:
            return digest[0], "tensor", feeds
        joined = np.frombuffer("".join(digest).encode(), np.uint8)
        return images.image_id(joined, self.namespaces["rgb"]), "tensor", feeds

    def _decoded(self, data):
        """The uint8 [H, W, 3] pixels of an ``image_bytes`` tensor, within the bounds."""
        if self.pre is None:
            raise bounds.RequestError(IMAGE_BYTES, "this server's config has no preprocessing")
        blob = data.as_numpy().reshape(-1)
        if blob.size != 1:
            raise bounds.RequestError(
                IMAGE_BYTES, f"got {blob.size} elements, expected 1 (one encoded file)"
            )
        blob = bytes(blob[0])
        limit = self.settings.max_image_bytes
        if len(blob) > limit:
            raise bounds.RequestError(
                IMAGE_BYTES, f"got {len(blob)} bytes, expected at most {limit}"
            )
        max_pixels = self.settings.max_image_pixels
        return intake.decode_image(blob, max_pixels=max_pixels, field=IMAGE_BYTES)

    async def encode(self, scoped, kind, value, *, crop=False):
        """``(encoded, entry)``: the cache entry of ``scoped``, after an encoder run (1) unless
        it was held already (0)."""
        entry, evicted = self.cache.hit(scoped, crop=crop)
        if entry is not None:
            self.metrics.count("evictions", len(evicted))
            return 0, entry
        entry = await self.restore(scoped, crop=crop)
        if entry is not None:  # embedded before and spilled to disk: no encoder run
            return 0, entry
        features = await self._features(kind, value)
        nbytes = self.settings.embedding_bytes or sum(
            v.nbytes if isinstance(v, np.ndarray) else v.as_numpy().nbytes
            for v in features.values()
            if isinstance(v, np.ndarray) or v.is_cpu()
        )
        hw = (int(value.shape[0]), int(value.shape[1])) if kind == "rgb" else None
        evicted = self.cache.put(scoped, features, nbytes, hw, crop=crop)
        self.metrics.count("evictions", len(evicted))
        return 1, self.cache.entry(scoped)

    async def _features(self, kind, value):
        """The encoder's outputs for one image: name -> what the cache keeps."""
        pb_utils, encoder = self._pb, self.settings.encoder_model
        if kind == "rgb":  # off the event loop: other requests' BLS calls go on meanwhile
            tensor = await asyncio.get_running_loop().run_in_executor(
                self.pool, intake.preprocess, value, self.pre
            )
            feeds = [pb_utils.Tensor(self.settings.encoder_inputs[0], tensor)]
        else:
            feeds = value
        # with a feature store the features stay in host memory: they must reach the disk
        gpu = self.on_gpu and self.store is None
        request = pb_utils.InferenceRequest(
            model_name=encoder,
            inputs=feeds,
            requested_output_names=list(self.settings.embedding_names),
            **preferred_memory(pb_utils, gpu=gpu, device_id=self.device_id),
        )
        response = await request.async_exec()
        if response.has_error():
            raise RuntimeError(f"{encoder}: {response.error().message()}")
        keep_shm = self.settings.cpu_features == "shared_memory"
        features = {}
        for name in self.settings.embedding_names:
            tensor = pb_utils.get_output_tensor_by_name(response, name)
            if tensor is None:
                raise RuntimeError(f"{encoder} returned no {name!r}")
            # GPU: keep the BLS output tensor itself (device memory, no host round trip).
            # CPU, shared_memory: keep it too (it lives in the stub's shm pool; the decoder's
            # BLS request then passes its handle, the python backend copies nothing).
            # CPU, process: copy it out of the pool (and into it again on every click).
            keep = not tensor.is_cpu() or keep_shm
            features[name] = tensor if keep else np.array(tensor.as_numpy())
        return features
