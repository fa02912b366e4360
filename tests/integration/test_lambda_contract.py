"""The Lambda seed's ``sam2`` JSON contract, with real curl, against the embedded Triton.

What the seed's users send, as its sources do (channel3-ai/try-on-demo @ 1d69734,
``sam2-triton-deploy/``):

- ``scripts/infer_example.sh`` builds the body with ``json.dumps``: inputs ``image_b64`` and
  ``prompt_json``, both ``"datatype": "BYTES", "shape": [1, 1]``, ``"outputs":
  [{"name": "result_json"}]``, POSTed by ``curl -sS -X POST <url>/v2/models/sam2/infer -H
  'Content-Type: application/json' --data "$BODY"``; its defaults are ``"AA=="`` and
  ``{"points":[],"boxes":[]}``;
- ``models/sam2/1/model.py`` reads ``points`` as ``{"x", "y", "label"}`` objects (label
  default 1) and ``boxes`` as one flat ``[x1, y1, x2, y2]``, calls
  ``SAM2ImagePredictor.predict(..., multimask_output=False)`` and answers ``result_json``:
  ``{"model", "ok": true, "message": "sam2 inference", "inputs": {"image_b64_len",
  "prompt"}, "scores": <the one mask's score>, "mask": {"format": "png_base64", "data":
  <8-bit PNG, 0/255>}}``.

Each answer here is compared with the official ``SAM2ImagePredictor`` on the same random-init
SAM2.1-tiny weights and image: its boolean mask (logits > 0) must equal the PNG's on every
pixel whose official logit is farther than ``LOGIT_ATOL`` from 0 (the session path's
logits are within 1e-4 of upstream's, tests/parity/test_sam2_parity.py; a pixel closer to 0
than that may fall either side), and overlap it with IoU >= 0.99; the score within 1e-4.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from PIL import Image
from prompt_matrix import iou

from triton_sam.export.sam2 import build_model
from triton_sam.serving.protocol.tenancy import TENANT_HEADER
from triton_sam.tools.sample import sample_image

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(900)]

IMAGE = sample_image(200, 150, seed=21)  # W x H, non-square
H, W = IMAGE.shape[:2]
LOGIT_ATOL = 1e-4
SCORE_ATOL = 1e-4
MIN_IOU = 0.99
BOX = [30.0, 20.0, 160.0, 120.0]
BOX_2 = [90.0, 60.0, 190.0, 140.0]
# name -> (prompt_json as the client writes it, the official predict calls, one per mask)
CASES = {
    "point_objects": (
        {"points": [{"x": 80, "y": 60, "label": 1}, {"x": 150.5, "y": 100, "label": 0}]},
        [{"point_coords": [[80, 60], [150.5, 100]], "point_labels": [1, 0]}],
    ),
    "seed_flat_box": ({"points": [], "boxes": BOX}, [{"box": BOX}]),
    "box_and_point": (
        {"points": [{"x": 70, "y": 50}], "boxes": BOX},
        [{"box": BOX, "point_coords": [[70, 50]], "point_labels": [1]}],
    ),
    "two_boxes": ({"boxes": [BOX, BOX_2]}, [{"box": BOX}, {"box": BOX_2}]),
    # The seed script's default prompt: the seed's model called predict() without prompts.
    "no_prompt": ({"points": [], "boxes": []}, [{}]),
}


def png_b64(rgb: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def seed_body(image_b64: str, prompt_json: str) -> str:
    """The body ``scripts/infer_example.sh`` of the seed prints (its python heredoc)."""
    return json.dumps(
        {
            "inputs": [
                {"name": "image_b64", "datatype": "BYTES", "shape": [1, 1], "data": [image_b64]},
                {
                    "name": "prompt_json",
                    "datatype": "BYTES",
                    "shape": [1, 1],
                    "data": [prompt_json],
                },
            ],
            "outputs": [{"name": "result_json"}],
        }
    )


def curl(server, body: str, tmp_path: Path, headers: tuple[str, ...] = ()) -> tuple[int, dict]:
    """POST ``body`` with curl as the seed's script does; (HTTP status, parsed JSON)."""
    path = tmp_path / "body.json"
    path.write_text(body)
    command = ["curl", "-sS", "-X", "POST", f"{server.http_url}/v2/models/sam2/infer"]
    command += ["-H", "Content-Type: application/json", "--data", f"@{path}"]
    for header in headers:
        command += ["-H", header]
    command += ["-w", "\n%{http_code}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    text, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(text)


def result_of(answer: dict) -> dict:
    (output,) = answer["outputs"]
    assert output["name"] == "result_json" and output["datatype"] == "BYTES"
    return json.loads(output["data"][0])


def png_mask(data: str) -> np.ndarray:
    image = Image.open(io.BytesIO(base64.b64decode(data)))
    pixels = np.asarray(image)
    assert image.mode == "L" and set(np.unique(pixels)) <= {0, 255}  # the seed's encoding
    return pixels == 255


@pytest.fixture(scope="module")
def upstream(sam2_tiny_spec, sam2_tiny_checkpoint):
    from sam2.sam2_image_predictor import SAM2ImagePredictor

    predictor = SAM2ImagePredictor(build_model(sam2_tiny_spec, sam2_tiny_checkpoint))
    predictor.set_image(IMAGE)
    return predictor


@pytest.mark.parametrize("name", sorted(CASES))
def test_seed_requests_with_curl_give_the_official_predictors_masks(
    sam2_tiny_server, upstream, tmp_path, name
):
    prompt, calls = CASES[name]
    image_b64 = png_b64(IMAGE)
    status, answer = curl(sam2_tiny_server, seed_body(image_b64, json.dumps(prompt)), tmp_path)
    assert status == 200, answer
    result = result_of(answer)
    assert result["ok"] is True and result["model"] == "sam2"
    assert result["message"] == "sam2 inference"
    assert result["inputs"] == {"image_b64_len": len(image_b64), "prompt": prompt}
    assert result["image_size"] == [H, W]
    assert len(result["masks"]) == len(calls)
    assert result["mask"] == {k: result["masks"][0][k] for k in ("format", "data")}
    for entry, call in zip(result["masks"], calls, strict=True):
        kwargs = {k: np.asarray(v) for k, v in call.items()}
        logits, scores, _ = upstream.predict(multimask_output=False, return_logits=True, **kwargs)
        ours, official = png_mask(entry["data"]), logits[0] > 0
        decided = np.abs(logits[0]) > LOGIT_ATOL
        np.testing.assert_array_equal(ours[decided], official[decided])
        assert iou(ours, official) >= MIN_IOU
        assert official.any() and not official.all()  # a mask with an edge to compare
        assert entry["score"] == pytest.approx(float(scores[0]), abs=SCORE_ATOL)
    assert result["scores"] == result["masks"][0]["score"]  # the seed's: one number


@pytest.mark.parametrize(
    ("image_b64", "prompt_json", "field"),
    [
        ("AA==", '{"points":[],"boxes":[]}', "image_b64:"),  # the seed script's defaults
        ("not base64!", '{"points":[],"boxes":[]}', "image_b64:"),
        (None, '{"points": [', "prompt_json:"),
        (None, '{"points": [{"x": NaN, "y": 3}]}', "prompt_json.points[0].x:"),
        (None, json.dumps({"points": [[1, 2]] * 63}), "prompt_json.points:"),
        (None, json.dumps({"points": [{"x": 1, "y": 2, "label": 2}]}), "points[0].label:"),
        (None, json.dumps({"boxes": [160, 20, 30, 120]}), "prompt_json.boxes:"),
        (None, json.dumps({"boxes": [BOX, BOX], "points": [[1, 2]]}), "prompt_json.points:"),
        (None, json.dumps({"points": [], "mask_input": []}), "prompt_json.mask_input:"),
        (None, json.dumps({"boxes": [[0, 0, 20000, 10]]}), "prompt_json.boxes[0]:"),
    ],
    ids=[
        "seed_defaults",
        "bad_base64",
        "bad_json",
        "nan",
        "too_many_points",
        "label",
        "reversed_box",
        "points_with_boxes",
        "unknown_key",
        "box_beyond_bounds",
    ],
)
def test_bad_requests_are_refused_naming_the_field(
    sam2_tiny_server, tmp_path, image_b64, prompt_json, field
):
    body = seed_body(image_b64 or png_b64(IMAGE), prompt_json)
    status, answer = curl(sam2_tiny_server, body, tmp_path)
    assert status == 400, answer
    assert answer["error"].startswith("triton_sam.InvalidInput: ")
    assert field in answer["error"]


def test_the_readmes_curl_command_runs(sam2_tiny_server, tmp_path):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("## Lambda `sam2` JSON contract", 1)[1].split("```bash\n", 1)[1]
    script = block.split("```", 1)[0].replace("localhost:8000", sam2_tiny_server.http_address)
    Image.fromarray(IMAGE).save(tmp_path / "photo.jpg")
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result = result_of(json.loads(done.stdout))
    assert result["ok"] is True and result["image_size"] == [H, W]
    assert png_mask(result["mask"]["data"]).shape == (H, W)


def test_the_tenant_header_travels_to_the_session_model(sam2_tiny_server, tmp_path):
    """The model keeps no state; the session model's cache is per tenant. An image sent
    through ``sam2`` as team-a is cached for team-a only: an embed of it by team-a is a
    hit (``encoded`` 0), by team-b and by the default tenant a new encode (1)."""
    picture = sample_image(96, 80, seed=22)
    body = seed_body(png_b64(picture), json.dumps({"points": [{"x": 40, "y": 30}]}))
    status, answer = curl(sam2_tiny_server, body, tmp_path, (f"{TENANT_HEADER}: team-a",))
    assert status == 200, answer
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, format="PNG")
    raw = httpclient.InferenceServerClient(sam2_tiny_server.http_address)
    try:
        encoded = {}
        for tenant in ("team-a", "team-b", None):
            data = httpclient.InferInput("image_bytes", [1, 1], "BYTES")
            data.set_data_from_numpy(np.array([[buffer.getvalue()]], dtype=np.object_))
            headers = {TENANT_HEADER: tenant} if tenant else None
            out = raw.infer(
                "sam2_session",
                [data],
                outputs=[httpclient.InferRequestedOutput("encoded")],
                headers=headers,
            )
            encoded[tenant] = int(out.as_numpy("encoded").reshape(-1)[0])
    finally:
        raw.close()
    assert encoded == {"team-a": 0, "team-b": 1, None: 1}
