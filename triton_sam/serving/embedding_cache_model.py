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
(features + kept logits); the least recently used image goes first. The everything model's
crops (request parameter ``cache_area`` = ``crops``) live in an area of their own of at most
``protocol.CROP_AREA_IMAGES`` images, so they never evict a user's images
(``serving/embedding_cache/store.py``). On a GPU instance the
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

Config ``parameters``: the fields of ``serving/embedding_cache/settings.py``'s
``SessionSettings``, written by the renderer and read here by one generic function. The parts
(request checks, embeds, predictions, answers, metrics) are the modules of
``serving/embedding_cache/``; this class only wires them to Triton.
"""

import asyncio
import json
import os
import sys
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

# The dependency-free package shipped beside this file (see triton_sam/serving/__init__.py).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    from triton_sam_serving import bounds, intake
    from triton_sam_serving import protocol as envelope
    from triton_sam_serving.embedding_cache import answers, embedder, predictor, store
    from triton_sam_serving.embedding_cache.metrics import Clock, Metrics
    from triton_sam_serving.embedding_cache.requests import Inputs
    from triton_sam_serving.embedding_cache.settings import SessionSettings
    from triton_sam_serving.protocol import embedding_cache as protocol
    from triton_sam_serving.protocol.parameters import from_parameters
except ImportError:  # imported from the triton_sam source tree (unit tests)
    from triton_sam.serving import bounds, intake
    from triton_sam.serving import protocol as envelope
    from triton_sam.serving.embedding_cache import answers, embedder, predictor, store
    from triton_sam.serving.embedding_cache.metrics import Clock, Metrics
    from triton_sam.serving.embedding_cache.requests import Inputs
    from triton_sam.serving.embedding_cache.settings import SessionSettings
    from triton_sam.serving.protocol import embedding_cache as protocol
    from triton_sam.serving.protocol.parameters import from_parameters

IMAGE_ID, ENCODED = protocol.IMAGE_ID, protocol.ENCODED
# Inputs that are neither the decoder's prompts nor the image.
NOT_PROMPTS = (*protocol.CONTROL_INPUTS, *protocol.IMAGE_INPUTS, *protocol.PIXEL_INPUTS)


class TritonPythonModel:
    """The ``<family>_session`` model: embed / probe / predict against a per-instance LRU."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        settings = from_parameters(SessionSettings, envelope.config_parameters(config))
        self.settings = settings
        self.cache = store.EmbeddingCache(
            settings.max_images, settings.max_bytes, settings.logits_per_image
        )
        self.metrics = Metrics(pb_utils, args)
        pre = (
            intake.preprocessing_from_json(settings.preprocessing)
            if settings.preprocessing
            else None
        )
        inputs = {t["name"]: t for t in config["input"]}
        namespaces = {
            kind: intake.session_namespace(
                args["model_name"], settings.identity, settings.preprocessing, kind
            )
            for kind in ("rgb", *settings.encoder_inputs)
        }
        self.embedder = embedder.Embedder(
            pb_utils,
            settings,
            self.cache,
            self.metrics,
            pre=pre,
            namespaces=namespaces,
            on_gpu=args.get("model_instance_kind") == "GPU",
            device_id=int(args.get("model_instance_device_id") or 0),
        )
        mask = inputs.get(protocol.MASK_INPUT)
        self.predictor = predictor.Predictor(
            pb_utils,
            settings,
            self.cache,
            self.metrics,
            pre=pre,
            prompt_inputs=[n for n in inputs if n not in (*NOT_PROMPTS, *settings.encoder_inputs)],
            mask_dims=[1] + [int(d) for d in mask["dims"]] if mask else None,
        )
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
            asyncio.run_coroutine_threadsafe(self._respond(request, Clock(now)), self.loop)
        return None

    def finalize(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.embedder.close()
        self.cache = None
        self.metrics.close()

    async def _respond(self, request, clock):
        clock.mark("schedule")
        sender = request.get_response_sender()
        inputs = Inputs(pb_utils, request)
        try:
            response = await self._answer(inputs, clock)
        except Exception as e:  # never let one request take the stub (and its cache) down
            embed = _safe(inputs.carries_image, self.settings.encoder_inputs)
            response = answers.error_answer(pb_utils, e, self.metrics, embed=embed)
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        clock.mark("respond")
        self.metrics.publish(self.cache)
        if clock.decoded:  # a click: its stages are comparable with every other click's
            self.metrics.stages(clock)

    async def _answer(self, inputs, clock):
        """The response to one request: embed, probe or predict (see the module doc)."""
        if inputs.cancelled():
            raise envelope.ProtocolError(
                envelope.ERR_CANCELLED, "request cancelled before execution"
            )
        tenant = inputs.tenant()  # a forged second value: refused
        inputs.check_one_prompt_set()
        hint = inputs.image_id_hint()
        wanted = inputs.requested()
        prompts = inputs.prompts(self.predictor.prompt_inputs, self.settings)  # before any work
        pixel = inputs.pixel_prompts(prompts, self.settings.max_points)
        entry = None
        if inputs.carries_image(self.settings.encoder_inputs):
            # The features are kept under the id computed here, whatever id the client
            # sent with the image: a hint that differs (another client's id, or a client
            # whose decoder differs from ours) binds nothing; the answer names the real
            # id. Clients send their expected id with an embed so that a proxy in front
            # of several replicas routes the embed where the clicks will go.
            crop = inputs.cache_area() == protocol.CROPS_AREA
            image_id, scoped, encoded, entry = await self.embedder.admitted(
                inputs, tenant, crop=crop
            )
        elif hint is None:
            raise bounds.RequestError(IMAGE_ID, self._no_image())
        else:
            image_id, scoped = hint, store.Scoped(tenant, hint)
            encoded = 0 if await self.embedder.wait(scoped) else None
            await self.embedder.restore(scoped)  # evicted to the feature store: read back
        outputs = []
        if pixel is not None:
            outputs = await self.predictor.predict_pixels(inputs, scoped, pixel, wanted, clock)
        elif prompts:
            outputs = await self.predictor.predict(inputs, scoped, wanted, clock)
        else:  # embed / probe: what it holds, when asked
            if entry is None:  # a probe (EmbeddingMiss when absent)
                entry = self.cache.entry(scoped)
                self.metrics.count("hits")
            outputs = self.predictor.held_outputs(entry, wanted)
        if ENCODED in wanted or not wanted:
            value = np.array([[encoded or 0]], dtype=np.int32)
            outputs.append(pb_utils.Tensor(ENCODED, value))
        if IMAGE_ID in wanted:
            value = np.array([[image_id.encode("utf-8")]], dtype=np.object_)
            outputs.append(pb_utils.Tensor(IMAGE_ID, value))
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def _no_image(self):
        names = ", ".join(self.settings.encoder_inputs)
        return (
            f"missing: send an image ({protocol.IMAGE_BYTES}, {protocol.IMAGE_RGB} "
            f"or {names}) or the {IMAGE_ID} the server answered"
        )


def _safe(check, *args):
    try:
        return check(*args)
    except Exception:
        return False
