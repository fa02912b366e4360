"""Triton python-backend model that runs an ONNX graph with onnxruntime.

The repository writer copies this file verbatim to ``<model>/1/model.py`` for the ``python``
target: the fallback for an embedded tritonserver without Triton's onnxruntime backend (the
nvidia-pytriton wheel ships none; ``triton-sam serve`` uses that backend when it can be found,
and this runner only with ``--target python``). It runs in Triton's stub process, not in
triton_sam, so it imports only numpy, onnxruntime, json, os, sys,
``triton_python_backend_utils`` and the protocol shipped beside it
(``triton_sam_serving/protocol/runner.py``: its config ``parameters`` and metric name).
"""

import json
import os
import sys

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the package shipped beside
from triton_sam_serving.protocol import runner as protocol

SKIPPED_METRIC = protocol.SKIPPED_METRIC


class TritonPythonModel:
    """One onnxruntime session per model instance; batches requests of equal shapes."""

    def initialize(self, args):
        """Load ``<model dir>/<version>/<onnx_file>`` and read tensor names from the config."""
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        onnx_file = params.get(protocol.PARAM_ONNX_FILE) or protocol.DEFAULT_ONNX_FILE
        path = os.path.join(args["model_repository"], args["model_version"], onnx_file)
        nice = int(params.get(protocol.PARAM_NICE) or 0)
        if nice > 0:  # before the session: its threads inherit the calling thread's niceness
            os.nice(min(nice, 19))
        options = ort.SessionOptions()
        threads = int(params.get(protocol.PARAM_INTRA_OP_THREADS) or 0)
        if threads > 0:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(path, sess_options=options, providers=_providers(args))
        self.run_options = None
        shrink = params.get(protocol.PARAM_SHRINK_ARENA) or ""
        if shrink:
            self.run_options = ort.RunOptions()
            self.run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", shrink)
        self.input_names = [t["name"] for t in config["input"]]
        self.output_names = [t["name"] for t in config["output"]]
        self.output_dtypes = {
            t["name"]: pb_utils.triton_string_to_numpy(t["data_type"]) for t in config["output"]
        }
        self.batched = int(config.get("max_batch_size", 0)) > 0
        self._skipped = _skipped_counter(args)

    def execute(self, requests):
        """Answer every request: cancelled ones unrun, the rest in shape-grouped ORT batches."""
        responses = [None] * len(requests)
        groups = {}
        for i, request in enumerate(requests):
            # Triton's dynamic batcher drops requests cancelled while queued; one cancelled
            # after it formed this batch still reaches us and must not cost a run.
            if hasattr(request, "is_cancelled") and request.is_cancelled():
                responses[i] = _error("request cancelled before execution", "CANCELLED")
                if self._skipped is not None:
                    self._skipped[1].increment(1)
                continue
            feeds = {
                n: pb_utils.get_input_tensor_by_name(request, n).as_numpy()
                for n in self.input_names
            }
            # Only requests whose inputs agree on every non-batch dim can be concatenated.
            key = tuple(feeds[n].shape[1:] for n in self.input_names) if self.batched else i
            groups.setdefault(key, []).append((i, feeds, self._requested(request)))
        for members in groups.values():
            self._run_group(members, responses)
        return responses

    def finalize(self):
        """Release the session (and its device memory) when the model unloads."""
        self.session = None
        if self._skipped is not None:
            family, metric = self._skipped
            self._skipped = None
            del metric  # python-backend rule: a metric goes before its family
            del family

    def _requested(self, request):
        names = (
            request.requested_output_names() if hasattr(request, "requested_output_names") else []
        )
        return [n for n in self.output_names if n in names] or list(self.output_names)

    def _run_group(self, members, responses):
        # One ORT run computes the union of what the group asked for, nothing more.
        wanted = [n for n in self.output_names if any(n in m[2] for m in members)]
        try:
            per_request = self._run(members, wanted)
        except Exception as e:  # never let an ORT failure take the stub down
            if len(members) > 1:
                # A bad request must not fail its batch mates: retry them one by one.
                for member in members:
                    self._run_group([member], responses)
                return
            responses[members[0][0]] = _error(f"onnxruntime failed: {e}", "INVALID_ARG")
            return
        for (i, _, names), outputs in zip(members, per_request, strict=True):
            tensors = [pb_utils.Tensor(n, outputs[n]) for n in names]
            responses[i] = pb_utils.InferenceResponse(output_tensors=tensors)

    def _run(self, members, wanted):
        """Run ``members`` as one ORT batch (concatenated on dim 0); split the outputs back."""
        if len(members) == 1:
            results = self.session.run(wanted, members[0][1], self.run_options)
            return [{n: self._cast(n, r) for n, r in zip(wanted, results, strict=True)}]
        feeds = {n: np.concatenate([m[1][n] for m in members]) for n in self.input_names}
        results = self.session.run(wanted, feeds, self.run_options)
        sizes = [len(m[1][self.input_names[0]]) for m in members]
        per_request = [{} for _ in members]
        for name, result in zip(wanted, results, strict=True):
            if len(result) != sum(sizes):
                raise ValueError(f"output {name}: batch {len(result)}, expected {sum(sizes)}")
            parts = np.split(result, np.cumsum(sizes)[:-1])
            for outputs, part in zip(per_request, parts, strict=True):
                outputs[name] = self._cast(name, part)
        return per_request

    def _cast(self, name, array):
        # Triton checks output dtypes against the config; contiguous for the shm copy.
        return np.ascontiguousarray(array, dtype=self.output_dtypes[name])


def _providers(args):
    # CUDA only for GPU instances, and only when this onnxruntime build has it.
    if (
        args.get("model_instance_kind") == "GPU"
        and "CUDAExecutionProvider" in ort.get_available_providers()
    ):
        device = int(args.get("model_instance_device_id") or 0)
        return [("CUDAExecutionProvider", {"device_id": device}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def _skipped_counter(args):
    """(family, metric) counting cancelled requests answered unrun, or None where the stub
    has no custom metrics (before Triton 23.xx) or metrics are disabled."""
    if not hasattr(pb_utils, "MetricFamily"):
        return None
    try:
        family = pb_utils.MetricFamily(
            name=SKIPPED_METRIC,
            description="Cancelled requests the triton_sam runner answered without running",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        labels = {
            "model": args["model_name"],
            "version": str(args["model_version"]),
            "instance": args.get("model_instance_name", ""),  # one series per instance
        }
        # Keep the family referenced: a metric outliving its family cannot be incremented.
        return family, family.Metric(labels=labels)
    except Exception:  # metrics disabled (--allow-metrics=false): count nothing
        return None


def _error(message, code):
    # TritonError codes arrived in Triton 23.10; older stubs only take the message.
    code = getattr(pb_utils.TritonError, code, None)
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)
