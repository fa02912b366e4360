"""Triton python-backend (BLS) model that keeps image features on the server: ``<family>_session``.

The repository writer copies this file verbatim to ``<family>_session/1/model.py`` for both
targets. It runs inside Triton's stub, so it imports only asyncio, json, collections, numpy
and ``triton_python_backend_utils``; the encoder and decoder it calls through BLS are the
family's ``<family>_encoder`` / ``<family>_decoder`` models of the same repository (onnxruntime
backend in the GPU container, runner.py in the embedded server).

One request, three uses (every input but ``image_id`` is ``optional``):

- **embed**: ``image_id`` + the encoder inputs (``image``). Runs the encoder unless the id is
  already cached (idempotent), keeps its outputs under the id, answers ``encoded`` = 1 (ran)
  or 0 (was cached).
- **probe**: ``image_id`` alone. ``encoded`` = 0 when cached, else the miss error below.
- **predict**: ``image_id`` + prompt tensors (``point_coords``, ``point_labels``; optionally
  ``mask_input``/``has_mask_input``, or ``previous_key`` + ``previous_mask_index`` naming
  low-res logits this server kept from an earlier prediction). Calls the decoder with the
  cached features and returns the decoder outputs the request asked for. With
  ``logits_key``, the returned low-res logits (clipped like the official predictor's) are
  kept under that key for a later refinement, so a refinement click sends 8 bytes, not the
  256 KiB mask.

A miss (unknown image id or logits key: never embedded, evicted, or the server restarted)
answers an error whose message starts with ``triton_sam.EmbeddingNotFound`` (status
NOT_FOUND); clients raise ``EmbeddingNotFoundError``, re-embed and retry once.

Concurrency and instances: the model has ONE instance (the renderer forces it), because the
cache lives in that instance's stub process; a second instance would hold a second cache and
clicks routed to it would miss. Triton calls ``execute`` of one instance serially, so an
``execute`` that awaited its BLS calls would make a click wait for any encode in flight
(seconds on a CPU). Instead ``execute`` only schedules each request on the instance's own
event loop (a thread of the stub) and returns; each request answers through its response
sender when its BLS calls are done (python backend >= 24.05 lets non-decoupled models do
this: one response per request, sent with the FINAL flag). So a click on a cached image runs
while another image is being encoded, and the decoder's dynamic batcher can batch clicks of
different images. Every cache access happens on that loop: no locks. Two requests that embed
the same image share one encoder run. Scale the encoder and decoder instances, not this one:
it only routes tensors; their queue bounds also bound the work in flight here.

Memory is bounded by an LRU over images: at most ``max_images`` images and ``max_bytes`` bytes
(features + kept logits); the least recently used image goes first. On a GPU instance the
encoder outputs are requested in GPU memory and kept as the BLS output tensors themselves
(DLPack-capable, never copied to the host) and handed back to the decoder as they are; on a
CPU instance they are copied out of the stub's shared-memory pool into process memory, so the
pool stays small. Gauges ``triton_sam_session_cached_images`` / ``_cached_bytes`` and the
counters ``triton_sam_session_{hits,misses,evictions}`` are on Triton's metrics endpoint.

Config ``parameters`` read here (keys repeated in session_config.py; a unit test keeps both
equal): encoder_model, decoder_model, embedding_names, max_images, max_bytes, embedding_bytes,
logits_per_image, low_res_logit_limit.
"""

import asyncio
import json
import threading
from collections import OrderedDict

import numpy as np
import triton_python_backend_utils as pb_utils

MISS_MARKER = "triton_sam.EmbeddingNotFound"
IMAGE_ID = "image_id"
ENCODED = "encoded"
LOGITS_KEY = "logits_key"
PREVIOUS_KEY = "previous_key"
PREVIOUS_MASK_INDEX = "previous_mask_index"
MASK_INPUT = "mask_input"
HAS_MASK_INPUT = "has_mask_input"
# Decoder outputs that are low-res logits (what a client passes back as mask_input).
MASK_OUTPUTS = ("masks", "multimask_masks")
CONTROL_INPUTS = (IMAGE_ID, LOGITS_KEY, PREVIOUS_KEY, PREVIOUS_MASK_INDEX)
METRIC_PREFIX = "triton_sam_session_"


class EmbeddingMiss(Exception):
    """An image id (or logits key) this instance does not hold."""


class _Entry:
    __slots__ = ("features", "feature_bytes", "logits")

    def __init__(self, features, feature_bytes):
        self.features = features  # name -> pb_utils.Tensor (GPU) or np.ndarray (CPU)
        self.feature_bytes = feature_bytes
        self.logits = OrderedDict()  # key -> np.ndarray [1, M, S, S], LRU order

    @property
    def nbytes(self):
        return self.feature_bytes + sum(a.nbytes for a in self.logits.values())


class EmbeddingCache:
    """LRU of image features (+ a few kept low-res logits per image), bounded in count and bytes.

    Pure Python (no Triton): the python model drives it from one event loop, so no locks.
    The most recently inserted image is never evicted by its own insertion, so one image
    larger than ``max_bytes`` is still served (alone).
    """

    def __init__(self, max_images, max_bytes=0, logits_per_image=4):
        if max_images < 1:
            raise ValueError(f"max_images: got {max_images}, expected >= 1")
        self.max_images = int(max_images)
        self.max_bytes = int(max_bytes)  # 0 = no byte bound
        self.logits_per_image = int(logits_per_image)
        self._entries = OrderedDict()
        self.nbytes = 0
        self.evictions = 0

    def __len__(self):
        return len(self._entries)

    def __contains__(self, image_id):
        return image_id in self._entries

    def ids(self):
        """Cached ids, least recently used first."""
        return list(self._entries)

    def get(self, image_id):
        """The features of ``image_id`` (marked most recently used); EmbeddingMiss if absent."""
        entry = self._entries.get(image_id)
        if entry is None:
            raise EmbeddingMiss(f"image_id {image_id!r} is not cached")
        self._entries.move_to_end(image_id)
        return entry.features

    def put(self, image_id, features, feature_bytes):
        """Keep ``features`` under ``image_id``; returns the ids evicted to stay in bounds."""
        old = self._entries.pop(image_id, None)
        if old is not None:
            self.nbytes -= old.nbytes
        self._entries[image_id] = _Entry(features, int(feature_bytes))
        self.nbytes += int(feature_bytes)
        return self._shrink()

    def put_logits(self, image_id, key, logits):
        """Keep low-res logits of a prediction on ``image_id`` under ``key``."""
        entry = self._entries.get(image_id)
        if entry is None or self.logits_per_image < 1:
            return []
        old = entry.logits.pop(key, None)
        if old is not None:
            self.nbytes -= old.nbytes
        entry.logits[key] = logits
        self.nbytes += logits.nbytes
        while len(entry.logits) > self.logits_per_image:
            _, dropped = entry.logits.popitem(last=False)
            self.nbytes -= dropped.nbytes
        return self._shrink()

    def get_logits(self, image_id, key):
        """Logits kept under ``key`` for ``image_id``; EmbeddingMiss if either is absent."""
        entry = self._entries.get(image_id)
        logits = None if entry is None else entry.logits.get(key)
        if logits is None:
            raise EmbeddingMiss(f"no low-res logits {key!r} kept for image_id {image_id!r}")
        entry.logits.move_to_end(key)
        return logits

    def _shrink(self):
        evicted = []
        while len(self._entries) > 1 and (
            len(self._entries) > self.max_images
            or (self.max_bytes and self.nbytes > self.max_bytes)
        ):
            image_id, entry = self._entries.popitem(last=False)
            self.nbytes -= entry.nbytes
            evicted.append(image_id)
        self.evictions += len(evicted)
        return evicted


class TritonPythonModel:
    """The ``<family>_session`` model: embed / probe / predict against a per-instance LRU."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.encoder_model = params["encoder_model"]
        self.decoder_model = params["decoder_model"]
        self.embedding_names = [n for n in params["embedding_names"].split(",") if n]
        self.embedding_bytes = int(params.get("embedding_bytes") or 0)
        limit = params.get("low_res_logit_limit") or ""
        self.logit_limit = float(limit) if limit else None
        self.cache = EmbeddingCache(
            int(params.get("max_images") or 16),
            int(params.get("max_bytes") or 0),
            int(params.get("logits_per_image") or 4),
        )
        inputs = {t["name"]: t for t in config["input"]}
        self.encoder_inputs = [n for n in params["encoder_inputs"].split(",") if n]
        self.prompt_inputs = [
            n for n in inputs if n not in CONTROL_INPUTS and n not in self.encoder_inputs
        ]
        mask = inputs.get(MASK_INPUT)
        self.mask_dims = [1] + [int(d) for d in mask["dims"]] if mask else None
        self.on_gpu = args.get("model_instance_kind") == "GPU"
        self.device_id = int(args.get("model_instance_device_id") or 0)
        self.metrics = _Metrics(args)
        self.embeds = {}  # image_id -> task of the encoder run in flight for it
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="triton_sam_session", daemon=True
        )
        self.thread.start()

    def execute(self, requests):
        """Schedule every request on the instance's loop and return at once (see module doc).

        Returns None: each request is answered by its response sender.
        """
        for request in requests:
            asyncio.run_coroutine_threadsafe(self._respond(request), self.loop)
        return None

    def finalize(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.cache = None
        self.metrics.close()

    async def _respond(self, request):
        sender = request.get_response_sender()
        try:
            response = await self._answer(request, self.embeds)
        except Exception as e:  # _answer catches its own; this only guards the send below
            response = _error(f"{type(e).__name__}: {e}", "INTERNAL")
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        self.metrics.publish(self.cache)

    # -- one request -----------------------------------------------------------------------
    async def _answer(self, request, embeds):
        try:
            if hasattr(request, "is_cancelled") and request.is_cancelled():
                return _error("request cancelled before execution", "CANCELLED")
            image_id = _string(request, IMAGE_ID)
            if image_id is None:
                return _error(f"input {IMAGE_ID!r} is required", "INVALID_ARG")
            wanted = _requested(request)
            encoder_feeds = [_input(request, n) for n in self.encoder_inputs]
            outputs = []
            if all(t is not None for t in encoder_feeds) and encoder_feeds:
                task = embeds.get(image_id)
                if task is None:
                    task = embeds[image_id] = asyncio.ensure_future(
                        self._embed(image_id, encoder_feeds)
                    )
                    task.add_done_callback(lambda _: embeds.pop(image_id, None))
                encoded = await task  # a second embed of this image shares the run
            elif image_id in embeds:  # being embedded by another request
                await embeds[image_id]
                encoded = 0
            else:
                encoded = None
            if _input(request, "point_coords") is not None:
                outputs = await self._predict(request, image_id, wanted)
            elif encoded is None:  # probe
                self._features(image_id)
                encoded = 0
            if ENCODED in wanted or not wanted:
                value = np.array([[encoded or 0]], dtype=np.int32)
                outputs.append(pb_utils.Tensor(ENCODED, value))
            return pb_utils.InferenceResponse(output_tensors=outputs)
        except EmbeddingMiss as e:
            self.metrics.count("misses")
            return _error(
                f"{MISS_MARKER}: {e} on this server (never embedded, evicted, or the server "
                "restarted); embed it again (send image_id with the image)",
                "NOT_FOUND",
            )
        except Exception as e:  # never let one request take the stub (and its cache) down
            return _error(f"{type(e).__name__}: {e}", "INTERNAL")

    async def _embed(self, image_id, feeds):
        if image_id in self.cache:
            self.cache.get(image_id)  # refresh its LRU position
            return 0
        request = pb_utils.InferenceRequest(
            model_name=self.encoder_model,
            inputs=feeds,
            requested_output_names=list(self.embedding_names),
            **self._preferred_memory(gpu=self.on_gpu),
        )
        response = await request.async_exec()
        if response.has_error():
            raise RuntimeError(f"{self.encoder_model}: {response.error().message()}")
        features = {}
        for name in self.embedding_names:
            tensor = pb_utils.get_output_tensor_by_name(response, name)
            if tensor is None:
                raise RuntimeError(f"{self.encoder_model} returned no {name!r}")
            # GPU: keep the BLS output tensor itself (device memory, no host round trip).
            # CPU: copy it out of the stub's shared-memory pool into process memory.
            features[name] = tensor if not tensor.is_cpu() else np.array(tensor.as_numpy())
        nbytes = self.embedding_bytes or sum(
            v.nbytes for v in features.values() if isinstance(v, np.ndarray)
        )
        evicted = self.cache.put(image_id, features, nbytes)
        self.metrics.count("evictions", len(evicted))
        return 1

    def _features(self, image_id):
        features = self.cache.get(image_id)  # EmbeddingMiss when absent
        self.metrics.count("hits")
        return features

    async def _predict(self, request, image_id, wanted):
        features = self._features(image_id)
        feeds = [
            value if not isinstance(value, np.ndarray) else pb_utils.Tensor(name, value)
            for name, value in features.items()
        ]
        names_given = set()
        for name in self.prompt_inputs:
            tensor = _input(request, name)
            if tensor is not None:
                feeds.append(tensor)
                names_given.add(name)
        if self.mask_dims is not None and MASK_INPUT not in names_given:
            feeds += self._mask_feeds(request, image_id)
        elif MASK_INPUT in names_given and HAS_MASK_INPUT not in names_given:
            feeds.append(pb_utils.Tensor(HAS_MASK_INPUT, np.ones((1, 1), np.float32)))
        names = [n for n in wanted if n != ENCODED] or ["masks", "iou_predictions"]
        bls = pb_utils.InferenceRequest(
            model_name=self.decoder_model,
            inputs=feeds,
            requested_output_names=names,
            **self._preferred_memory(gpu=False),  # small, and kept logits are clipped on CPU
        )
        response = await bls.async_exec()
        if response.has_error():
            raise RuntimeError(f"{self.decoder_model}: {response.error().message()}")
        outputs = [pb_utils.get_output_tensor_by_name(response, n) for n in names]
        key = _string(request, LOGITS_KEY)
        if key:
            for tensor in outputs:
                if tensor is not None and tensor.name() in MASK_OUTPUTS and tensor.is_cpu():
                    logits = np.array(tensor.as_numpy(), dtype=np.float32)
                    if self.logit_limit is not None:
                        np.clip(logits, -self.logit_limit, self.logit_limit, out=logits)
                    evicted = self.cache.put_logits(image_id, key, logits)
                    self.metrics.count("evictions", len(evicted))
        return [t for t in outputs if t is not None]

    def _mask_feeds(self, request, image_id):
        """mask_input from kept logits (previous_key + previous_mask_index), else zeros."""
        key = _string(request, PREVIOUS_KEY)
        if key:
            index_tensor = _input(request, PREVIOUS_MASK_INDEX)
            index = 0 if index_tensor is None else int(index_tensor.as_numpy().reshape(-1)[0])
            logits = self.cache.get_logits(image_id, key)
            if not 0 <= index < logits.shape[1]:
                raise ValueError(
                    f"{PREVIOUS_MASK_INDEX}: got {index}, expected 0..{logits.shape[1] - 1}"
                )
            mask = np.ascontiguousarray(logits[:, index : index + 1])
            has = 1.0
        else:
            mask = np.zeros(self.mask_dims, np.float32)
            has = 0.0
        return [
            pb_utils.Tensor(MASK_INPUT, mask),
            pb_utils.Tensor(HAS_MASK_INPUT, np.full((1, 1), has, np.float32)),
        ]

    def _preferred_memory(self, *, gpu):
        # PreferredMemory arrived in Triton 23.xx; older stubs take outputs where they come.
        if not hasattr(pb_utils, "PreferredMemory"):
            return {}
        if gpu:
            memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, self.device_id)
        else:
            memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
        return {"preferred_memory": memory}


class _Metrics:
    """Gauges of the cache and counters of hits/misses/evictions; no-ops without metrics."""

    def __init__(self, args):
        self._families, self._metrics = [], {}
        if not hasattr(pb_utils, "MetricFamily"):
            return
        labels = {"model": args["model_name"], "version": str(args["model_version"])}
        specs = (
            ("cached_images", "GAUGE", "Images whose features the session model holds"),
            ("cached_bytes", "GAUGE", "Bytes of features and kept logits the session model holds"),
            ("hits", "COUNTER", "Predictions answered from cached features"),
            ("misses", "COUNTER", "Requests for an image id (or logits key) not cached"),
            ("evictions", "COUNTER", "Images evicted by the LRU bound"),
        )
        try:
            for name, kind, description in specs:
                family = pb_utils.MetricFamily(
                    name=METRIC_PREFIX + name,
                    description=description,
                    kind=getattr(pb_utils.MetricFamily, kind),
                )
                self._families.append(family)
                self._metrics[name] = family.Metric(labels=labels)
        except Exception:  # metrics disabled (--allow-metrics=false): record nothing
            self._families, self._metrics = [], {}

    def count(self, name, value=1):
        metric = self._metrics.get(name)
        if metric is not None and value:
            metric.increment(value)

    def publish(self, cache):
        if "cached_images" in self._metrics:
            self._metrics["cached_images"].set(len(cache))
            self._metrics["cached_bytes"].set(cache.nbytes)

    def close(self):
        # python-backend rule: metrics go before their families
        self._metrics.clear()
        self._families.clear()


def _input(request, name):
    return pb_utils.get_input_tensor_by_name(request, name)


def _string(request, name):
    tensor = _input(request, name)
    if tensor is None:
        return None
    value = tensor.as_numpy().reshape(-1)
    if value.size == 0:
        return None
    item = value[0]
    return item.decode("utf-8") if isinstance(item, bytes) else str(item)


def _requested(request):
    if hasattr(request, "requested_output_names"):
        return list(request.requested_output_names())
    return []


def _error(message, code):
    # TritonError codes arrived in Triton 23.10; older stubs only take the message.
    code = getattr(pb_utils.TritonError, code, None)
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)
