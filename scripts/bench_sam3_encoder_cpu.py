"""In-process encoder latency of the small random-init SAM3 tracker on CPU: onnxruntime on the
exported encoder, unfused and with ``fuse_attention`` (our SDPA -> MultiHeadAttention
rewrite), against torch's ``Sam3TrackerModel.get_image_embeddings`` (what the served encoder
computes), all in one process with the same intra-op thread count. The three are timed in
interleaved rounds so that load from other processes spreads over all of them; the report
gives p50/min per path and each ORT graph's max abs difference from torch.

Usage: python scripts/bench_sam3_encoder_cpu.py OUT_DIR [--threads 2] [--runs 7]
"""

import argparse
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from transformers import Sam3TrackerModel

from triton_sam.export import ExportOptions, export_model, sam3
from triton_sam.export.optimize import fuse_attention
from triton_sam.models import get_model

parser = argparse.ArgumentParser()
parser.add_argument("out", type=Path)
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--runs", type=int, default=7)
args = parser.parse_args()

spec = get_model("sam3_tracker")
ckpt = args.out / "ckpt"
if not ckpt.exists():
    sam3.save_random_checkpoint(spec, ckpt, seed=1, config=sam3.small_config())
plain = export_model(spec, ckpt, args.out / "onnx", ExportOptions(verify=False)).encoder
fused = args.out / "fused" / "encoder.onnx"
fused.parent.mkdir(parents=True, exist_ok=True)
shutil.copy(plain, fused)
print("fused:", fuse_attention(fused, "sam3"))

torch.set_num_threads(args.threads)
model = Sam3TrackerModel.from_pretrained(ckpt).eval()
options = ort.SessionOptions()
options.intra_op_num_threads = args.threads
options.inter_op_num_threads = 1
sessions = {
    name: ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for name, path in (("ort fp32", plain), ("ort fused", fused))
}
pixels = np.random.default_rng(0).standard_normal((1, 3, 1008, 1008)).astype(np.float32)


def run_torch() -> list[np.ndarray]:
    with torch.inference_mode():
        return [t.numpy() for t in model.get_image_embeddings(torch.from_numpy(pixels))]


runs = {"torch": run_torch}
for name, session in sessions.items():
    runs[name] = lambda s=session: s.run(None, {"pixel_values": pixels})

outputs = {name: fn() for name, fn in runs.items()}  # warm-up (and the parity outputs)
for fn in runs.values():
    fn()
times: dict[str, list[float]] = {name: [] for name in runs}
for _ in range(args.runs):
    for name, fn in runs.items():
        t0 = time.perf_counter()
        fn()
        times[name].append(time.perf_counter() - t0)

base = statistics.median(times["torch"])
print(f"threads={args.threads} runs={args.runs} (interleaved, after 2 warm-up runs each)")
for name, ts in times.items():
    p50 = statistics.median(ts)
    diff = ""
    if name != "torch":
        pairs = zip(outputs[name], outputs["torch"], strict=True)
        err = max(float(np.abs(a - b).max()) for a, b in pairs)
        diff = f"  max|diff| vs torch {err:.2e}"
    line = f"{name:10s} p50 {1000 * p50:7.1f} ms  min {1000 * min(ts):7.1f} ms"
    print(f"{line}  {p50 / base:.2f}x torch{diff}")
