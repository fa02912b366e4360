"""Triton python-backend (BLS) model ``<family>_large``: images larger than SAM's input.

The repository writer copies this file to ``<family>_large/1/model.py`` (both targets), with
the dependency-free ``triton_sam.serving`` modules it imports beside it as
``triton_sam_serving``. The contract (ops, JSON fields, modes, mappings, errors) is
:mod:`triton_sam.serving.protocol.large`; the parts are :mod:`triton_sam.serving.large`.

Design:

- **Images under handles.** ``open`` reads a dataset under a data root (the readers of
  ``serving/datasets``, imported on the first open); ``create`` + ``put`` spool a client's
  array to disk (``.npy`` memmaps in a private directory, bounded per tenant by
  ``max_upload_bytes``, deleted at close, eviction and shutdown), so the server's memory never
  grows with the image. Handles are 128 random bits bound to the tenant
  (``protocol/tenancy.py``), at most ``max_handles`` per tenant (LRU); anything else is
  ``HandleNotFound``.
- **A click reads only its block.** ``predict`` picks the tile (micro-sam's rule: the tile
  under the prompts' centre with its halo, points outside dropped and counted in
  ``dropped``) or a window centred on the prompts (``mode``); ``auto`` answers on the tile
  unless its best mask is cut at an edge where the image goes on, then on a window centred
  on the prompts and that mask (at most two windows; ``cut`` stays true when the last one
  still cuts it). The block's pixels are read (on a thread), mapped to uint8 RGB
  (``datasets/pixels.py``: one mapping for server, client and page) and embedded by the
  session model ``<family>_session`` as ``image_rgb`` (its cache, admission, tenancy and
  parity apply: a tile is just an image to it); the block's image id is remembered, so a
  later click on it sends the id alone (a miss re-reads and re-embeds once). The mask comes
  back as the session model's block-size RLE, is cut to its bounding box and answered as
  that crop's RLE with its ``offset`` in full-image pixels: the bytes of a click never grow
  with the image.
- **Precompute.** ``embed`` embeds listed tiles (row-major ids), one at a time per request,
  answering which ran the encoder and which were held; ``status`` probes the session model
  for the tiles it holds now, so a precompute resumes where it stopped.
- **Admission.** Opens and creates wait in a line of their own (``max_concurrent_opens``,
  ``max_waiting_opens``; beyond it ``Overloaded``), puts in another (``max_concurrent_puts``,
  ``max_waiting_puts``: each holds its piece in memory until it is on disk, so a burst of
  uploads holds a few pieces, never more); embeds are admitted by the session model
  itself (relayed as is). Reads for clicks run on a thread pool of their own, reads for
  opens, puts and precompute on another: a click never waits for a thread behind them.
- **Concurrency.** As the session model: ``execute`` schedules each request on the
  instance's own event loop and returns; each request answers through its response sender
  (one response, FINAL) when its BLS calls (``async_exec``) are done. All state (handles,
  remembered ids, the spool's budget) is touched on that loop only.

Data roots are the operator's, read at serve time: the environment variable
``TRITON_SAM_DATA_ROOTS`` (JSON ``{"<name>": {"path": "/abs/dir", "tenants": [...]}}``, as
``DataRoots.from_json`` reads it) of the tritonserver process, which the stub inherits;
``triton-sam serve --data-root NAME=PATH`` and hydra ``serve.data_roots`` set it for the
embedded server, compose's environment for the container. When it is unset, the config
parameter ``data_roots`` is used; by default there are none and every ``open`` is refused.
"""

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the package shipped beside
from triton_sam_serving import bounds, model_io
from triton_sam_serving.large.bls import BlsSession
from triton_sam_serving.large.loop import LoopThread
from triton_sam_serving.large.service import Service
from triton_sam_serving.protocol import large as protocol
from triton_sam_serving.protocol import settings, tenancy

THREADS = 2  # per pool: block reads and RLE are numpy work that releases the GIL


class TritonPythonModel:
    """``<family>_large``: a JSON request (and a put's pixels) in, a JSON answer out."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        found = settings.from_model_config(protocol.LargeSettings, config)
        roots = os.environ.get(protocol.DATA_ROOTS_ENV, "").strip()
        self.settings = replace(found, data_roots=roots) if roots else found
        self.clicks = ThreadPoolExecutor(THREADS, thread_name_prefix="triton_sam_large_click")
        self.background = ThreadPoolExecutor(THREADS, thread_name_prefix="triton_sam_large_bg")
        self.service = Service(
            self.settings,
            BlsSession(pb_utils, self.settings.session_model),
            clicks=self.clicks,
            background=self.background,
        )
        if self.settings.data_roots:  # a malformed setting fails the load, not a user's open
            self.service.roots()
        self.loop = LoopThread("triton_sam_large")

    def execute(self, requests):
        """Schedule every request on the instance's loop and return at once (see the module
        doc). Returns None: each request is answered by its response sender."""
        for request in requests:
            self.loop.submit(self._respond(request))
        return None

    def finalize(self):
        self.loop.stop()
        self.clicks.shutdown(wait=False)
        self.background.shutdown(wait=False)
        self.service.close()

    async def _respond(self, request):
        sender = request.get_response_sender()
        try:
            response = await self._answer(request)
        except Exception as e:  # refusals by their code; one request never takes the stub down
            response = model_io.error_answer(pb_utils, e)
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    async def _answer(self, request):
        tenant = tenancy.request_tenant(request)  # a forged second value: refused
        value = model_io.one_value(pb_utils, request, protocol.REQUEST)
        if value is None:
            raise bounds.RequestError(protocol.REQUEST, "missing: the JSON request")
        given = [model_io.tensor(pb_utils, request, n) for n in protocol.PIXEL_INPUTS.values()]
        given = [t.as_numpy() for t in given if t is not None]
        if len(given) > 1:
            raise bounds.RequestError(protocol.PIXELS, "a put carries one piece, in one input")
        pixels = given[0] if given else None
        answer = await self.service.answer(tenant, model_io.as_bytes(value), pixels)
        rgb = answer.pop(protocol.RGB, None)  # a read's pixels travel as their own tensor
        text = json.dumps(answer, separators=(",", ":")).encode("utf-8")
        out = [pb_utils.Tensor(protocol.ANSWER, np.array([text], dtype=np.object_))]
        if rgb is not None:
            out.append(pb_utils.Tensor(protocol.RGB, rgb))
        return pb_utils.InferenceResponse(output_tensors=out)
