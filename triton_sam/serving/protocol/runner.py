"""The python-target runner (``serving/runner_model.py``): an ONNX graph run by onnxruntime in
Triton's python stub, the fallback for a server without Triton's onnxruntime backend.

Its tensors are the graph's own (from the config); what the runner and the config renderer
share is the parameters below and the kind.
"""

from . import KIND_PARAM, KIND_RUNNER

KIND = KIND_RUNNER
PARAM_KIND = KIND_PARAM
PARAM_ONNX_FILE = "onnx_file"  # the graph's file in the version directory
PARAM_INTRA_OP_THREADS = "intra_op_threads"  # onnxruntime intra-op threads, 0 = its default
# How much the stub lowers its own CPU priority (Linux nice increment, 0..19), before
# onnxruntime starts its threads, which inherit it. A background graph (the encoder behind a
# CPU twin's session model) yields the cores to the clicks' decoder whenever both want them,
# and runs at full speed when they do not.
PARAM_NICE = "nice"
# onnxruntime's run option ``memory.enable_memory_arena_shrinkage`` (e.g. "cpu:0"): after each
# run the arena hands the memory of that run's activations back. An encoder's activations are
# many times its weights (SAM1 ViT-B at 1024x1024: ~3.5 GB against 0.4 GB), and an idle CPU
# server would otherwise hold them for good; what it costs is new allocations per run, small
# next to an encode's seconds on a CPU.
PARAM_SHRINK_ARENA = "shrink_arena"
PARAM_KEYS = (PARAM_KIND, PARAM_ONNX_FILE, PARAM_INTRA_OP_THREADS, PARAM_NICE, PARAM_SHRINK_ARENA)
DEFAULT_ONNX_FILE = "model.onnx"
# Custom counter on Triton's metrics endpoint (triton_sam.bench.counters reads it). Triton
# counts a request answered unrun as a successful inference; this says how many were.
SKIPPED_METRIC = "triton_sam_cancelled_requests_skipped"
