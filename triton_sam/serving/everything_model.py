"""Triton python-backend (BLS) model ``<family>_everything``: segment everything, served.

The repository writer copies this file to ``<family>_everything/1/model.py`` (both targets),
with the dependency-free ``triton_sam.serving`` modules beside it as ``triton_sam_serving``.
The contract (tensors, the JSON answer, why decoupled over gRPC) is in
:mod:`triton_sam.serving.protocol.everything`; the job itself (grids, crops, filters, NMS,
RLE) is :class:`triton_sam.serving.everything.Generator`, the same driver the in-process
runner uses, with two callbacks made of BLS calls here:

- ``embed(crop box)``: the family's session model (``<family>_session``) embeds the image (or
  the crop, sent as ``image_rgb``), caching it under the request's tenant, and answers the
  features and the image's size (``serving/embedding_cache_model.py``, outputs named as the
  encoder's). The whole image is embedded once per job, so an image a client already set
  (``set_image``) is not encoded again, and a later click on it finds it cached.
- ``decode(features, feeds)``: the family's ``<family>_everything_decoder`` graph on those
  features and one batch of single-point prompts.

Progress and cancellation: the model is decoupled. Each job first answers ``progress``
``(0, total_batches)``, then ``(done, total)`` after each decoder batch, then the final
``instances`` response; the generator polls ``request.is_cancelled()`` before each embed and
each batch, so a client that cancels its gRPC stream stops the job within one batch (the
answer is a ``Cancelled`` error nobody reads).

Bounded: ``max_concurrent_jobs`` jobs run at once (each on its own thread: the driver's
callbacks block on their BLS calls), ``max_waiting_jobs`` wait, one more is refused at once
with ``Overloaded``; a job that was cancelled while it waited is answered unrun. One job's
memory is bounded by the parameters' bounds (``serving/everything/``: one batch of masks at
a time, RLE per batch) and the image bounds (``max_image_bytes``, ``max_image_pixels``,
checked here before anything is decoded).
"""

import contextlib
import json
import os
import sys
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the package shipped beside
from triton_sam_serving import bounds, everything, intake, model_io
from triton_sam_serving import protocol as envelope
from triton_sam_serving.protocol import embedding_cache as session
from triton_sam_serving.protocol import everything as protocol
from triton_sam_serving.protocol import large, settings, tenancy
from triton_sam_serving.session_call import SessionCall, checked, preferred_memory


class _Overloaded(Exception):
    """Every job slot is taken and the waiting line is full."""


class _Admission:
    """At most ``slots`` jobs at once, at most ``max_waiting`` waiting (thread-safe)."""

    def __init__(self, slots, max_waiting):
        self.slots, self.max_waiting = max(1, slots), max(0, max_waiting)
        self._lock = threading.Lock()
        self._admitted = 0  # running + waiting
        self._turns = threading.Semaphore(self.slots)

    def admit(self):
        with self._lock:
            if self._admitted >= self.slots + self.max_waiting:
                raise _Overloaded(
                    f"exceeds maximum queue size: {self.slots} job(s) running and "
                    f"{self.max_waiting} waiting; retry later"
                )
            self._admitted += 1

    def wait_turn(self):
        """Block until a slot is free; True when it had to wait."""
        if self._turns.acquire(blocking=False):
            return False
        self._turns.acquire()
        return True

    def done(self, *, ran):
        if ran:
            self._turns.release()
        with self._lock:
            self._admitted -= 1


class TritonPythonModel:
    """``<family>_everything``: an image (or its id) + params in, progress and instances out."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(
                f"{args['model_name']}: needs model_transaction_policy {{ decoupled: true }}"
            )
        self.settings = settings.from_model_config(protocol.JobSettings, config)
        self.family = self.settings.family
        self.session_call = SessionCall(pb_utils, self.settings.session_model)
        self.admission = _Admission(
            self.settings.max_concurrent_jobs, self.settings.max_waiting_jobs
        )
        everything.defaults(self.family)  # a config naming no family we reproduce: refused

    def execute(self, requests):
        """Admit each request and run it on its own thread; each answers through its sender."""
        for request in requests:
            try:
                # A request with no image (a health probe, a malformed job) is refused before
                # admission, so it never takes the place of a job waiting for a slot.
                _image_inputs(request)
                self.admission.admit()
            except _Overloaded as e:
                _final(request.get_response_sender(), _error(envelope.ERR_OVERLOADED, str(e)))
                continue
            except bounds.RequestError as e:
                _final(request.get_response_sender(), model_io.error_answer(pb_utils, e))
                continue
            threading.Thread(
                target=self._job, args=(request,), name="triton_sam_everything", daemon=True
            ).start()
        return None

    def finalize(self):
        pass

    # -- one job -----------------------------------------------------------------------------
    def _job(self, request):
        sender = request.get_response_sender()
        ran = False
        try:
            waited = self.admission.wait_turn()
            ran = True
            if waited and request.is_cancelled():
                raise everything.Cancelled("cancelled while waiting for a job slot")
            response = self._answer(request, sender)
        except everything.Cancelled as e:
            response = _error(envelope.ERR_CANCELLED, f"job {e}")
        except Exception as e:  # refusals by their code; never let one job take the stub down
            response = model_io.error_answer(pb_utils, e)
        finally:
            self.admission.done(ran=ran)
        _final(sender, response)

    def _answer(self, request, sender):
        if request.is_cancelled():
            raise everything.Cancelled("cancelled before it started")
        tenant = tenancy.request_tenant(request)  # a forged second value: refused
        params = everything.parse_params(self.family, self._params_text(request))
        kind, value = self._image(request, tenant)
        if kind == "id" and params.crop_n_layers > 0:
            raise bounds.RequestError(
                f"{everything.FIELD}.crop_n_layers",
                f"got {params.crop_n_layers} with {protocol.IMAGE_ID} alone; crops are cut "
                f"from the pixels: send {protocol.IMAGE_BYTES} or {protocol.IMAGE_RGB}",
            )
        wanted = [session.IMAGE_ID, session.IMAGE_SIZE, *self.settings.embedding_names]
        whole = self.session_call.call(tenant, [_image_tensor(kind, value)], wanted)
        hw = tuple(int(v) for v in whole[session.IMAGE_SIZE].as_numpy().reshape(-1)[:2])
        rgb = None
        if params.crop_n_layers > 0:  # the crops' pixels: decoded here too (bounded above)
            rgb = (
                value
                if kind == "rgb"
                else intake.decode_image(
                    value, max_pixels=self.settings.max_image_pixels, field=protocol.IMAGE_BYTES
                )
            )
        held = {"whole": whole}

        def embed(box):
            x0, y0, x1, y1 = (int(v) for v in box)
            if (x0, y0, x1, y1) == (0, 0, hw[1], hw[0]) and "whole" in held:
                features = held.pop("whole")  # not held past its crop
            else:
                crop = np.ascontiguousarray(rgb[y0:y1, x0:x1])
                features = self.session_call.call(
                    tenant,
                    [_image_tensor("rgb", crop)],
                    list(self.settings.embedding_names),
                    parameters=session.CROP_EMBED,  # a crop never evicts the tenant's images
                )
            return [features[n] for n in self.settings.embedding_names]

        def progress(done, total):
            _progress(sender, done, total)

        generator = everything.Generator(
            params,
            family=self.family,
            embed=embed,
            decode=self._decode,
            progress=progress,
            cancelled=request.is_cancelled,
        )
        _progress(sender, 0, generator.total_batches(hw))
        records = generator.run(hw)
        text = json.dumps({"image_size": list(hw), "instances": records}, separators=(",", ":"))
        out = np.array([text.encode("utf-8")], dtype=np.object_)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(protocol.INSTANCES, out)])

    def _params_text(self, request):
        tensor = pb_utils.get_input_tensor_by_name(request, protocol.PARAMS)
        if tensor is None:
            return "{}"
        value = tensor.as_numpy().reshape(-1)
        if value.size != 1:
            raise bounds.RequestError(
                protocol.PARAMS, f"got {value.size} elements, expected 1 (one JSON object)"
            )
        blob = model_io.as_bytes(value[0])
        if len(blob) > self.settings.max_params_bytes:
            raise bounds.RequestError(
                protocol.PARAMS,
                f"got {len(blob)} bytes, expected at most {self.settings.max_params_bytes}",
            )
        try:
            return blob.decode("utf-8")
        except UnicodeDecodeError as e:
            raise bounds.RequestError(protocol.PARAMS, "expected UTF-8 JSON text") from e

    def _image(self, request, tenant):
        """("bytes" | "rgb" | "id", value) of the one image source the request carries (a
        large image's block is read as pixels from the large model)."""
        ((name, array),) = _image_inputs(request).items()
        if name == protocol.HANDLE:
            return "rgb", self._block_pixels(request, tenant, array)
        if name == protocol.IMAGE_RGB:
            return "rgb", intake.check_rgb(
                array, max_pixels=self.settings.max_image_pixels, field=name
            )
        values = array.reshape(-1)
        if values.size != 1:
            raise bounds.RequestError(name, f"got {values.size} elements, expected 1")
        blob = model_io.as_bytes(values[0])
        if name == protocol.IMAGE_ID:
            image_id = blob.decode("utf-8", "replace")
            bounds.check_key(name, image_id)
            return "id", image_id
        if len(blob) > self.settings.max_image_bytes:
            raise bounds.RequestError(
                name, f"got {len(blob)} bytes, expected at most {self.settings.max_image_bytes}"
            )
        return "bytes", blob

    def _block_pixels(self, request, tenant, handle):
        """The mapped pixels of a large image's block, read by the large model as ``tenant``
        (its refusals, such as a handle that is not this tenant's, are relayed)."""
        if not self.settings.large_model:
            raise bounds.RequestError(
                protocol.HANDLE, "this server has no large-image model; send the image instead"
            )
        text = large_read(request, handle)
        inputs = [pb_utils.Tensor(large.REQUEST, np.array([text.encode()], dtype=np.object_))]
        call = SessionCall(pb_utils, self.settings.large_model)
        rgb = call.call(tenant, inputs, [large.RGB])[large.RGB].as_numpy()
        return intake.check_rgb(rgb, max_pixels=self.settings.max_image_pixels, field=large.RGB)

    def _decode(self, features, feeds):
        """One run of the everything-decoder graph: output name -> numpy array."""
        inputs = list(features) + [pb_utils.Tensor(n, np.asarray(v)) for n, v in feeds.items()]
        response = pb_utils.InferenceRequest(
            model_name=self.settings.decoder_model,
            inputs=inputs,
            requested_output_names=list(everything.GRAPH_OUTPUTS),
            **preferred_memory(pb_utils),  # the records are written on the host
        ).exec()
        checked(response, self.settings.decoder_model)
        return {
            n: pb_utils.get_output_tensor_by_name(response, n).as_numpy()
            for n in everything.GRAPH_OUTPUTS
        }


def large_read(request, handle):
    """The large model's ``read`` request (JSON) for the block a job names."""
    values = handle.reshape(-1)
    if values.size != 1:
        raise bounds.RequestError(protocol.HANDLE, f"got {values.size} elements, expected 1")
    block = pb_utils.get_input_tensor_by_name(request, protocol.BLOCK)
    if block is None or block.as_numpy().size != 4:
        raise bounds.RequestError(
            protocol.BLOCK, "expected 4 integers (row0, col0, row1, col1) with a handle"
        )
    read = {
        "op": "read",
        "handle": model_io.as_bytes(values[0]).decode("utf-8", "replace"),
        "block": [int(v) for v in block.as_numpy().reshape(-1)],
    }
    z = pb_utils.get_input_tensor_by_name(request, protocol.Z)
    if z is not None:
        read["z"] = int(z.as_numpy().reshape(-1)[0])
    return json.dumps(read)


def _image_inputs(request):
    """{name: array} of the request's one image input; refused unless there is exactly one."""
    given = {n: pb_utils.get_input_tensor_by_name(request, n) for n in protocol.IMAGE_INPUTS}
    given = {n: t.as_numpy() for n, t in given.items() if t is not None}
    if len(given) != 1:
        raise bounds.RequestError(
            protocol.IMAGE_BYTES,
            f"got {sorted(given) or 'no image'}, expected exactly one of "
            f"{list(protocol.IMAGE_INPUTS)}",
        )
    return given


def _image_tensor(kind, value):
    """The session model's input for an image source (its inputs carry a batch dim of 1)."""
    if kind == "rgb":
        return pb_utils.Tensor(session.IMAGE_RGB, value[None])
    name = session.IMAGE_ID if kind == "id" else session.IMAGE_BYTES
    data = value.encode("utf-8") if kind == "id" else value
    return pb_utils.Tensor(name, np.array([[data]], dtype=np.object_))


def _error(code, message):
    return envelope.error_response(pb_utils, code, message)


def _progress(sender, done, total):
    value = np.array([done, total], np.int32)
    sender.send(
        pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(protocol.PROGRESS, value)])
    )


def _final(sender, response):
    with contextlib.suppress(Exception):  # the stream is gone (a cancelled client)
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
