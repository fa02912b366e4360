"""Any language: prompts in original pixels, finished masks out, and real curl.

Against the embedded Triton, SAM2.1-tiny. Raw ``tritonclient`` requests with clicks and a box
in original pixels get the masks our Python client computes (it upsamples on its side), as
COCO RLE, 1-bit PNG and bit-packed, with each mask's box and score: equal to the pixel.
``scripts/infer_example.sh`` (bash + curl: file bytes in via the binary-data extension, a
JSON click, RLE out) gives the same mask.
"""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import np_to_triton_dtype

from triton_sam.client import SAM2TritonClient
from triton_sam.serving import masks as mask_codec
from triton_sam.tools.sample import sample_image

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(900)]

SESSION = "sam2_session"
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
IMAGE = sample_image(200, 150, seed=11)
FINISHED = ("masks_rle", "masks_png", "masks_bits", "mask_boxes", "mask_scores", "image_size")
PROMPTS = {
    "click": {"point_coords": [[80, 60]], "point_labels": [1]},
    "clicks": {"point_coords": [[80, 60], [150, 100]], "point_labels": [1, 0]},
    "box": {"box": [30, 20, 160, 120]},
    "box_and_click": {"point_coords": [[80, 60]], "point_labels": [1], "box": [30, 20, 160, 120]},
}


def infer(client, inputs: dict[str, np.ndarray], outputs) -> dict[str, np.ndarray]:
    tensors = []
    for name, value in inputs.items():
        tensor = httpclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value, binary_data=True)
        tensors.append(tensor)
    wanted = [httpclient.InferRequestedOutput(n, binary_data=True) for n in outputs]
    result = client.infer(SESSION, tensors, outputs=wanted)
    return {n: result.as_numpy(n) for n in outputs}


def png_file(tmp_path: Path) -> Path:
    path = tmp_path / "image.png"
    Image.fromarray(IMAGE).save(path)
    return path


def pixel_inputs(prompt: dict, multimask: bool) -> dict[str, np.ndarray]:
    inputs = {"multimask_output": np.array([[int(multimask)]], np.int32)}
    if "point_coords" in prompt:
        inputs["points"] = np.array(prompt["point_coords"], np.float32)[None]
        inputs["labels"] = np.array(prompt["point_labels"], np.int32)[None]
    if "box" in prompt:
        inputs["box"] = np.array(prompt["box"], np.float32)[None]
    return inputs


def box_of(mask: np.ndarray) -> list[float]:
    ys, xs = np.nonzero(mask)
    return [xs.min(), ys.min(), xs.max(), ys.max()] if len(xs) else [0, 0, 0, 0]


@pytest.mark.parametrize("multimask", [False, True])
@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_pixel_prompts_give_the_python_clients_masks_in_every_encoding(
    sam2_tiny_server, tmp_path, name, multimask
):
    prompt = PROMPTS[name]
    with SAM2TritonClient(sam2_tiny_server.http_url) as ours:
        ours.set_image(IMAGE)
        expected = ours.predict_full(**prompt, multimask_output=multimask)
    truth = expected.masks[0] > 0  # [M, H, W], upsampled by the client
    raw = httpclient.InferenceServerClient(sam2_tiny_server.http_address)
    try:
        data = np.array([[png_file(tmp_path).read_bytes()]], dtype=np.object_)
        image_id = infer(raw, {"image_bytes": data}, ("image_id",))["image_id"].reshape(-1)[0]
        inputs = {"image_id": np.array([[image_id]], np.object_), **pixel_inputs(prompt, multimask)}
        out = infer(raw, inputs, FINISHED)
    finally:
        raw.close()
    h, w = IMAGE.shape[:2]
    assert out["image_size"].tolist() == [[h, w]]
    np.testing.assert_array_equal(out["mask_scores"][0], expected.iou_predictions[0])
    assert len(out["masks_rle"][0]) == truth.shape[0] == (3 if multimask else 1)
    for i, mask in enumerate(truth):
        np.testing.assert_array_equal(mask_codec.decode_rle(out["masks_rle"][0][i], (h, w)), mask)
        png = np.asarray(Image.open(io.BytesIO(out["masks_png"][0][i])).convert("L")) > 0
        np.testing.assert_array_equal(png, mask)
        bits = np.frombuffer(out["masks_bits"][0][i], np.uint8)
        np.testing.assert_array_equal(np.unpackbits(bits, count=h * w).reshape(h, w), mask)
        assert out["mask_boxes"][0][i].tolist() == box_of(mask)


def test_curl_infer_example_matches_the_python_client(sam2_tiny_server, tmp_path):
    path = png_file(tmp_path)
    url = sam2_tiny_server.http_url
    done = subprocess.run(
        ["bash", str(SCRIPTS / "infer_example.sh"), str(path), "80", "60", url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    outputs = {o["name"]: o for o in json.loads(done.stdout)["outputs"]}
    h, w = outputs["image_size"]["data"]
    mask = mask_codec.decode_rle(outputs["masks_rle"]["data"][0], (h, w))
    with SAM2TritonClient(sam2_tiny_server.http_url) as ours:
        ours.set_image(path)
        expected = ours.predict_full(point_coords=[[80, 60]], point_labels=[1])
    np.testing.assert_array_equal(mask, expected.masks[0, 0] > 0)
    assert outputs["mask_scores"]["data"] == pytest.approx(
        expected.iou_predictions[0].tolist(),
        abs=0,
        rel=1e-6,  # JSON prints float32 digits
    )
    assert (SCRIPTS / "health_check.sh").is_file()
    healthy = subprocess.run(
        ["bash", str(SCRIPTS / "health_check.sh"), sam2_tiny_server.http_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert healthy.returncode == 0, healthy.stderr


def test_the_documented_curl_example_runs(sam2_tiny_server, tmp_path):
    readme = (SCRIPTS.parent / "docs" / "clients.md").read_text()
    block = readme.split("With bash and curl only", 1)[1].split("```bash\n", 1)[1]
    script = block.split("```", 1)[0]
    script = script.replace("URL=localhost:8000", f"URL={sam2_tiny_server.http_address}")
    script = script.replace("IMG=photo.jpg", f"IMG={png_file(tmp_path)}")
    script = script.replace('"data":[320,240]', '"data":[80,60]')
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    outputs = {o["name"]: o for o in json.loads(done.stdout)["outputs"]}
    h, w = outputs["image_size"]["data"]
    mask = mask_codec.decode_rle(outputs["masks_rle"]["data"][0], (h, w))
    with SAM2TritonClient(sam2_tiny_server.http_url) as ours:
        ours.set_image(IMAGE)
        expected = ours.predict_full(point_coords=[[80, 60]], point_labels=[1])
    np.testing.assert_array_equal(mask, expected.masks[0, 0] > 0)
