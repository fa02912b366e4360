"""Triton python-backend model ``sam3_concept_video``: concepts (phrases, exemplar boxes drawn
on one frame, or both) tracked through a video, streamed frame by frame.

The repository writer copies this file to ``sam3_concept_video/1/model.py`` with the
dependency-free ``triton_sam.serving`` modules it imports beside it as ``triton_sam_serving``
and the tokenizer's ``tokenizer.json``. Everything but the tensors' conversion is
:class:`triton_sam_serving.concept_video.service.ConceptVideoService` (tested without
Triton); the graphs (the concept graphs ``text``, ``exemplar``, ``decoder``, ``video_vision``
and the SAM3 tracker's) run as their own Triton models, called over BLS.

Decoupled, gRPC streaming only (Triton's HTTP endpoint refuses decoupled models). Every
request answers at least one response and ends with the final flag:

- ``init``, ``add_frame``, ``add_prompt``, ``info``, ``close``: one response, answered on the
  model's thread in order, under the service's lock.
- ``propagate``: checked at once (a refusal is its only response), then streamed on a thread
  of its own: one response per processed frame (an answered frame's tensors, or progress
  alone while the hot-start hold-back keeps answers back), then the totals. The stream asks
  ``request.is_cancelled()`` before each frame; a cancelled one ends with ``Cancelled``.

Sessions (server-issued ids bound to the request's tenant, bounds, idle eviction) are the
tracker's ``SessionStore`` in this model's one instance; see ``serving/tracker_model.py`` for
why sessions stay in one instance rather than in Triton's sequence state.
"""

import contextlib
import json
import os
import sys
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the package shipped beside
from triton_sam_serving import model_io
from triton_sam_serving.concept_request import Tokenizer
from triton_sam_serving.concept_video.service import ConceptVideoService
from triton_sam_serving.metric_set import MetricSet
from triton_sam_serving.protocol import concept as concept_protocol
from triton_sam_serving.protocol import concept_video as protocol
from triton_sam_serving.protocol import settings
from triton_sam_serving.protocol.tenancy import request_tenant
from triton_sam_serving.session_call import BlsRunner
from triton_sam_serving.tracking.config import TrackerConfig
from triton_sam_serving.tracking.sessions import SessionStore

METRIC_PREFIX = "triton_sam_concept_video_"


class TritonPythonModel:
    """``sam3_concept_video``: session commands at once, propagations streamed."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(
                f"{args['model_name']}: needs model_transaction_policy {{ decoupled: true }}"
            )
        served = settings.from_model_config(protocol.ConceptVideoServing, config)
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        tokenizer = Tokenizer(
            os.path.join(version_dir, concept_protocol.TOKENIZER_FILE),
            served.pad_token_id,
            concept_protocol.CONTEXT_LENGTH,
        )
        self.service = ConceptVideoService(
            BlsRunner(pb_utils, json.loads(served.detector_models)),
            BlsRunner(pb_utils, json.loads(served.tracker_models)),
            TrackerConfig.from_json(served.model_config),
            tokenizer.encode,
            SessionStore(**served.store_bounds()),
            max_propagations=served.max_propagations,
        )
        self.input_names = [t["name"] for t in config["input"]]
        self.metrics = _Metrics(args)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                inputs = self._inputs(request)
                tenant = request_tenant(request)
                if model_io.cancelled(request):
                    raise _cancelled("request cancelled before execution")
                command = inputs.get(protocol.COMMAND)
                if command is not None and _command(command) == protocol.CMD_PROPAGATE:
                    stream = self.service.propagate(inputs, tenant, request.is_cancelled)
                    threading.Thread(
                        target=self._stream, args=(stream, sender),
                        name="triton_sam_concept_video", daemon=True,
                    ).start()  # fmt: skip
                    continue
                response = _response(self.service.handle(inputs, tenant))
            except Exception as e:  # refusals by their code; one request never takes it down
                response = model_io.error_answer(pb_utils, e)
            _final(sender, response)
            self.metrics.publish(self.service)
        return None

    def finalize(self):
        self.service = None
        self.metrics.close()

    def _inputs(self, request):
        inputs = {}
        for name in self.input_names:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                inputs[name] = tensor.as_numpy()
        return inputs

    def _stream(self, stream, sender):
        try:
            last = None
            for outputs in stream:
                if last is not None:
                    sender.send(_response(last))
                last = outputs
            response = _response(last)  # the totals, sent with the final flag
        except Exception as e:
            response = model_io.error_answer(pb_utils, e)
        _final(sender, response)
        self.metrics.publish(self.service)


def _command(value):
    item = np.asarray(value).reshape(-1)[:1]
    return model_io.as_bytes(item[0]).decode("utf-8", "replace") if item.size else ""


def _cancelled(message):
    return protocol.TrackingError(protocol.ERR_CANCELLED, message, protocol.COMMAND)


def _response(outputs):
    tensors = [pb_utils.Tensor(n, np.ascontiguousarray(v)) for n, v in outputs.items()]
    return pb_utils.InferenceResponse(output_tensors=tensors)


def _final(sender, response):
    with contextlib.suppress(Exception):  # the stream is gone (a cancelled client)
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class _Metrics(MetricSet):
    """Gauges of sessions and propagations, and the frames processed and answered (what a
    test or an operator counts a cancel by); no-ops where the stub has no custom metrics."""

    SPECS = (
        ("sessions", "GAUGE", "Concept video sessions held"),
        ("propagations", "GAUGE", "Propagations streaming now"),
        ("frames_processed", "GAUGE", "Frames processed by propagations since the model loaded"),
        ("frames_answered", "GAUGE", "Frame responses sent since the model loaded"),
    )

    def __init__(self, args):
        super().__init__(pb_utils, args, self.SPECS, METRIC_PREFIX)

    def publish(self, service):
        if "sessions" not in self._metrics:
            return
        self._metrics["sessions"].set(len(service.store))
        self._metrics["propagations"].set(service.streaming)
        self._metrics["frames_processed"].set(service.frames_processed)
        self._metrics["frames_answered"].set(service.frames_answered)
