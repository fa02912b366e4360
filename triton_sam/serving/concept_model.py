"""The ``sam3_concept`` serving model: an image, text phrases and exemplar boxes in, instances
out (python/BLS).

The repository writer copies this file to ``sam3_concept/1/model.py`` and ships beside it
``triton_sam_serving/`` (the dependency-free modules of :mod:`triton_sam.serving`) and the
checkpoint's ``tokenizer.json``. It runs inside Triton's stub: numpy, ``tokenizers`` and
``triton_python_backend_utils``, nothing of triton_sam. The tensor contract, limits and error
codes are those of ``protocol/concept.py`` and the envelope of ``protocol/__init__.py``.

One request (one image, N phrases):

1. image: the server decodes nothing (pixels arrive as uint8 RGB), computes the content id,
   and runs ``<family>_vision`` through BLS unless its LRU holds that id; or, with only
   ``image_id``, looks the features up (NOT_FOUND when it does not hold them).
2. text: each phrase is tokenised here (Sam3Processor's tokenizer, padded to 32, refused
   beyond 32), and ``<family>_text`` runs once for the phrases whose tokens are not cached.
3. exemplars: the request's boxes (pixels, checked against its image) run
   ``<family>_exemplar`` on the image's 72x72 level; their tokens are kept under a new
   ``exemplar_id`` (``concept_exemplars.ExemplarStore``, per tenant), and the tokens of the
   ``exemplar_ids`` it names are looked up there. All of them follow each phrase's text tokens
   in its prompt; exemplars without a phrase prompt with Sam3Processor's ``"visual"``.
4. decoder: ``<family>_decoder`` runs on the image's features (batch 1) and the prompts (a
   per-item dim, ``phrases_per_decode`` at a time, concurrently), thresholding and keeping the
   top ``max_instances`` inside the graph, so only the kept low-res masks cross BLS.
5. post-processing (Sam3Processor's): boxes to original pixels; masks only in the encodings
   the request asked for (COCO RLE, PNG, or the low-res logits).

Tenants (``protocol/tenancy.py``): the image and phrase caches are keyed by (tenant, id) and
shared fairly between tenants (``serving/cache.py``), so another tenant's image id is a miss
and nothing tells whether another tenant sent an image or a phrase.

Bad input answers INVALID_ARG naming the field; nothing a request sends can take the stub
down (every error is caught per request). One instance (the caches live in it); ``execute``
is a coroutine so requests of one batch overlap their BLS calls, and two requests of a batch
with the same new image run the vision graph once.
"""

import asyncio
import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the package shipped beside
from triton_sam_serving import cache, concept_exemplars, concept_request, images, masks, model_io
from triton_sam_serving import protocol as envelope
from triton_sam_serving.bounds import RequestError
from triton_sam_serving.concept_request import Tokenizer
from triton_sam_serving.protocol import concept as protocol
from triton_sam_serving.protocol import settings, tenancy
from triton_sam_serving.session_call import checked, preferred_memory

TEXT_FEATURES = "text_features"
ATTENTION_MASK = "attention_mask"
# The decoder's prompt: a phrase's text tokens, then its exemplar tokens if it has any.
PROMPT_FEATURES = "prompt_features"
PROMPT_MASK = "prompt_mask"
EXEMPLAR_BOXES = "exemplar_boxes"
EXEMPLAR_LABELS = "exemplar_labels"
EXEMPLAR_FEATURES = "exemplar_features"
DECODER_OUTPUTS = ("scores", "boxes", "query_index", "num_instances", "presence")


class ImageMiss(envelope.ProtocolError):
    """An ``image_id`` this instance does not hold."""

    def __init__(self, message):
        super().__init__(envelope.ERR_EMBEDDING_NOT_FOUND, message)


class TritonPythonModel:
    """The ``sam3_concept`` model: tokenise, cache, tile, decode, post-process."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.settings = settings.from_model_config(protocol.ConceptSettings, config)
        self.name = args["model_name"]
        outputs = {t["name"]: t for t in config["output"]}
        self.mask_size = int(outputs[protocol.MASKS_LOGITS]["dims"][-1])
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = Tokenizer(
            os.path.join(version_dir, protocol.TOKENIZER_FILE),
            self.settings.pad_token_id,
            protocol.CONTEXT_LENGTH,
        )
        self.images = cache.LruCache(self.settings.max_images, self.settings.max_bytes)
        self.phrases = cache.LruCache(self.settings.max_phrases_cached)
        self.exemplars = concept_exemplars.ExemplarStore(self.settings.max_exemplars)
        self.on_gpu = args.get("model_instance_kind") == "GPU"
        self.device_id = int(args.get("model_instance_device_id") or 0)

    async def execute(self, requests):
        """Answer every request of the batch; their BLS calls overlap."""
        runs = {}  # (tenant, image id) -> vision task: one run per new image in this batch
        return list(await asyncio.gather(*(self._answer(r, runs) for r in requests)))

    def finalize(self):
        self.images = self.phrases = self.exemplars = None

    # -- one request ---------------------------------------------------------------------
    async def _answer(self, request, runs):
        try:
            if model_io.cancelled(request):
                return envelope.error_response(
                    pb_utils, envelope.ERR_CANCELLED, "request cancelled before execution"
                )
            tenant = tenancy.request_tenant(request)  # a forged second value: refused
            wanted = set(model_io.requested_outputs(request)) or set(protocol.OUTPUTS) - {
                protocol.MASKS_PNG,
                protocol.MASKS_LOGITS,
            }
            phrases = concept_request.phrases(
                pb_utils, request, self.settings.max_phrases
            )  # []: embed or probe only, or exemplars alone
            threshold = concept_request.scalar(
                pb_utils, request, protocol.THRESHOLD, protocol.DEFAULT_THRESHOLD, 0, 1
            )
            mask_threshold = concept_request.scalar(
                pb_utils, request, protocol.MASK_THRESHOLD, protocol.DEFAULT_MASK_THRESHOLD, 0, 1
            )
            limit = int(
                concept_request.scalar(
                    pb_utils,
                    request,
                    protocol.MAX_INSTANCES,
                    self.settings.num_queries,
                    1,
                    self.settings.num_queries,
                )
            )
            tokens = self.tokenizer.encode(phrases)  # refuses > 32 tokens before any graph runs
            ids = concept_exemplars.exemplar_ids(pb_utils, request, protocol.MAX_EXEMPLAR_IDS)
            kept = self.exemplars.tokens(tenant, ids)  # NOT_FOUND before any graph runs
            image_id, encoded, (features, hw) = await self._image(request, runs, tenant)
            exemplar_id, exemplars = await self._exemplars(request, features, hw, tenant, kept)
            if exemplars is not None and not phrases:
                phrases = [protocol.EXEMPLAR_ONLY_PHRASE]
                tokens = self.tokenizer.encode(phrases)
            decoded = []
            if phrases:
                token_ids, token_mask = tokens
                text = await self._text(token_ids, token_mask, tenant)
                prompts, prompt_mask = concept_exemplars.with_exemplars(text, token_mask, exemplars)
                decoded = await self._decode(
                    features, prompts, prompt_mask, threshold, limit, wanted
                )
            outputs = self._outputs(decoded, hw, mask_threshold, wanted)
            outputs[protocol.EXEMPLAR_ID] = np.array([[exemplar_id.encode()]], dtype=np.object_)
            outputs[protocol.IMAGE_ID] = np.array([[image_id.encode()]], dtype=np.object_)
            outputs[protocol.IMAGE_SIZE] = np.array([hw], np.int32)
            outputs[protocol.ENCODED] = np.array([[encoded]], np.int32)
            tensors = [pb_utils.Tensor(n, v) for n, v in outputs.items() if n in wanted]
            return pb_utils.InferenceResponse(output_tensors=tensors)
        except Exception as e:  # never let one request take the stub (and its caches) down
            return model_io.error_answer(pb_utils, e)

    async def _image(self, request, runs, tenant):
        """(image id, 1 if the vision graph ran for it else 0, (features, (H, W))), in
        ``tenant``'s namespace.

        The entry is returned, not looked up again later: another request of the batch may
        evict it from the LRU before this one decodes.
        """
        pixels = model_io.tensor(pb_utils, request, protocol.IMAGE)
        if pixels is None:
            image_id = model_io.string(pb_utils, request, protocol.IMAGE_ID)
            if image_id is None:
                raise RequestError(
                    protocol.IMAGE,
                    "missing; send the image (uint8 [H, W, 3]) or the "
                    f"{protocol.IMAGE_ID} of an image this server answered",
                )
            # sent with its pixels by another request of this batch, or held
            key = (tenant, image_id)
            entry = await runs[key] if key in runs else self.images.get(key)
            if entry is None:
                raise ImageMiss(
                    f"image_id {image_id!r} is not cached on this server (never sent, evicted, "
                    "or the server restarted); send the image again"
                )
            return image_id, 0, entry
        rgb = model_io.single(pixels.as_numpy(), protocol.IMAGE)
        try:
            rgb = images.check_rgb(rgb, max_pixels=self.settings.max_image_pixels)
        except ValueError as e:
            raise RequestError(*str(e).split(": ", 1)) from None  # "<field>: <message>"
        image_id = images.image_id(rgb, protocol.image_namespace(self.name))
        key = (tenant, image_id)
        entry = self.images.get(key)
        if entry is not None:
            return image_id, 0, entry
        task = runs.get(key)
        if task is not None:  # the same new image in another request of this batch
            return image_id, 0, await task
        task = runs[key] = asyncio.ensure_future(self._encode(key, rgb))
        return image_id, 1, await task

    async def _encode(self, key, rgb):
        """Run the vision graph; keep and return the entry (features by name, (H, W))."""
        pixels = pb_utils.Tensor("pixel_values", images.preprocess_sam3(rgb))
        response = await self._bls(
            self.settings.vision_model, [pixels], list(self.settings.feature_names), gpu=self.on_gpu
        )
        features = {}
        for tensor in response.output_tensors():
            # GPU: keep the BLS output tensor itself (device memory, no host copy); CPU: copy
            # it out of the stub's shared-memory pool.
            value = tensor if not tensor.is_cpu() else np.array(tensor.as_numpy())
            features[tensor.name()] = value
        entry = (features, tuple(int(d) for d in rgb.shape[:2]))
        self.images.put(key, entry, self.settings.feature_bytes, owner=key[0])
        return entry

    async def _exemplars(self, request, features, hw, tenant, kept):
        """(id of the request's boxes' exemplar or "", every exemplar token of the request
        [T, C] or None): its boxes' tokens (encoded now, on its image, and kept for
        ``tenant``), then ``kept``, the tokens of its ``exemplar_ids``."""
        found = concept_exemplars.boxes(pb_utils, request, hw, self.settings.max_boxes)
        exemplar_id, parts = "", list(kept)
        if found is not None:
            boxes, labels = found
            level = self.settings.feature_names[-1]  # the 72x72 level the geometry encoder reads
            image = features[level]
            feeds = [
                image if not isinstance(image, np.ndarray) else pb_utils.Tensor(level, image),
                pb_utils.Tensor(
                    EXEMPLAR_BOXES, concept_exemplars.normalised_cxcywh(boxes, hw)[None]
                ),
                pb_utils.Tensor(EXEMPLAR_LABELS, labels[None]),
            ]
            response = await self._bls(
                self.settings.exemplar_model, feeds, [EXEMPLAR_FEATURES], gpu=False
            )
            tokens = pb_utils.get_output_tensor_by_name(response, EXEMPLAR_FEATURES).as_numpy()
            tokens = np.array(tokens[0])  # out of the stub's shared memory: it is kept
            exemplar_id = self.exemplars.keep(tenant, tokens)
            parts.insert(0, tokens)
        return exemplar_id, (np.concatenate(parts) if parts else None)

    async def _text(self, token_ids, token_mask, tenant):
        """Text features [N, 32, C] of the phrases; the text graph runs for the uncached."""
        keys = [
            (tenant, ids[: int(m.sum())].tobytes())
            for ids, m in zip(token_ids, token_mask, strict=True)
        ]
        missing, seen = [], set()
        for i, key in enumerate(keys):  # a phrase given twice runs once
            if key not in self.phrases and key not in seen:
                seen.add(key)
                missing.append(i)
        fresh = {}
        if missing:
            feeds = [
                pb_utils.Tensor("input_ids", token_ids[missing]),
                pb_utils.Tensor(ATTENTION_MASK, token_mask[missing]),
            ]
            response = await self._bls(self.settings.text_model, feeds, [TEXT_FEATURES], gpu=False)
            values = pb_utils.get_output_tensor_by_name(response, TEXT_FEATURES).as_numpy()
            for i, value in zip(missing, values, strict=True):
                fresh[keys[i]] = np.array(value)
                self.phrases.put(keys[i], fresh[keys[i]], value.nbytes, owner=tenant)
        return np.stack([fresh[k] if k in fresh else self.phrases.get(k) for k in keys])

    async def _decode(self, features, prompts, prompt_mask, threshold, limit, wanted):
        """Decoder outputs per prompt, concatenated over ``phrases_per_decode`` chunks."""
        names = list(DECODER_OUTPUTS)
        if wanted & set(protocol.MASK_OUTPUTS):
            names.append("masks")
        image_feeds = [
            v if not isinstance(v, np.ndarray) else pb_utils.Tensor(n, v)
            for n, v in sorted(features.items())
        ]
        step = self.settings.phrases_per_decode
        jobs = []
        for start in range(0, len(prompts), step):
            feeds = [
                *image_feeds,
                pb_utils.Tensor(PROMPT_FEATURES, prompts[None, start : start + step]),
                pb_utils.Tensor(PROMPT_MASK, prompt_mask[None, start : start + step]),
                pb_utils.Tensor("threshold", np.array([[threshold]], np.float32)),
                pb_utils.Tensor("max_instances", np.array([[limit]], np.int64)),
            ]
            jobs.append(self._bls(self.settings.decoder_model, feeds, names, gpu=False))
        chunks = []
        for response in await asyncio.gather(*jobs):
            out = {n: pb_utils.get_output_tensor_by_name(response, n).as_numpy() for n in names}
            # One image per call: drop the batch dim; per phrase, keep its first num_instances.
            counts = out["num_instances"][0]
            for p, count in enumerate(counts):
                chunks.append({n: out[n][0, p] for n in names} | {"count": int(count)})
        return chunks

    def _outputs(self, decoded, hw, mask_threshold, wanted):
        """Protocol outputs (numpy, batch dim 1) from the per-phrase decoder outputs."""
        per_instance = {protocol.PHRASE_INDEX: [], protocol.QUERY_INDEX: []}
        per_instance |= {protocol.SCORES: [], protocol.BOXES: [], "masks": []}
        for p, phrase in enumerate(decoded):
            n = phrase["count"]
            per_instance[protocol.PHRASE_INDEX] += [p] * n
            per_instance[protocol.QUERY_INDEX] += list(phrase["query_index"][:n])
            per_instance[protocol.SCORES] += list(phrase["scores"][:n])
            per_instance[protocol.BOXES] += list(masks.scale_boxes(phrase["boxes"][:n], hw))
            if "masks" in phrase:
                per_instance["masks"] += list(phrase["masks"][:n])
        k = len(per_instance[protocol.SCORES])
        out = {
            protocol.PRESENCE: np.array([[d["presence"] for d in decoded]], np.float32),
            protocol.NUM_INSTANCES: np.array([[d["count"] for d in decoded]], np.int32),
            protocol.PHRASE_INDEX: np.array([per_instance[protocol.PHRASE_INDEX]], np.int32),
            protocol.QUERY_INDEX: np.array([per_instance[protocol.QUERY_INDEX]], np.int32),
            protocol.SCORES: np.array([per_instance[protocol.SCORES]], np.float32).reshape(1, k),
            protocol.BOXES: np.array(per_instance[protocol.BOXES], np.float32).reshape(1, k, 4),
        }
        logits = per_instance["masks"]
        if protocol.MASKS_LOGITS in wanted:
            size = (self.mask_size, self.mask_size)
            out[protocol.MASKS_LOGITS] = np.array(logits, np.float32).reshape(1, k, *size)
        encodings = [n for n in (protocol.MASKS_RLE, protocol.MASKS_PNG) if n in wanted]
        encoded = {n: [] for n in encodings}
        stacked = np.array(logits, np.float32) if encodings else np.zeros((0, 1, 1), np.float32)
        for binary in masks.binary_masks(stacked, hw, mask_threshold):
            for name in encodings:
                codec = masks.encode_rle if name == protocol.MASKS_RLE else masks.encode_png
                encoded[name].append(codec(binary))
        for name, values in encoded.items():
            out[name] = np.array(values, dtype=np.object_).reshape(1, k)
        return out

    async def _bls(self, model, inputs, outputs, *, gpu):
        memory = preferred_memory(pb_utils, gpu=gpu, device=self.device_id)
        request = pb_utils.InferenceRequest(
            model_name=model, inputs=inputs, requested_output_names=list(outputs), **memory
        )
        return checked(await request.async_exec(), model)
