"""The Label Studio backend over real HTTP, against the shared SAM2.1-tiny server.

Requests are Label Studio's own, replayed (tests/label_studio_support.py cites the source files
they are written from): ``/health``, ``/setup`` with Basic auth, ``/predict`` with a smart
keypoint and with a smart rectangle, a plain ``/predict``, ``/webhook``. Images come from a
stand-in for Label Studio's file and task API (``FakeLabelStudio``) behind the API key.

Encodes (the expensive part on CPU): the reference client's 1, tenant A's 1 (its second click
and its polygon reuse it), tenant B's 1, the precompute's 2 (three tasks, two images).
"""

from __future__ import annotations

import numpy as np
import pytest
import requests
from gateway_support import running_gateway
from label_studio_support import (
    API_KEY,
    BRUSH_CONFIG,
    POLYGON_CONFIG,
    FakeLabelStudio,
    basic,
    keypoint_region,
    png,
    predict_body,
    rectangle_region,
    setup_body,
    task,
)
from scipy import ndimage

from triton_sam import SAM2TritonClient
from triton_sam.bench.counters import read_counters, session_encoder
from triton_sam.errors import ImageFetchError
from triton_sam.gateway import create_app
from triton_sam.label_studio import (
    Fetcher,
    FetchPolicy,
    LabelStudioOptions,
    Segmenter,
    TritonOptions,
    label_studio_routes,
)
from triton_sam.label_studio.precompute import precompute_project
from triton_sam.label_studio.rle import decode_mask
from triton_sam.tools.sample import sample_image

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(600)]

H, W = 256, 320
RGB = sample_image(W, H, seed=3)
OTHER = sample_image(W, H, seed=4)
CLICK = (150.0, 120.0)
BOX = (60.0, 40.0, 250.0, 200.0)
TOKEN_A, TOKEN_B = "a1" * 32, "b2" * 32


@pytest.fixture(scope="module")
def label_studio():
    images = {"/data/upload/1/cells.png": png(RGB), "/data/upload/1/other.png": png(OTHER)}
    images["/data/upload/1/copy.png"] = images["/data/upload/1/other.png"]
    with FakeLabelStudio(images) as site:
        yield site


@pytest.fixture(scope="module")
def backend(sam2_tiny_server, label_studio):
    options = LabelStudioOptions(
        fetch=FetchPolicy(label_studio.url, api_key=API_KEY),
        triton=TritonOptions(url=sam2_tiny_server.grpc_url, protocol="grpc", model_type="sam2"),
        tokens={TOKEN_A: "lab-a", TOKEN_B: "lab-b"},
    )
    routes, close = label_studio_routes(options)
    with running_gateway(create_app(extra_routes=routes, on_close=[close])) as url:
        yield f"{url}/label-studio", options


@pytest.fixture(scope="module")
def encoder(sam2_tiny_server):
    with SAM2TritonClient(sam2_tiny_server.http_url, model_type="sam2") as client:
        session = client.session_model
    return session_encoder(sam2_tiny_server.http_url, session) or "sam2_encoder"


def encodes(server, encoder: str) -> int:
    return read_counters(server.http_url, None, encoder).inference_count


def reference(server, point=None, box=None) -> np.ndarray:
    """The Python client's mask: SAM's best of three for a lone click, else the one mask."""
    with SAM2TritonClient(server.http_url, model_type="sam2") as client:
        client.set_image(RGB)
        multimask = box is None
        masks, scores = client.predict(
            point_coords=None if point is None else [list(point)],
            point_labels=None if point is None else [1],
            box=None if box is None else list(box),
            multimask_output=multimask,
        )
    return masks[0, int(np.argmax(scores[0]))] > 0


def test_health_is_open_and_setup_needs_a_token(backend):
    url, options = backend
    health = requests.get(f"{url}/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "UP"
    refused = requests.post(f"{url}/setup", json=setup_body(BRUSH_CONFIG), timeout=10)
    assert refused.status_code == 401 and refused.json()["field"] == "authorization"
    assert refused.headers["WWW-Authenticate"].startswith("Basic")
    setup = requests.post(
        f"{url}/setup", json=setup_body(BRUSH_CONFIG), headers=basic("ls", TOKEN_A), timeout=10
    )
    assert setup.status_code == 200 and setup.json() == {"model_version": "triton-sam-sam2"}


def test_setup_refuses_a_config_without_prompts_naming_the_field(backend):
    url, _ = backend
    config = '<View><Image name="i" value="$image"/><BrushLabels name="b" toName="i"/></View>'
    answer = requests.post(
        f"{url}/setup", json=setup_body(config), headers=basic("ls", TOKEN_A), timeout=10
    )
    assert answer.status_code == 400 and answer.json()["field"] == "schema"
    assert "KeyPointLabels" in answer.json()["message"]


def test_a_click_answers_the_python_clients_mask_pixel_for_pixel_and_tenants_stay_apart(
    backend, label_studio, sam2_tiny_server, encoder
):
    url, _ = backend
    expected = reference(sam2_tiny_server, point=CLICK)
    body = predict_body(
        task(1, "/data/upload/1/cells.png"),
        BRUSH_CONFIG,
        {"result": [keypoint_region(*CLICK, W, H)]},
    )
    before = encodes(sam2_tiny_server, encoder)
    gets = label_studio.image_gets.get("/data/upload/1/cells.png", 0)
    answer = requests.post(f"{url}/predict", json=body, headers=basic("ls", TOKEN_A), timeout=300)
    assert answer.status_code == 200, answer.text
    [prediction] = answer.json()["results"]
    [region] = prediction["result"]
    assert prediction["model_version"] == "triton-sam-sam2"
    assert (region["type"], region["from_name"], region["to_name"]) == (
        "brushlabels",
        "tag",
        "image",
    )
    assert (region["original_width"], region["original_height"]) == (W, H)
    assert region["value"]["brushlabels"] == ["Cell"]
    np.testing.assert_array_equal(decode_mask(region["value"]["rle"], H, W), expected)
    assert encodes(sam2_tiny_server, encoder) == before + 1  # tenant A's first sight of it
    again = requests.post(f"{url}/predict", json=body, headers=basic("ls", TOKEN_A), timeout=300)
    assert again.json()["results"][0]["result"][0]["value"]["rle"] == region["value"]["rle"]
    assert encodes(sam2_tiny_server, encoder) == before + 1  # from tenant A's cache
    # the second click reused the image the first fetched from Label Studio
    assert label_studio.image_gets["/data/upload/1/cells.png"] == gets + 1
    other = requests.post(
        f"{url}/predict", json=body, headers={"Authorization": f"Bearer {TOKEN_B}"}, timeout=300
    )
    assert other.json()["results"][0]["result"][0]["value"]["rle"] == region["value"]["rle"]
    assert encodes(sam2_tiny_server, encoder) == before + 2  # tenant B cannot use A's cache
    assert label_studio.image_gets["/data/upload/1/cells.png"] == gets + 2  # nor its fetch


def test_a_box_answers_a_polygon_when_the_config_asks_for_one(backend, sam2_tiny_server):
    url, _ = backend
    expected = reference(sam2_tiny_server, box=BOX)
    body = predict_body(
        task(1, "/data/upload/1/cells.png"),
        POLYGON_CONFIG,
        {"result": [rectangle_region(BOX, W, H)]},
    )
    answer = requests.post(f"{url}/predict", json=body, headers=basic("ls", TOKEN_A), timeout=300)
    assert answer.status_code == 200, answer.text
    [region] = answer.json()["results"][0]["result"]
    assert region["type"] == "polygonlabels" and region["value"]["closed"] is True
    points = np.asarray(region["value"]["points"]) * (W / 100, H / 100)
    # The polygon is the outline of the client's mask's largest 4-connected region (by the
    # area it encloses), holes filled (a polygon has none; the background is 8-connected, so
    # a gap between diagonal pixels is no hole): filling it gives those pixels exactly.
    regions, _ = ndimage.label(expected)
    largest, best = np.zeros_like(expected), -1
    for index, box in enumerate(ndimage.find_objects(regions), start=1):
        # each region filled within its bounding box, padded so outside stays outside
        part = np.pad(regions[box] == index, 1)
        part = ndimage.binary_fill_holes(part, structure=np.ones((3, 3)))[1:-1, 1:-1]
        if part.sum() > best:
            best = part.sum()
            largest[:] = False
            largest[box] = part
    np.testing.assert_array_equal(filled(points, (H, W)), largest)


def filled(vertices: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Pixels whose centre lies inside the polygon (even-odd rule, pixel-corner vertices):
    a scanline per row, over every edge at once."""
    x0, y0 = vertices[:, 0], vertices[:, 1]
    x1, y1 = np.roll(x0, -1), np.roll(y0, -1)
    inside = np.zeros(shape, bool)
    centres = np.arange(shape[1]) + 0.5
    for row in range(shape[0]):
        y = row + 0.5
        crossing = (y0 > y) != (y1 > y)
        xs = x0[crossing] + (y - y0[crossing]) * (x1 - x0)[crossing] / (y1 - y0)[crossing]
        inside[row] = (np.sum(centres[:, None] > xs[None, :], axis=1) % 2) == 1
    return inside


def test_a_plain_prediction_is_an_empty_result_per_task_and_webhooks_are_ignored(backend):
    url, _ = backend
    body = predict_body(task(1, "/data/upload/1/cells.png"), BRUSH_CONFIG, None)
    body["tasks"].append(task(2, "/data/upload/1/other.png"))
    answer = requests.post(f"{url}/predict", json=body, headers=basic("ls", TOKEN_A), timeout=30)
    empty = {"result": [], "score": 0.0, "model_version": "triton-sam-sam2"}
    assert answer.status_code == 200 and answer.json() == {"results": [empty, empty]}
    hook = requests.post(
        f"{url}/webhook", json={"action": "ANNOTATION_CREATED"}, headers=basic("ls", TOKEN_A)
    )
    assert hook.status_code == 200 and hook.json()["status"] == "ignored"


def test_an_image_url_outside_label_studio_is_refused_naming_the_task_field(backend):
    url, _ = backend
    body = predict_body(
        task(1, "http://169.254.169.254/latest/meta-data/"),
        BRUSH_CONFIG,
        {"result": [keypoint_region(*CLICK, W, H)]},
    )
    answer = requests.post(f"{url}/predict", json=body, headers=basic("ls", TOKEN_A), timeout=30)
    assert answer.status_code == 400 and answer.json()["field"] == "tasks[0].data.image"


def test_precompute_embeds_each_distinct_image_once(label_studio, sam2_tiny_server, encoder):
    fetcher = Fetcher(FetchPolicy(label_studio.url, api_key=API_KEY))
    segmenter = Segmenter(TritonOptions(url=sam2_tiny_server.grpc_url, model_type="sam2"))
    before = encodes(sam2_tiny_server, encoder)
    done = []
    try:
        report = precompute_project(
            fetcher, segmenter, 1, tenant="lab-precompute", on_task=lambda: done.append(1)
        )
    finally:
        fetcher.close()
    assert (report.tasks, report.embedded, report.failed, len(done)) == (3, 3, [], 3)
    # three tasks, two distinct images: the server's cache encoded each once
    assert encodes(sam2_tiny_server, encoder) == before + 2


def test_the_precompute_command_reports_and_reads_the_key_from_the_environment(
    label_studio, sam2_tiny_server, encoder, monkeypatch
):
    """`triton-sam label-studio precompute` over the same project: the images are in the
    tenant's cache already (the test above), so the server encodes nothing."""
    from typer.testing import CliRunner

    from triton_sam.cli import app

    monkeypatch.setenv("LABEL_STUDIO_API_KEY", API_KEY)
    before = encodes(sam2_tiny_server, encoder)
    args = ["label-studio", "precompute", "--project", "1", "--label-studio-url", label_studio.url]
    args += ["--triton-url", sam2_tiny_server.grpc_url, "--tenant", "lab-precompute"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "3 tasks, 3 images sent to embed" in result.output and API_KEY not in result.output
    assert encodes(sam2_tiny_server, encoder) == before
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", "wrong-key")
    failed = CliRunner().invoke(app, args)
    # the entry point prints a package error's message (triton_sam.cli.main); the runner keeps it
    assert failed.exit_code == 1 and isinstance(failed.exception, ImageFetchError)
    assert str(failed.exception).endswith("/api/projects/1 answered HTTP 401")
    assert str(failed.exception).startswith("project: ") and "wrong-key" not in failed.output
