"""The SAM_service gateway's overhead over our async client, on the random-init SAM1 ViT-B.

One embedded Triton, one run: ``TritonBackend`` (the gateway's own Triton side, called
in-process) against the same calls through the gateway over HTTP as old Paintera sends them
(``/embedded_model`` plain and ``encoding=compress``; ``/from_model`` for a click), timed in
interleaved rounds so load from other processes spreads over both. Then the gateway's
embedding against ``SamPredictor.get_image_embedding()`` on the same weights and decoded JPEG.
The client runs in the gateway's process (its multipart encoding counts in the gateway's time).

Usage: python scripts/bench_gateway.py OUT_DIR [--encodes 5] [--clicks 30]
(OUT_DIR keeps the checkpoint and the export: a second run reuses them.)
"""

import argparse
import asyncio
import base64
import io
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import requests
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from gateway_support import paintera_embed, running_gateway  # noqa: E402

from triton_sam.bench.harness import embedded, setup_repository  # noqa: E402
from triton_sam.export import ExportOptions, save_random_checkpoint  # noqa: E402
from triton_sam.gateway import BackendOptions, GatewayOptions, create_app  # noqa: E402
from triton_sam.gateway.backend import TritonBackend  # noqa: E402
from triton_sam.models import get_model  # noqa: E402
from triton_sam.setup.pipeline import obtain_checkpoint  # noqa: E402
from triton_sam.tools.sample import sample_image  # noqa: E402

CLICK, HW = (210, 190), (480, 640)


def served_repository(out: Path) -> tuple[Path, Path]:
    spec = get_model("sam1_vit_b")
    checkpoint = out / spec.checkpoint.filename
    if not checkpoint.exists():
        save_random_checkpoint(spec, checkpoint, seed=1)
    (out / "none").mkdir(exist_ok=True)
    ckpt = obtain_checkpoint(
        spec, checkpoint=checkpoint, checkpoints_dir=out / "none", download=False
    )
    repo = setup_repository(
        spec,
        out / "model_repository",
        checkpoint=ckpt,
        reuse_model=spec.family.encoder_model,  # a second run reuses the export
        export_options=ExportOptions(),
    )
    return repo, checkpoint


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--encodes", type=int, default=5)
    parser.add_argument("--clicks", type=int, default=30)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    repository, checkpoint = served_repository(args.out)
    buffer = io.BytesIO()
    Image.fromarray(sample_image(HW[1], HW[0])).save(buffer, "JPEG", quality=75)
    jpeg = buffer.getvalue()
    rgb = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def direct(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    times: dict[str, list[float]] = {}

    def timed(name, call):
        t0 = time.perf_counter()
        out = call()
        times.setdefault(name, []).append((time.perf_counter() - t0) * 1e3)
        return out

    with embedded(repository) as server:
        options = BackendOptions(url=server.grpc_url, protocol="grpc")
        backend = TritonBackend(options)
        embedding = direct(backend.embed(rgb, tenant="", request_id="warm-up"))
        with running_gateway(create_app(GatewayOptions(backend=options, workers=1))) as url:
            _ = paintera_embed(url, jpeg, None).content  # warm-up
            for _ in range(args.encodes):
                timed(
                    "encode, direct", lambda: direct(backend.embed(rgb, tenant="", request_id=""))
                )
                text = timed(
                    "encode, /embedded_model",
                    lambda: paintera_embed(url, jpeg, None, compress=False).content,
                )
                timed(
                    "encode, /embedded_model?encoding=compress",
                    lambda: paintera_embed(url, jpeg, None).content,
                )
            model = base64.b64encode(embedding.astype("<f4").tobytes())
            fields = {"x": CLICK[0], "y": CLICK[1], "img_x": HW[1], "img_y": HW[0]}
            files = {k: (None, str(v)) for k, v in fields.items()} | {"model": ("m", model)}
            session = requests.Session()
            session.post(f"{url}/from_model", files=files)
            for _ in range(args.clicks):
                timed(
                    "click, direct",
                    lambda: direct(
                        backend.mask_from_embedding(embedding, CLICK, HW, tenant="", request_id="")
                    ),
                )
                timed("click, /from_model", lambda: session.post(f"{url}/from_model", files=files))
        direct(backend.aclose())
    for name, values in times.items():
        print(f"{name:42s} median {statistics.median(values):8.1f} ms  min {min(values):8.1f} ms")
    ours = np.frombuffer(base64.b64decode(text), dtype="<f4").reshape(1, 256, 64, 64)
    from segment_anything import SamPredictor

    from triton_sam.export.sam1 import build_model

    predictor = SamPredictor(build_model(get_model("sam1_vit_b"), checkpoint))
    predictor.set_image(rgb)
    diff = np.abs(ours - predictor.get_image_embedding().numpy())
    print(f"embedding vs SamPredictor: max abs {diff.max():.3g}, mean abs {diff.mean():.3g}")


if __name__ == "__main__":
    main()
