"""The backend connected to a REAL Label Studio (1.23.x, its own venv, SQLite in a tmp folder).

Label Studio needs numpy 2, so it cannot live in the project's venv: ``make label-studio``
installs the hash-locked ``requirements/lock-label-studio.txt`` into ``.venv/tools/label-studio``
(or point ``$TRITON_SAM_LABEL_STUDIO_VENV`` at another venv with ``label-studio`` in it). The
test goes the way a user does, through Label Studio's API:

1. Label Studio starts with a user whose legacy API token is known (``--user-token``),
   ``ML_BLOCK_LOCAL_IP=false`` and ``USE_DEFAULT_BANNED_SUBNETS=false`` (its defaults refuse
   an ML backend on a localhost address);
2. a project with BrushLabels + KeyPointLabels, a task made by uploading a PNG;
3. the backend connected with ``POST /api/ml`` (Label Studio calls ``/health`` and ``/setup``
   with Basic auth and refuses a backend that fails them), interactive;
4. a click through ``POST /api/ml/<id>/interactive-annotating``: Label Studio fetches nothing
   itself, it forwards the context to ``/predict``; the brush RLE it hands back is decoded by
   ``label_studio_sdk.converter.brush.decode_rle`` (run in Label Studio's venv) and equals the
   Python client's mask pixel for pixel;
5. Label Studio's "retrieve predictions" action stores one prediction for the task, with the
   backend's model version.

With ``TRITON_SAM_SCREENSHOTS=1`` the labeling page with the mask is saved to
docs/images/label-studio.png (headless chromium).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import requests
from gateway_support import running_gateway
from label_studio_support import BRUSH_CONFIG, keypoint_region, png

from triton_sam import SAM2TritonClient
from triton_sam.gateway import create_app
from triton_sam.label_studio import (
    FetchPolicy,
    LabelStudioOptions,
    TritonOptions,
    label_studio_routes,
)
from triton_sam.tools.sample import sample_image

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("TRITON_SAM_LABEL_STUDIO_VENV", ROOT / ".venv/tools/label-studio"))
LABEL_STUDIO = VENV / "bin" / "label-studio"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.triton,
    pytest.mark.label_studio,
    pytest.mark.timeout(600),
]


@pytest.fixture(scope="module", autouse=True)
def _label_studio_installed() -> None:
    # `make test` installs it (.ci/run too); a missing Label Studio is a failure, not a skip,
    # so a run that lacks it never reads as green for the backend.
    if not LABEL_STUDIO.exists():
        pytest.fail(f"no Label Studio at {VENV}: `make label-studio` installs it")


USER, PASSWORD = "annotator@example.com", "a-long-test-password"
LS_TOKEN = "9f8e7d6c5b4a39281706f5e4d3c2b1a098765432"  # Label Studio's legacy API token
BACKEND_TOKEN = "c3" * 32  # the backend's token, sent by Label Studio as Basic password
H, W = 256, 320
RGB = sample_image(W, H, seed=11)
CLICK = (170.0, 130.0)
START_TIMEOUT_S = 180  # a bound on waiting for Label Studio's migrations, not a measurement


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def label_studio(tmp_path_factory):
    """A running Label Studio; yields its URL and the seconds it took to answer /health."""
    data = tmp_path_factory.mktemp("label-studio")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "LABEL_STUDIO_BASE_DATA_DIR": str(data),
        "ML_BLOCK_LOCAL_IP": "false",
        # Connecting a backend also registers a webhook to <url>/webhook, which 1.23.x checks
        # against its banned subnets (127.0.0.0/8 among them) whatever ML_BLOCK_LOCAL_IP says,
        # failing the connection with 403: a backend on localhost needs this too.
        "USE_DEFAULT_BANNED_SUBNETS": "false",
        "PYTHONPATH": "",
    }
    command = [
        str(LABEL_STUDIO), "start", "--no-browser", "--port", str(port), "--host", url,
        "--internal-host", "127.0.0.1", "--username", USER, "--password", PASSWORD,
        "--user-token", LS_TOKEN, "--enable-legacy-api-token", "--agree-fix-sqlite",
    ]  # fmt: skip
    log = (data / "label-studio.log").open("wb")
    t0 = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        while True:
            assert process.poll() is None, (data / "label-studio.log").read_text()[-3000:]
            assert time.monotonic() - t0 < START_TIMEOUT_S, "Label Studio did not start"
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        yield url, time.monotonic() - t0
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.fixture(scope="module")
def backend(sam2_tiny_server, label_studio):
    url, _ = label_studio
    options = LabelStudioOptions(
        fetch=FetchPolicy(url, api_key=LS_TOKEN),
        triton=TritonOptions(url=sam2_tiny_server.grpc_url, protocol="grpc", model_type="sam2"),
        tokens={BACKEND_TOKEN: "annotators"},
    )
    routes, close = label_studio_routes(options)
    with running_gateway(create_app(extra_routes=routes, on_close=[close])) as gateway:
        yield f"{gateway}/label-studio"


def _api(url: str) -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = f"Token {LS_TOKEN}"
    session.base_url = url  # type: ignore[attr-defined]
    return session


def _decode_in_label_studio(rle: list[int], path: Path) -> np.ndarray:
    """label_studio_sdk's decoder, in Label Studio's own venv (numpy 2 there)."""
    source = path.with_suffix(".json")
    source.write_text(json.dumps({"rle": rle, "h": H, "w": W}))
    script = (
        "import json, sys, numpy as np\n"
        "from label_studio_sdk.converter.brush import decode_rle\n"
        "d = json.load(open(sys.argv[1]))\n"
        "mask = decode_rle(d['rle']).reshape(d['h'], d['w'], 4)[:, :, 3]\n"
        "open(sys.argv[2], 'wb').write(np.ascontiguousarray(mask, dtype=np.uint8).tobytes())\n"
    )
    python = VENV / "bin" / "python"
    subprocess.run([str(python), "-c", script, str(source), str(path)], check=True, timeout=120)
    return np.frombuffer(path.read_bytes(), dtype=np.uint8).reshape(H, W)


def test_label_studio_connects_the_backend_and_draws_the_clients_mask(
    label_studio, backend, sam2_tiny_server, tmp_path
):
    url, started_s = label_studio
    t0 = time.monotonic()
    api = _api(url)
    project = api.post(
        f"{url}/api/projects", json={"title": "cells", "label_config": BRUSH_CONFIG}, timeout=60
    )
    assert project.status_code == 201, project.text
    project_id = project.json()["id"]
    files = {"file": ("cells.png", png(RGB), "image/png")}
    upload = api.post(f"{url}/api/projects/{project_id}/import", files=files, timeout=60)
    assert upload.status_code == 201, upload.text
    tasks = api.get(f"{url}/api/tasks", params={"project": project_id}, timeout=60).json()
    [task] = tasks["tasks"]
    assert task["data"]["image"].startswith("/data/upload/")  # relative: resolved by us

    connect = api.post(
        f"{url}/api/ml",
        json={
            "project": project_id,
            "url": backend,
            "title": "triton-sam",
            "is_interactive": True,
            "auth_method": "BASIC_AUTH",
            "basic_auth_user": "label-studio",
            "basic_auth_pass": BACKEND_TOKEN,
        },
        timeout=60,
    )
    assert connect.status_code == 201, connect.text
    ml = connect.json()
    assert ml["state"] == "CO" and ml["model_version"] == "triton-sam-sam2", ml

    context = {"result": [keypoint_region(*CLICK, W, H)]}
    click = api.post(
        f"{url}/api/ml/{ml['id']}/interactive-annotating",
        json={"task": task["id"], "context": context},
        timeout=300,
    )
    assert click.status_code == 200 and "errors" not in click.json(), click.text
    [region] = click.json()["data"]["result"]
    assert region["type"] == "brushlabels" and region["value"]["brushlabels"] == ["Cell"]
    mask = _decode_in_label_studio(region["value"]["rle"], tmp_path / "mask.bin")
    with SAM2TritonClient(sam2_tiny_server.http_url, model_type="sam2") as client:
        client.set_image(RGB)
        masks, scores = client.predict(
            point_coords=[list(CLICK)], point_labels=[1], multimask_output=True
        )
    expected = masks[0, int(np.argmax(scores[0]))] > 0
    np.testing.assert_array_equal(mask == 255, expected)
    assert set(np.unique(mask)) <= {0, 255}

    action = api.post(
        f"{url}/api/dm/actions",
        params={"id": "retrieve_tasks_predictions", "project": project_id},
        json={"selectedItems": {"all": True, "excluded": []}},
        timeout=300,
    )
    assert action.status_code == 200, action.text
    stored = api.get(f"{url}/api/predictions", params={"task": task["id"]}, timeout=60).json()
    assert [(p["model_version"], p["result"]) for p in stored] == [("triton-sam-sam2", [])]
    print(
        f"\nLabel Studio started in {started_s:.1f} s; the test took {time.monotonic() - t0:.1f} s"
    )
    if os.environ.get("TRITON_SAM_SCREENSHOTS") == "1":
        from label_studio_screenshot import save_labeling_page

        save_labeling_page(url, LS_TOKEN, USER, PASSWORD, project_id, task["id"], region, ROOT)
