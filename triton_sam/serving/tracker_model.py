"""Triton python-backend model that tracks objects through videos: ``sam2_tracker`` (SAM2.1)
and ``sam3_tracker`` (SAM3), the same file over each family's graphs and ``TrackerConfig``.

The repository writer copies this file to ``sam2_tracker/1/model.py`` and the dependency-free
``triton_sam/serving`` modules it needs beside it as ``triton_sam_serving/`` (the same code the
clients' in-process predictor runs). It imports only numpy, json, os, sys and
``triton_python_backend_utils`` itself; the package adds Pillow to decode and resize frames.

Every request is one command of ``triton_sam_serving.protocol.tracker`` (init, add_frame,
add_points, add_mask, preflight, track, get, ...) on one session; the answer carries one
frame's low-res masks at most, so the memory bank never crosses the wire. The five graphs run
as their own Triton models (onnxruntime backend in the GPU container, runner_model.py in the
embedded server), called through BLS.

State placement: sessions live in this model's one instance (its stub process), bounded in
sessions, frames and bytes, per tenant and per server (``SessionStore``). ``init`` issues each
session's id (128 random bits) and binds it to the request's tenant (the proxy's forwarded
header, ``protocol.tenancy``); only a session idle for ``evict_idle_s`` may be evicted to make
room for another, else the request that needs the room is refused with ``Overloaded``.
Session ids never reach the log or the metrics. Triton's sequence batcher with
implicit state was not used: implicit state is a fixed set of tensors handed back to the same
model on every request of a sequence, while a tracking session holds a variable, growing
memory bank (per object and frame), frames, and Python decisions over them; it would also
travel through the model on every request instead of staying put.

Concurrency: one instance; requests execute one after another (a frame of one session and a
click of another queue behind each other). Scale the graph models' instances, not this one:
a second instance would hold other sessions, and Triton cannot route a session to its
instance. Queued requests that were cancelled are dropped by Triton (dynamic batching) or
skipped here; a propagation is one request per frame, so a cancelled client stops it.

Config ``parameters`` (keys in ``protocol.PARAM_KEYS``): graph_models, model_config,
max_sessions, max_frames, max_session_bytes, max_total_bytes, feature_cache_frames,
max_tenant_sessions, max_tenant_bytes (0: the server's), evict_idle_s.
"""

import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the package shipped beside
from triton_sam_serving import model_io
from triton_sam_serving.metric_set import MetricSet
from triton_sam_serving.protocol import settings
from triton_sam_serving.protocol import tracker as protocol
from triton_sam_serving.protocol.tenancy import request_tenant
from triton_sam_serving.session_call import BlsRunner
from triton_sam_serving.tracking.config import TrackerConfig
from triton_sam_serving.tracking.service import TrackingService
from triton_sam_serving.tracking.sessions import SessionStore

METRIC_PREFIX = "triton_sam_tracker_"


class TritonPythonModel:
    """The ``sam2_tracker`` model: commands on bounded, server-side tracking sessions."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        served = settings.from_model_config(protocol.TrackerSettings, config)
        tracker_config = TrackerConfig.from_json(served.model_config)
        self.service = TrackingService(
            BlsRunner(pb_utils, json.loads(served.graph_models)),
            tracker_config,
            SessionStore(**served.store_bounds()),
        )
        # the masks' size is the family's (SAM2.1 256, SAM3 288)
        self.output_contracts = protocol.output_tensors(tracker_config.mask_size)
        self.input_names = [t["name"] for t in config["input"]]
        self.metrics = _Metrics(args)

    def execute(self, requests):
        """Answer the requests of this batch one after another."""
        responses = [self._answer(request) for request in requests]
        self.metrics.publish(self.service)
        return responses

    def finalize(self):
        self.service = None
        self.metrics.close()

    def _answer(self, request):
        p = protocol
        try:
            if model_io.cancelled(request):
                self.metrics.count("cancelled_skipped")
                return p.error_response(
                    pb_utils, p.ERR_CANCELLED, "request cancelled before execution"
                )
            inputs = {}
            for name in self.input_names:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is None:
                    continue
                value = tensor.as_numpy()
                if value.shape[0] != 1:  # max_batch_size > 0: dim 0 is Triton's batch
                    raise p.TrackingError(
                        p.ERR_INVALID_INPUT, f"{name}: send one item per request", name
                    )
                inputs[name] = value[0]
            outputs = self.service.handle(inputs, request_tenant(request))
            tensors = _tensors(request, outputs, self.output_contracts)
            return pb_utils.InferenceResponse(output_tensors=tensors)
        except Exception as e:  # never let one request take the sessions down
            return model_io.error_answer(pb_utils, e)


def _tensors(request, outputs, output_contracts):
    """Every requested output with Triton's batch dim; an output the command does not produce
    goes back empty (Triton wants every requested output in the response)."""
    p = protocol
    names = model_io.requested_outputs(request) or list(outputs)
    contracts = {name: (dtype, dims) for name, dtype, dims in output_contracts}
    tensors = []
    for name in names:
        value = outputs.get(name)
        if value is None:
            dtype, dims = contracts[name]
            if dtype == "bytes":  # the status "{}", the session id "" (not init)
                value = np.array([b"{}" if name == p.OUT_STATUS else b""], dtype=object)
            else:
                value = np.zeros([0 if d < 0 else d for d in dims], np.dtype(dtype))
        tensors.append(pb_utils.Tensor(name, np.ascontiguousarray(value)[None]))
    return tensors


class _Metrics(MetricSet):
    """Gauges of the sessions and counters of frames tracked, evictions, cancelled requests
    skipped; no-ops where the stub has no custom metrics."""

    SPECS = (
        ("sessions", "GAUGE", "Tracking sessions held"),
        ("bytes", "GAUGE", "Bytes of frames, features and memory banks held"),
        ("frames_tracked", "GAUGE", "Frames answered by track since the model loaded"),
        ("evictions", "GAUGE", "Idle sessions evicted for others since the model loaded"),
        ("refusals", "GAUGE", "Requests refused: no idle session to evict for them"),
        ("cancelled_skipped", "COUNTER", "Cancelled requests answered without running"),
    )

    def __init__(self, args):
        super().__init__(pb_utils, args, self.SPECS, METRIC_PREFIX)

    def publish(self, service):
        if "sessions" not in self._metrics:
            return
        self._metrics["sessions"].set(len(service.store))
        self._metrics["bytes"].set(service.store.nbytes)
        self._metrics["frames_tracked"].set(service.frames_tracked)
        self._metrics["evictions"].set(service.store.evictions)
        self._metrics["refusals"].set(service.store.refusals)
