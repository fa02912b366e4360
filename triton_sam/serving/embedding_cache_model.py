"""Triton python-backend (BLS) model that keeps image features on the server: ``<family>_session``.

The repository writer copies this file verbatim to ``<family>_session/1/model.py`` for both
targets, with the dependency-free ``triton_sam.serving`` modules beside it as the package
``triton_sam_serving`` (the protocol: tensor names, parameter keys, error codes, in
:mod:`triton_sam.serving.protocol.embedding_cache`; bounds, image intake, mask encodings). It
runs inside Triton's stub, so it imports only the standard library, numpy, PIL (to decode
image files), ``triton_python_backend_utils`` and that package; the encoder and decoder it
calls through BLS are the family's ``<family>_encoder`` / ``<family>_decoder`` models of the
same repository (onnxruntime backend in both the GPU container and the embedded server).

One request, three uses (every input is ``optional``):

- **embed**: an image, as ``image_bytes`` (the bytes of a JPEG/PNG/TIFF/BMP/WebP file, decoded
  here), ``image_rgb`` (uint8 [H, W, 3]; both preprocessed here exactly as the official
  predictor does, ``serving/intake.py``) or ``image`` (the preprocessed float32 encoder input).
  The server computes the image id itself, from what it received (decoded pixels, or the float
  tensor) plus the models and preprocessing, and answers it as ``image_id``: features are only
  ever kept under an id the server computed from their content. A client may send the
  ``image_id`` it expects with the image (a routing and lookup hint); it binds nothing, so no
  client can bind features to content the server did not hash (no cache poisoning: pixels
  sent under another image's id are kept under their own id).
  Runs the encoder unless the id is already cached, answers ``encoded`` = 1 (ran) or 0.
- **probe**: ``image_id`` alone. ``encoded`` = 0 when cached, else the miss error below.
- **predict**: ``image_id`` + the decoder's prompt tensors (``point_coords``,
  ``point_labels`` or the layout's others; optionally ``mask_input``/``has_mask_input``, or
  ``previous_key`` + ``previous_mask_index`` naming low-res logits this server kept from an
  earlier prediction). Calls the decoder with the
  cached features and returns the decoder outputs the request asked for. When the request
  asks for the output ``logits_key``, the returned low-res logits (clipped like the official
  predictor's) are kept under a key this server issues (128 random bits, answered in that
  output) for a later refinement, so a refinement click sends the key, not the 256 KiB mask.
  The key is bound to the image and the tenant; a client can never choose one.

Tenants (``protocol/tenancy.py``): every cache entry, embed in flight and kept logits is
keyed by (tenant, image id), so one tenant's requests never see another tenant's state.

A miss (unknown image id or logits key: never embedded, evicted, or the server restarted)
answers NOT_FOUND with the protocol code ``EmbeddingNotFound`` (the envelope of
:mod:`triton_sam.serving.protocol`); clients raise ``EmbeddingNotFoundError``, re-embed and
retry once.

Bounds (``serving/bounds.py``, config parameters ``max_points``, ``max_boxes``,
``max_image_pixels``, ``max_image_bytes``): every request is checked before any work is done,
and a request outside them answers INVALID_ARG naming the field; the server stays ready.

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

Embeds are admitted (``serving/click_queue.py``, parameters ``max_concurrent_embeds`` and
``max_waiting_embeds``): at most that many images are decoded, hashed, preprocessed (on as
many threads, off the event loop) and encoded at once, at most that many wait, and one more
is refused at once with ``Overloaded`` (the clients' ``ServerOverloadedError``); an embed
cancelled while it waited is answered unrun. Clicks have their own line, so a burst of
embeds bounds the server's memory and never queues a click behind it.

Memory is bounded by an LRU over images: at most ``max_images`` images and ``max_bytes`` bytes
(features + kept logits); the least recently used image goes first. On a GPU instance the
encoder outputs are requested in GPU memory and kept as the BLS output tensors themselves
(DLPack-capable, never copied to the host) and handed back to the decoder as they are. On a
CPU instance, config parameter ``cpu_features``: ``process`` (the default) copies them into
process memory once and back into the stub's shared-memory pool on every click (16 MiB per
SAM2 click, ~2.3 ms); ``shared_memory`` keeps the encoder's BLS output tensors too (they
already live in the pool, so the decoder's BLS request passes them by handle: no copy per
click), at the cost of holding the cache in /dev/shm (docs/cpu-performance.md). Gauges
``triton_sam_session_cached_images`` / ``_cached_bytes`` and the counters
``triton_sam_session_{hits,misses,evictions}`` are on Triton's metrics endpoint, and so is
where a click's time goes inside this model: counters
``triton_sam_session_stage_microseconds{stage=...}`` and ``_stage_count{stage=...}`` per
stage of ``protocol.embedding_cache.STAGES`` (requests that ran the decoder only), which
``triton-sam bench click`` reads beside Triton's own per-model statistics.

An embed or probe that asks for outputs named like the encoder's outputs (the features) or
``image_size`` gets the cached features and the original size of that image (the tenant's):
the everything model (``serving/everything_model.py``) reads them back to run its own
decoder on them, so segment-everything reuses what a client's ``set_image`` embedded.

Config ``parameters`` read here: ``protocol.embedding_cache.PARAM_KEYS`` (the renderer writes
the same keys from the same module).
"""

import asyncio
import concurrent.futures
import json
import os
import secrets
import sys
import threading
import time
from collections import OrderedDict

import numpy as np
import triton_python_backend_utils as pb_utils

# The dependency-free package shipped beside this file (see triton_sam/serving/__init__.py).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    from triton_sam_serving import bounds, cache, images, intake, masks, prompt_frame
    from triton_sam_serving import protocol as envelope
    from triton_sam_serving.click_queue import ClickQueue, QueueFull
    from triton_sam_serving.protocol import embedding_cache as protocol
    from triton_sam_serving.protocol import tenancy
except ImportError:  # imported from the triton_sam source tree (unit tests)
    from triton_sam.serving import bounds, cache, images, intake, masks, prompt_frame
    from triton_sam.serving import protocol as envelope
    from triton_sam.serving.click_queue import ClickQueue, QueueFull
    from triton_sam.serving.protocol import embedding_cache as protocol
    from triton_sam.serving.protocol import tenancy

IMAGE_ID = protocol.IMAGE_ID
ENCODED = protocol.ENCODED
LOGITS_KEY = protocol.LOGITS_KEY
PREVIOUS_KEY = protocol.PREVIOUS_KEY
PREVIOUS_MASK_INDEX = protocol.PREVIOUS_MASK_INDEX
MASK_INPUT = protocol.MASK_INPUT
HAS_MASK_INPUT = protocol.HAS_MASK_INPUT
IMAGE_RGB = protocol.IMAGE_RGB
IMAGE_BYTES = protocol.IMAGE_BYTES
POINTS, LABELS, BOX, MULTIMASK = protocol.POINTS, protocol.LABELS, protocol.BOX, protocol.MULTIMASK
MASKS_RLE, MASKS_PNG, MASKS_BITS = protocol.ENCODED_MASK_OUTPUTS
MASK_BOXES, MASK_SCORES, IMAGE_SIZE = protocol.MASK_BOXES, protocol.MASK_SCORES, protocol.IMAGE_SIZE


class EmbeddingMiss(Exception):
    """An image id (or logits key) this instance does not hold."""


class Scoped(tuple):
    """(tenant, image id): what the cache, the embeds in flight and kept logits are keyed by."""

    __slots__ = ()

    def __new__(cls, tenant, image_id):
        return super().__new__(cls, (tenant, image_id))

    tenant = property(lambda self: self[0])
    image_id = property(lambda self: self[1])


class _Entry:
    __slots__ = ("features", "feature_bytes", "logits", "hw")

    def __init__(self, features, feature_bytes, hw=None):
        self.features = features  # name -> pb_utils.Tensor (GPU) or np.ndarray (CPU)
        self.feature_bytes = feature_bytes
        self.hw = hw  # (H, W) of the original image; None when embedded as a float tensor
        self.logits = OrderedDict()  # issued key -> np.ndarray [1, M, S, S], LRU order

    @property
    def nbytes(self):
        return self.feature_bytes + sum(a.nbytes for a in self.logits.values())


class EmbeddingCache:
    """LRU of image features (+ a few kept low-res logits per image), bounded in count and bytes.

    Pure Python (no Triton): the python model drives it from one event loop, so no locks.
    Keyed by :class:`Scoped` (tenant, image id); the bounds are shared fairly between tenants
    (``serving/cache.py``). The most recently inserted image is never evicted by its own
    insertion, so one image larger than ``max_bytes`` is still served (alone).
    """

    def __init__(self, max_images, max_bytes=0, logits_per_image=4):
        if max_images < 1:
            raise ValueError(f"max_images: got {max_images}, expected >= 1")
        self.max_images = int(max_images)
        self.max_bytes = int(max_bytes)  # 0 = no byte bound
        self.logits_per_image = int(logits_per_image)
        self._lru = cache.LruCache(self.max_images, self.max_bytes)

    nbytes = property(lambda self: self._lru.nbytes)
    evictions = property(lambda self: self._lru.evictions)

    def __len__(self):
        return len(self._lru)

    def __contains__(self, scoped):
        return scoped in self._lru

    def ids(self):
        """Cached (tenant, image id) keys, least recently used first."""
        return self._lru.keys()

    def get(self, scoped):
        """The features of ``scoped`` (marked most recently used); EmbeddingMiss if absent."""
        return self._entry(scoped, touch=True).features

    def put(self, scoped, features, feature_bytes, hw=None):
        """Keep ``features`` under ``scoped``; returns the keys evicted to stay in bounds."""
        entry = _Entry(features, int(feature_bytes), hw)
        return self._lru.put(scoped, entry, entry.nbytes, owner=scoped.tenant)

    def keep_logits(self, scoped, logits):
        """Keep low-res logits of a prediction on ``scoped`` under a fresh random key.

        Returns:
            ``(key, evicted)``: the key issued ("" when nothing is kept: the image was
            evicted meanwhile, or ``logits_per_image`` is 0) and the keys evicted.
        """
        entry = self._lru.peek(scoped)
        if entry is None or self.logits_per_image < 1:
            return "", []
        key = secrets.token_hex(protocol.ISSUED_KEY_BYTES)
        entry.logits[key] = logits
        while len(entry.logits) > self.logits_per_image:
            entry.logits.popitem(last=False)
        return key, self._lru.put(scoped, entry, entry.nbytes, owner=scoped.tenant)

    def original_size(self, scoped):
        """(H, W) of the image embedded under ``scoped``, or None (float-tensor embed)."""
        return self._entry(scoped, touch=False).hw

    def get_logits(self, scoped, key):
        """Logits this cache issued ``key`` for on ``scoped``; EmbeddingMiss otherwise."""
        entry = self._lru.peek(scoped)
        logits = None if entry is None or not key else entry.logits.get(key)
        if logits is None:  # the key itself stays out of messages: it is a capability
            raise EmbeddingMiss(
                f"{PREVIOUS_KEY}: no low-res logits kept under this key for image_id "
                f"{scoped.image_id!r}"
            )
        entry.logits.move_to_end(key)
        return logits

    def _entry(self, scoped, *, touch):
        entry = self._lru.get(scoped) if touch else self._lru.peek(scoped)
        if entry is None:
            raise EmbeddingMiss(f"image_id {scoped.image_id!r} is not cached")
        return entry


class TritonPythonModel:
    """The ``<family>_session`` model: embed / probe / predict against a per-instance LRU."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.name = args["model_name"]
        self.encoder_model = params[protocol.PARAM_ENCODER_MODEL]
        self.decoder_model = params[protocol.PARAM_DECODER_MODEL]
        # Clicks at the decoder at once, and waiting for it (driven from the event loop).
        self.clicks = ClickQueue(
            int(params.get(protocol.PARAM_DECODER_SLOTS) or 0),
            int(
                params.get(protocol.PARAM_MAX_WAITING_CLICKS) or protocol.DEFAULT_MAX_WAITING_CLICKS
            ),
        )
        # Embeds decoded, preprocessed and encoded at once, and waiting (their own line: a
        # click never waits behind an embed); their decoding and preprocessing run on as many
        # threads, off the event loop that serves the clicks.
        self.embed_queue = ClickQueue(
            int(
                params.get(protocol.PARAM_MAX_CONCURRENT_EMBEDS)
                or protocol.DEFAULT_MAX_CONCURRENT_EMBEDS
            ),
            int(
                params.get(protocol.PARAM_MAX_WAITING_EMBEDS) or protocol.DEFAULT_MAX_WAITING_EMBEDS
            ),
            what="embeds wait for an encoder slot",
        )
        self.intake_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.embed_queue.slots or 4, thread_name_prefix="triton_sam_intake"
        )
        self.embedding_names = [n for n in params[protocol.PARAM_EMBEDDING_NAMES].split(",") if n]
        self.embedding_bytes = int(params.get(protocol.PARAM_EMBEDDING_BYTES) or 0)
        limit = params.get(protocol.PARAM_LOW_RES_LOGIT_LIMIT) or ""
        self.logit_limit = float(limit) if limit else None
        self.cache = EmbeddingCache(
            int(params.get(protocol.PARAM_MAX_IMAGES) or protocol.DEFAULT_MAX_IMAGES),
            int(params.get(protocol.PARAM_MAX_BYTES) or 0),
            int(params.get(protocol.PARAM_LOGITS_PER_IMAGE) or protocol.DEFAULT_LOGITS_PER_IMAGE),
        )
        inputs = {t["name"]: t for t in config["input"]}
        self.encoder_inputs = [n for n in params[protocol.PARAM_ENCODER_INPUTS].split(",") if n]
        self.prompt_inputs = [
            n
            for n in inputs
            if n
            not in (
                *protocol.CONTROL_INPUTS,
                *protocol.IMAGE_INPUTS,
                *protocol.PIXEL_INPUTS,
                *self.encoder_inputs,
            )
        ]
        pre_json = params.get(protocol.PARAM_PREPROCESSING) or ""
        self.pre = intake.preprocessing_from_json(pre_json) if pre_json else None
        identity = params.get(protocol.PARAM_ENCODER_IDENTITY) or self.encoder_model
        self.namespaces = {
            kind: intake.session_namespace(self.name, identity, pre_json, kind)
            for kind in ("rgb", *self.encoder_inputs)
        }
        self.max_points = int(params.get(protocol.PARAM_MAX_POINTS) or bounds.MAX_POINTS)
        self.max_boxes = int(params.get(protocol.PARAM_MAX_BOXES) or bounds.MAX_BOXES)
        self.max_pixels = int(
            params.get(protocol.PARAM_MAX_IMAGE_PIXELS) or bounds.MAX_IMAGE_PIXELS
        )
        self.max_image_bytes = int(
            params.get(protocol.PARAM_MAX_IMAGE_BYTES) or bounds.MAX_IMAGE_BYTES
        )
        self.box_before_points = params.get(protocol.PARAM_BOX_BEFORE_POINTS) == "true"
        self.pad_with_box = params.get(protocol.PARAM_PAD_WITH_BOX) == "true"
        mask = inputs.get(MASK_INPUT)
        self.mask_dims = [1] + [int(d) for d in mask["dims"]] if mask else None
        self.on_gpu = args.get("model_instance_kind") == "GPU"
        self.device_id = int(args.get("model_instance_device_id") or 0)
        # Configs written before the parameter existed copied the features (``process``).
        self.keep_shm = params.get(protocol.PARAM_CPU_FEATURES) == "shared_memory"
        self.metrics = _Metrics(args)
        self.embeds = {}  # Scoped -> task of the encoder run in flight for it
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="triton_sam_session", daemon=True
        )
        self.thread.start()

    def execute(self, requests):
        """Schedule every request on the instance's loop and return at once (see module doc).

        Returns None: each request is answered by its response sender.
        """
        now = time.perf_counter()
        for request in requests:
            asyncio.run_coroutine_threadsafe(self._respond(request, _Clock(now)), self.loop)
        return None

    def finalize(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.intake_pool.shutdown(wait=False, cancel_futures=True)
        self.cache = None
        self.metrics.close()

    async def _respond(self, request, clock):
        clock.mark("schedule")
        sender = request.get_response_sender()
        try:
            response = await self._answer(request, self.embeds, clock)
        except Exception as e:  # _answer catches its own; this only guards the send below
            response = envelope.error_response(
                pb_utils, envelope.ERR_INTERNAL, f"{type(e).__name__}: {e}"
            )
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        clock.mark("respond")
        self.metrics.publish(self.cache)
        if clock.decoded:  # a click: its stages are comparable with every other click's
            self.metrics.stages(clock)

    # -- one request -----------------------------------------------------------------------
    async def _answer(self, request, embeds, clock):
        try:
            if _cancelled(request):
                return envelope.error_response(
                    pb_utils, envelope.ERR_CANCELLED, "request cancelled before execution"
                )
            tenant = tenancy.request_tenant(request)  # a forged second value: refused
            _check_one_prompt_set(request)
            hint = _string(request, IMAGE_ID)
            if hint is not None:
                bounds.check_key(IMAGE_ID, hint)
            wanted = _requested(request)
            prompts = self._checked_prompts(request)  # refused before any work
            pixel = self._pixel_prompts(request, prompts)
            outputs = []
            if self._carries_image(request):
                # The features are kept under the id computed here, whatever id the client
                # sent with the image: a hint that differs (another client's id, or a client
                # whose decoder differs from ours) binds nothing; the answer names the real
                # id. Clients send their expected id with an embed so that a proxy in front
                # of several replicas routes the embed where the clicks will go.
                image_id, scoped, encoded = await self._admitted_embed(request, embeds, tenant)
            elif hint is None:
                raise bounds.RequestError(
                    IMAGE_ID,
                    f"missing: send an image ({IMAGE_BYTES}, {IMAGE_RGB} or "
                    f"{', '.join(self.encoder_inputs)}) or the {IMAGE_ID} the server answered",
                )
            else:
                image_id, scoped, encoded = hint, Scoped(tenant, hint), None
                if scoped in embeds:  # being embedded by another request
                    await embeds[scoped]
                    encoded = 0
            if pixel is not None:
                outputs = await self._predict_pixels(request, scoped, pixel, wanted, clock)
            elif prompts:
                outputs = await self._predict(request, scoped, wanted, clock)
            elif encoded is None:  # probe
                self._features(scoped)
                encoded = 0
            if pixel is None and not prompts:  # embed / probe: what it holds, when asked
                outputs += self._held_outputs(scoped, wanted)
            if ENCODED in wanted or not wanted:
                value = np.array([[encoded or 0]], dtype=np.int32)
                outputs.append(pb_utils.Tensor(ENCODED, value))
            if IMAGE_ID in wanted:
                value = np.array([[image_id.encode("utf-8")]], dtype=np.object_)
                outputs.append(pb_utils.Tensor(IMAGE_ID, value))
            return pb_utils.InferenceResponse(output_tensors=outputs)
        except bounds.RequestError as e:
            return envelope.error_response(pb_utils, envelope.ERR_INVALID_INPUT, str(e))
        except envelope.ProtocolError as e:
            return envelope.error_response(pb_utils, e.code, str(e))
        except QueueFull as e:
            if self._carries_image(request):
                self.metrics.count("refused_embeds")
            return envelope.error_response(pb_utils, envelope.ERR_OVERLOADED, str(e))
        except _EmbedCancelledWhileWaiting:
            self.metrics.count("cancelled_embeds")
            return envelope.error_response(
                pb_utils, envelope.ERR_CANCELLED, "request cancelled while waiting to be embedded"
            )
        except _CancelledWhileWaiting:
            self.metrics.count("cancelled_clicks")
            return envelope.error_response(
                pb_utils, envelope.ERR_CANCELLED, "request cancelled while waiting for the decoder"
            )
        except EmbeddingMiss as e:
            self.metrics.count("misses")
            return envelope.error_response(
                pb_utils,
                envelope.ERR_EMBEDDING_NOT_FOUND,
                f"{e} on this server (never embedded, evicted, or the server restarted); "
                "embed it again (send the image)",
            )
        except Exception as e:  # never let one request take the stub (and its cache) down
            return envelope.error_response(
                pb_utils, envelope.ERR_INTERNAL, f"{type(e).__name__}: {e}"
            )

    def _checked_prompts(self, request):
        """The prompt tensors of the request (name -> array), checked against the bounds."""
        prompts = {}
        for name in self.prompt_inputs:
            tensor = _input(request, name)
            if tensor is not None:
                prompts[name] = tensor.as_numpy()
        if prompts:
            bounds.check_prompts(prompts, max_points=self.max_points, max_boxes=self.max_boxes)
        if _input(request, LOGITS_KEY) is not None:
            raise bounds.RequestError(
                LOGITS_KEY,
                "sent as an input; the server issues the key: ask for the output "
                f"{LOGITS_KEY} and send the key it answers as {PREVIOUS_KEY} later",
            )
        value = _string(request, PREVIOUS_KEY)
        if value is not None:
            bounds.check_key(PREVIOUS_KEY, value)
            if MASK_INPUT in prompts:
                raise bounds.RequestError(
                    PREVIOUS_KEY, f"sent with {MASK_INPUT}; send one of them (one mask)"
                )
        return prompts

    def _pixel_prompts(self, request, prompts):
        """(points, labels, box, multimask) in original pixels, checked, or None if absent."""
        given = {n: _input(request, n) for n in protocol.PIXEL_INPUTS}
        given = {n: t.as_numpy() for n, t in given.items() if t is not None}
        if not given:
            return None
        if prompts:
            raise bounds.RequestError(
                POINTS, f"got both pixel prompts and {sorted(prompts)}; send one kind"
            )
        points = given.get(POINTS)
        labels = given.get(LABELS)
        box = given.get(BOX)
        if (points is None) != (labels is None):
            raise bounds.RequestError(LABELS, "points and labels must be given together")
        if points is None and box is None:
            raise bounds.RequestError(POINTS, "no prompt: send points with labels, a box, or both")
        clicks = None
        if points is not None:
            points = points.reshape(-1, 2) if points.size % 2 == 0 else points
            if points.ndim != 2 or points.shape[0] > self.max_points:
                raise bounds.RequestError(
                    POINTS,
                    f"got shape {list(points.shape)}, expected [N, 2] (X, Y) pixels with "
                    f"N <= {self.max_points}",
                )
            labels = labels.reshape(-1)
            if labels.shape[0] != points.shape[0] or not np.isin(labels, (0, 1)).all():
                raise bounds.RequestError(
                    LABELS, f"got {labels[:8].tolist()}, expected one 0/1 label per point"
                )
            if not np.isfinite(points).all():
                raise bounds.RequestError(POINTS, "got NaN or infinity, expected finite pixels")
            clicks = (points.astype(np.float64), labels.astype(np.float32))
        if box is not None:
            box = box.reshape(-1)
            if box.shape != (4,) or not np.isfinite(box).all():
                raise bounds.RequestError(BOX, "expected 4 finite values (x0, y0, x1, y1) pixels")
        multimask = given.get(MULTIMASK)
        return clicks, box, bool(multimask is not None and multimask.reshape(-1)[0])

    async def _predict_pixels(self, request, scoped, pixel, wanted, clock):
        """Prompts in original pixels -> the decoder -> masks at the original size, encoded."""
        clicks, box, multimask = pixel
        hw = self.cache.original_size(scoped)
        if hw is None or self.pre is None:
            raise bounds.RequestError(
                POINTS,
                "this image was embedded as a preprocessed tensor, whose original size the "
                f"server does not know; embed it as {IMAGE_BYTES} or {IMAGE_RGB}",
            )
        if clicks is not None:
            frame = prompt_frame.to_input_frame(clicks[0], hw, self.pre)
            bounds.check_pixel_coords(POINTS, clicks[0], frame)
        if box is not None:
            frame = prompt_frame.to_input_frame(box.reshape(2, 2), hw, self.pre)
            bounds.check_pixel_coords(BOX, box, frame)
        coords, labels = prompt_frame.point_list(
            clicks,
            box,
            hw,
            self.pre,
            box_before_points=self.box_before_points,
            pad_with_box=self.pad_with_box,
        )
        given = {"point_coords": coords, "point_labels": labels}
        bounds.check_prompts(given, max_points=self.max_points, max_boxes=self.max_boxes)
        low_name, score_name = (
            ("multimask_masks", "multimask_iou_predictions")
            if multimask
            else ("masks", "iou_predictions")
        )
        names = [low_name, score_name]
        extra = [n for n in wanted if n in protocol.MASK_OUTPUTS and n != low_name]
        if LOGITS_KEY in wanted:
            extra.append(LOGITS_KEY)
        outputs = await self._predict(request, scoped, names + extra, clock, given=given)
        by_name = {t.name(): t for t in outputs}
        low = np.asarray(by_name[low_name].as_numpy(), np.float32)
        scores = np.asarray(by_name[score_name].as_numpy(), np.float32).reshape(-1)
        result = [
            t for n, t in by_name.items() if n in wanted and n not in protocol.FINISHED_OUTPUTS
        ]
        finished = self._finished_masks(low, scores, hw, wanted)
        clock.mark("finish")
        return result + [pb_utils.Tensor(n, v) for n, v in finished.items()]

    def _finished_masks(self, low, scores, hw, wanted):
        """The original-size masks of [1, M, s, s] logits, in the encodings asked for."""
        wanted = set(wanted) or {MASKS_RLE, MASK_BOXES, MASK_SCORES, IMAGE_SIZE}
        encoders = {
            MASKS_RLE: masks.encode_rle,
            MASKS_PNG: masks.encode_png,
            MASKS_BITS: prompt_frame.pack_bits,
        }
        encoded = {n: [] for n in encoders if n in wanted}
        boxes = []
        for i in range(low.shape[1]):  # one mask at a time: H x W float32 each
            mask = prompt_frame.upsample(low[:, i : i + 1], hw, self.pre)[0, 0] > 0
            boxes.append(prompt_frame.mask_box(mask))
            for name in encoded:
                encoded[name].append(encoders[name](mask))
        out = {n: np.array([v], dtype=np.object_) for n, v in encoded.items()}
        out[MASK_BOXES] = np.stack(boxes)[None]
        out[MASK_SCORES] = scores[None]
        out[IMAGE_SIZE] = np.array([hw], np.int32)
        return {n: v for n, v in out.items() if n in wanted}

    def _carries_image(self, request):
        """Whether the request sends an image (file bytes, pixels or every encoder input)."""
        if _input(request, IMAGE_BYTES) is not None or _input(request, IMAGE_RGB) is not None:
            return True
        return bool(self.encoder_inputs) and all(
            _input(request, n) is not None for n in self.encoder_inputs
        )

    async def _admitted_embed(self, request, embeds, tenant):
        """(image id, its tenant-scoped key, encoded) of the image ``request`` carries,
        decoded, hashed, preprocessed and encoded under one of ``max_concurrent_embeds`` slots
        (QueueFull: refused at once).

        An embed that waited and was cancelled meanwhile is answered unrun. An image another
        request is already encoding shares that run and gives its own slot back at once.
        """
        waited = await self.embed_queue.acquire()
        self.metrics.embeds(self.embed_queue)
        held = True
        try:
            if waited and _cancelled(request):
                raise _EmbedCancelledWhileWaiting
            loop = asyncio.get_running_loop()
            image_id, kind, value = await loop.run_in_executor(
                self.intake_pool, self._received_image, request
            )
            scoped = Scoped(tenant, image_id)
            task = embeds.get(scoped)
            if task is None:
                task = embeds[scoped] = asyncio.ensure_future(self._embed(scoped, kind, value))
                task.add_done_callback(lambda _, i=scoped: embeds.pop(i, None))
            else:  # the run in flight holds its own slot
                held = False
                self.embed_queue.release()
            del value  # the run holds what it needs; a shared run needs none of it
            return image_id, scoped, await task  # a second embed of this image shares the run
        finally:
            if held:
                self.embed_queue.release()
            self.metrics.embeds(self.embed_queue)

    def _received_image(self, request):
        """(image id, kind, pixels or encoder feeds) of the image a request carries, or None.

        The id is computed here from what was received: the decoded uint8 pixels (raw or
        from file bytes: the same picture gets the same id either way) or, for the
        preprocessed float input, that tensor.
        """
        data = _input(request, IMAGE_BYTES)
        if data is not None:
            if self.pre is None:
                raise bounds.RequestError(IMAGE_BYTES, "this server's config has no preprocessing")
            blob = data.as_numpy().reshape(-1)
            if blob.size != 1:
                raise bounds.RequestError(
                    IMAGE_BYTES, f"got {blob.size} elements, expected 1 (one encoded file)"
                )
            blob = bytes(blob[0])
            if len(blob) > self.max_image_bytes:
                raise bounds.RequestError(
                    IMAGE_BYTES,
                    f"got {len(blob)} bytes, expected at most {self.max_image_bytes}",
                )
            rgb = intake.decode_image(blob, max_pixels=self.max_pixels, field=IMAGE_BYTES)
            return images.image_id(rgb, self.namespaces["rgb"]), "rgb", rgb
        raw = _input(request, IMAGE_RGB)
        if raw is not None:
            if self.pre is None:
                raise bounds.RequestError(IMAGE_RGB, "this server's config has no preprocessing")
            rgb = intake.check_rgb(raw.as_numpy(), max_pixels=self.max_pixels, field=IMAGE_RGB)
            return images.image_id(rgb, self.namespaces["rgb"]), "rgb", rgb
        feeds = [_input(request, n) for n in self.encoder_inputs]
        if not feeds or any(t is None for t in feeds):
            return None
        digest = []
        for name, tensor in zip(self.encoder_inputs, feeds, strict=True):
            array = tensor.as_numpy()
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise bounds.RequestError(name, "got NaN or infinity, expected finite values")
            digest.append(images.image_id(array, self.namespaces[name]))
        image_id = (
            digest[0]
            if len(digest) == 1
            else images.image_id(
                np.frombuffer("".join(digest).encode(), np.uint8), self.namespaces["rgb"]
            )
        )
        return image_id, "tensor", feeds

    async def _embed(self, scoped, kind, value):
        if scoped in self.cache:
            self.cache.get(scoped)  # refresh its LRU position
            return 0
        if kind == "rgb":  # off the event loop: other requests' BLS calls go on meanwhile
            tensor = await asyncio.get_running_loop().run_in_executor(
                self.intake_pool, intake.preprocess, value, self.pre
            )
            feeds = [pb_utils.Tensor(self.encoder_inputs[0], tensor)]
        else:
            feeds = value
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
            # CPU, shared_memory: keep it too (it lives in the stub's shm pool; the decoder's
            # BLS request then passes its handle, the python backend copies nothing).
            # CPU, process: copy it out of the pool (and into it again on every click).
            keep = not tensor.is_cpu() or self.keep_shm
            features[name] = tensor if keep else np.array(tensor.as_numpy())
        nbytes = self.embedding_bytes or sum(
            v.nbytes if isinstance(v, np.ndarray) else v.as_numpy().nbytes
            for v in features.values()
            if isinstance(v, np.ndarray) or v.is_cpu()
        )
        hw = (int(value.shape[0]), int(value.shape[1])) if kind == "rgb" else None
        evicted = self.cache.put(scoped, features, nbytes, hw)
        self.metrics.count("evictions", len(evicted))
        return 1

    def _held_outputs(self, scoped, wanted):
        """The cached features (outputs named like the encoder's) and the original
        ``image_size`` of ``scoped``, those of them ``wanted`` names: what the everything
        model reads back to decode its own prompt batches (serving/everything_model.py)."""
        names = [n for n in self.embedding_names if n in wanted]
        outputs = []
        if names:
            features = self._features(scoped)
            for name in names:
                value = features[name]
                if not isinstance(value, np.ndarray) and value.is_cpu():
                    # the shm store: a view, so the response never owns the cached tensor
                    value = value.as_numpy()
                # numpy is copied into the response; a GPU tensor is answered in device
                # memory as it is (no host round trip)
                outputs.append(
                    pb_utils.Tensor(name, value) if isinstance(value, np.ndarray) else value
                )
        if IMAGE_SIZE in wanted:
            hw = self.cache.original_size(scoped)
            if hw is None:
                raise bounds.RequestError(
                    IMAGE_ID,
                    "embedded as a preprocessed tensor, whose original size the server does "
                    f"not know; embed it as {IMAGE_BYTES} or {IMAGE_RGB}",
                )
            outputs.append(pb_utils.Tensor(IMAGE_SIZE, np.array([hw], np.int32)))
        return outputs

    def _features(self, scoped):
        features = self.cache.get(scoped)  # EmbeddingMiss when absent
        self.metrics.count("hits")
        return features

    async def _predict(self, request, scoped, wanted, clock, given=None):
        """Run the decoder on the cached features and the request's prompt tensors (or
        ``given``: name -> array built here); returns the output tensors asked for."""
        clock.mark("intake")
        features = self._features(scoped)
        feeds = [
            value if not isinstance(value, np.ndarray) else pb_utils.Tensor(name, value)
            for name, value in features.items()
        ]
        names_given = set()
        for name in self.prompt_inputs:
            if given is not None:
                tensor = pb_utils.Tensor(name, given[name]) if name in given else None
            else:
                tensor = _input(request, name)
            if tensor is not None:
                feeds.append(tensor)
                names_given.add(name)
        if self.mask_dims is not None and MASK_INPUT not in names_given:
            feeds += self._mask_feeds(request, scoped)
        elif MASK_INPUT in names_given and HAS_MASK_INPUT not in names_given:
            feeds.append(pb_utils.Tensor(HAS_MASK_INPUT, np.ones((1, 1), np.float32)))
        skip = (ENCODED, IMAGE_ID, LOGITS_KEY, *protocol.FINISHED_OUTPUTS)
        names = [n for n in wanted if n not in skip] or list(protocol.DEFAULT_OUTPUTS)
        decoder = self.decoder_model
        waited = await self.clicks.acquire()  # QueueFull: refused at once
        self.metrics.in_flight(self.clicks)
        try:  # the slot goes back whatever happens (a lost one would stall every click)
            if waited and _cancelled(request):  # a stale click: answered unrun
                raise _CancelledWhileWaiting
            bls = pb_utils.InferenceRequest(
                model_name=decoder,
                inputs=feeds,
                requested_output_names=names,
                **self._preferred_memory(gpu=False),  # small; kept logits are clipped on CPU
            )
            clock.mark("feeds")
            response = await bls.async_exec()
        finally:
            self.clicks.release()
            self.metrics.in_flight(self.clicks)
        clock.mark("bls")
        clock.decoded = True
        if response.has_error():
            raise RuntimeError(f"{decoder}: {response.error().message()}")
        outputs = [pb_utils.get_output_tensor_by_name(response, n) for n in names]
        if LOGITS_KEY in wanted:
            outputs.append(self._keep_logits(scoped, outputs))
        clock.mark("outputs")
        return [t for t in outputs if t is not None]

    def _keep_logits(self, scoped, outputs):
        """Keep the answer's low-res logits under a key issued here; the ``logits_key``
        output tensor holding it (see protocol/embedding_cache.py)."""
        by_name = {t.name(): t for t in outputs if t is not None}
        low = next((by_name[n] for n in protocol.MASK_OUTPUTS if n in by_name), None)
        if low is None:
            raise bounds.RequestError(
                LOGITS_KEY,
                f"asked for without any of {list(protocol.MASK_OUTPUTS)}: the key names the "
                "low-res logits of the answer, ask for them too",
            )
        key = ""
        if low.is_cpu():
            logits = np.array(low.as_numpy(), dtype=np.float32)
            if self.logit_limit is not None:
                np.clip(logits, -self.logit_limit, self.logit_limit, out=logits)
            key, evicted = self.cache.keep_logits(scoped, logits)
            self.metrics.count("evictions", len(evicted))
        return pb_utils.Tensor(LOGITS_KEY, np.array([[key.encode()]], dtype=np.object_))

    def _mask_feeds(self, request, scoped):
        """mask_input from kept logits (previous_key + previous_mask_index), else zeros."""
        key = _string(request, PREVIOUS_KEY)
        if key is not None:  # given, even empty: only a key this server issued is found
            index_tensor = _input(request, PREVIOUS_MASK_INDEX)
            index = 0 if index_tensor is None else int(index_tensor.as_numpy().reshape(-1)[0])
            logits = self.cache.get_logits(scoped, key)
            if not 0 <= index < logits.shape[1]:
                raise bounds.RequestError(
                    PREVIOUS_MASK_INDEX, f"got {index}, expected 0..{logits.shape[1] - 1}"
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
            ("cancelled_clicks", "COUNTER", "Clicks cancelled while waiting for the decoder"),
            ("decodes_in_flight", "GAUGE", "Clicks at the decoder (sent, not come back)"),
            ("embeds_in_flight", "GAUGE", "Embeds being decoded, preprocessed or encoded"),
            ("embeds_waiting", "GAUGE", "Embeds waiting for an encoder slot"),
            ("refused_embeds", "COUNTER", "Embeds refused at once: the waiting line was full"),
            ("cancelled_embeds", "COUNTER", "Embeds cancelled while waiting for a slot"),
        )
        try:
            for name, kind, description in specs:
                family = pb_utils.MetricFamily(
                    name=protocol.METRIC_PREFIX + name,
                    description=description,
                    kind=getattr(pb_utils.MetricFamily, kind),
                )
                self._families.append(family)
                self._metrics[name] = family.Metric(labels=labels)
            self._add_stage_metrics(labels)
        except Exception:  # metrics disabled (--allow-metrics=false): record nothing
            self._families, self._metrics = [], {}

    def _add_stage_metrics(self, labels):
        specs = (
            (protocol.STAGE_MICROSECONDS, "Microseconds spent in each stage of clicks"),
            (protocol.STAGE_COUNT, "Clicks that went through each stage"),
        )
        for name, description in specs:
            family = pb_utils.MetricFamily(
                name=name, description=description, kind=pb_utils.MetricFamily.COUNTER
            )
            self._families.append(family)
            for stage in protocol.STAGES:
                metric = family.Metric(labels={**labels, "stage": stage})
                self._metrics[(name, stage)] = metric

    def stages(self, clock):
        """Add one click's stage durations (``clock.spent``, seconds) to the stage counters."""
        for stage, seconds in clock.totals().items():
            us = self._metrics.get((protocol.STAGE_MICROSECONDS, stage))
            if us is not None:
                us.increment(seconds * 1e6)
                self._metrics[(protocol.STAGE_COUNT, stage)].increment(1)

    def count(self, name, value=1):
        metric = self._metrics.get(name)
        if metric is not None and value:
            metric.increment(value)

    def in_flight(self, clicks):
        metric = self._metrics.get("decodes_in_flight")
        if metric is not None:
            metric.set(clicks.at_decoder)

    def embeds(self, queue):
        if "embeds_in_flight" in self._metrics:
            self._metrics["embeds_in_flight"].set(queue.at_decoder)
            self._metrics["embeds_waiting"].set(queue.waiting)

    def publish(self, cache):
        if "cached_images" in self._metrics:
            self._metrics["cached_images"].set(len(cache))
            self._metrics["cached_bytes"].set(cache.nbytes)

    def close(self):
        # python-backend rule: metrics go before their families
        self._metrics.clear()
        self._families.clear()


class _Clock:
    """Stage durations of one request: ``mark(stage)`` adds the time since the last mark."""

    __slots__ = ("start", "last", "spent", "decoded")

    def __init__(self, start):
        self.start = self.last = start  # time.perf_counter() when execute() received it
        self.spent = {}
        self.decoded = False  # set once the decoder ran: only clicks publish their stages

    def mark(self, stage):
        now = time.perf_counter()
        self.spent[stage] = self.spent.get(stage, 0.0) + now - self.last
        self.last = now

    def totals(self):
        return {**self.spent, "total": self.last - self.start}


class _CancelledWhileWaiting(Exception):
    """The click's request was cancelled while it waited for a decoder slot."""


class _EmbedCancelledWhileWaiting(Exception):
    """The embed's request was cancelled while it waited for an encoder slot."""


def _cancelled(request):
    # is_cancelled() arrived in Triton 23.10's stub; older stubs cannot tell.
    return hasattr(request, "is_cancelled") and request.is_cancelled()


def _input(request, name):
    return pb_utils.get_input_tensor_by_name(request, name)


def _check_one_prompt_set(request):
    """Refuse a request whose inputs carry more than one prompt set (batch dim > 1): the
    model would merge them or keep the first. The image id is named first when it is one."""
    tensors = sorted(request.inputs(), key=lambda t: (t.name() != IMAGE_ID, t.name()))
    for tensor in tensors:
        shape = tensor.shape() if hasattr(tensor, "shape") else tensor.as_numpy().shape
        bounds.check_batch(tensor.name(), tuple(shape))


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
