"""Latency of a small random-init SAM3 tracker (the real tensor contract, a 2-layer ViT):
in-process onnxruntime vs the embedded Triton over HTTP and gRPC, with the same code as
`triton-sam bench users`. The full-size model is too heavy to export on a CPU-only machine.

Usage: python scripts/bench_sam3_small.py OUT_DIR
"""

import sys
import time
from pathlib import Path

from triton_sam.bench.harness import embedded, protocol_urls, setup_repository
from triton_sam.bench.latency import run_latency_benchmark, write_report
from triton_sam.export import sam3
from triton_sam.models import get_model
from triton_sam.tools.sample import sample_image

root = Path(sys.argv[1])
spec = get_model("sam3_tracker")
ckpt = sam3.save_random_checkpoint(spec, root / "ckpt", seed=1, config=sam3.small_config())
t0 = time.perf_counter()
# production configs, served as their CPU twins on Triton's onnxruntime backend
served = setup_repository(spec, root / "repo", checkpoint=ckpt)
print(f"build_repository: {time.perf_counter() - t0:.1f} s")
for p in sorted((root / "repo").glob("*/1/*")):
    print(f"{p.relative_to(root / 'repo')}: {p.stat().st_size / 2**20:.2f} MiB")
with embedded(served) as server:
    report = run_latency_benchmark(
        served,
        protocol_urls(server),
        spec.family,
        sample_image(),
        concurrency=[1, 4],
        n_encode=3,
        n_decode=20,
        model_name="sam3_tracker (small)",
    )
paths = write_report(report, root / "report")
print(paths["md"].read_text())
