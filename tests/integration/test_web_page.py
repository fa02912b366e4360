"""The browser annotator in a real headless Chromium, against the embedded server.

Debian's ``chromium`` and ``chromedriver`` (``make browser-tools``) driven by selenium; the
page is served as ``triton-sam serve --web`` serves it (``triton_sam.web.serve.WebServer``:
the gateway with the page) in front of the embedded Triton serving the production repository
of SAM2.1-tiny (random-init weights, ``tests/conftest.py``). The page opens a PNG through
its file input, gets clicks, a box drag and a storm of 50 mouse moves through WebDriver's
input actions (real pointer events), and exports its labels.

Checked against the Python client (``SAM2TritonClient``) on the same image with the page's
own prompts (read from the page, so sub-pixel positions are the same):

- every mask on screen, read back from the mask canvas pixel for pixel (the layer is drawn
  opaque with each object's colour and made translucent by CSS, so the canvas holds exact
  colours);
- the exported COCO RLE decodes (``triton_sam.serving.masks.decode_rle``) to the same masks,
  and the PNG label image holds them as drawn (later objects over earlier ones);
- the hover storm runs at most ``ceil(T / D) + 2`` decoder executions on the server
  (``triton_sam.bench.stress``'s latest-wins bound; T the storm's length as the page saw it,
  D the Python client's median click round trip in this run), counted by Triton itself
  (``ClickCounters``), not 50;
- a refused image (5000 x 5000 pixels, a file that is not an image) shows the server's
  message on the page, and the page keeps working.

Click-to-mask-on-screen latency (p50/p95) is printed next to the Python client's click
latency; never asserted (2 shared CPU cores).
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import requests
from browser_support import WAIT_S, chromium, error_text, js, open_image, wait_for
from PIL import Image

from triton_sam.bench.counters import ClickCounters, session_decoder, wait_until_quiet
from triton_sam.client import SAM2TritonClient
from triton_sam.serving import masks as mask_codec
from triton_sam.tools.sample import sample_image
from triton_sam.web.serve import WebServer, served_family

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(600)]

SESSION = "sam2_session"
H, W = 240, 320
IMAGE = sample_image(W, H, seed=5)
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "annotator.png"
HOVER_EVENTS = 50


@pytest.fixture(scope="module")
def page_url(sam2_tiny_server, sam2_tiny_repository):
    """The page as `triton-sam serve --web` serves it (its WebServer, any free port)."""
    family = served_family(sam2_tiny_repository)
    server = sam2_tiny_server
    with WebServer(server.http_url, server.grpc_address, port=0, model_type=family) as web:
        yield web.url


@pytest.fixture(scope="module")
def downloads(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(downloads):
    with chromium(downloads) as chrome:
        yield chrome


@pytest.fixture(scope="module")
def image_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("images") / "cells.png"
    Image.fromarray(IMAGE).save(path)
    return path


# -- page helpers ------------------------------------------------------------------------------
def settle(browser) -> None:
    """Wait until every request is answered and its mask painted; the page itself waits (one
    WebDriver call, no polling traffic beside the clicks being timed)."""
    browser.set_script_timeout(WAIT_S)
    browser.execute_async_script("annotator.whenIdle().then(arguments[arguments.length - 1])")


def offset(browser, x: float, y: float) -> tuple[int, int]:
    """WebDriver offsets (from the canvas centre) of image pixel (x, y), at 1:1 scale."""
    rect = js(
        browser,
        "const r = document.getElementById('marks').getBoundingClientRect();"
        "return [r.width, r.height]",
    )
    assert rect == [W, H], f"the canvas is shown at {rect}, expected 1:1"
    return int(round(x - W / 2)), int(round(y - H / 2))


def click(browser, x: float, y: float, *, shift: bool = False) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    marks = browser.find_element("id", "marks")
    actions = ActionChains(browser, duration=0)
    if shift:  # held while the pointer moves there, as a person aiming a negative point does
        actions.key_down(Keys.SHIFT)
    actions.move_to_element_with_offset(marks, *offset(browser, x, y)).click()
    if shift:
        actions.key_up(Keys.SHIFT)
    actions.perform()
    settle(browser)


def drag(browser, start: tuple[float, float], end: tuple[float, float]) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    marks = browser.find_element("id", "marks")
    (x0, y0), (x1, y1) = offset(browser, *start), offset(browser, *end)
    actions = ActionChains(browser, duration=0).move_to_element_with_offset(marks, x0, y0)
    actions.click_and_hold()
    for k in range(1, 6):
        actions.move_to_element_with_offset(marks, x0 + (x1 - x0) * k // 5, y0 + (y1 - y0) * k // 5)
    actions.release().perform()
    settle(browser)


def press(browser, key: str, *, ctrl: bool = False) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    actions = ActionChains(browser)
    if ctrl:
        actions.key_down(Keys.CONTROL).send_keys(key).key_up(Keys.CONTROL)
    else:
        actions.send_keys(key)
    actions.perform()


def screen_pixels(browser) -> np.ndarray:
    """The mask canvas as it is drawn: uint8 [H, W, 4]."""
    data = js(
        browser,
        "const c = document.getElementById('masks');"
        "return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data)",
    )
    return np.asarray(data, np.uint8).reshape(H, W, 4)


def shown_mask(pixels: np.ndarray, colour) -> np.ndarray:
    return (pixels[..., 3] == 255) & (pixels[..., :3] == np.asarray(colour, np.uint8)).all(-1)


def objects(browser) -> list[dict]:
    return js(
        browser,
        "return annotator.state.objects.map(o => ({points: o.points, "
        "box: o.box, colour: o.colour, score: o.score}))",
    )


def python_mask(client, obj: dict, latencies: list[float]) -> np.ndarray:
    """The Python client's mask for an object's prompts, as the page chooses it: three
    masks and the best scored for one point alone, else one mask."""
    points = [p[:2] for p in obj["points"]] or None
    labels = [p[2] for p in obj["points"]] or None
    multimask = len(obj["points"]) == 1 and obj["box"] is None
    start = time.perf_counter()
    result = client.predict_full(
        point_coords=points, point_labels=labels, box=obj["box"], multimask_output=multimask
    )
    latencies.append((time.perf_counter() - start) * 1e3)
    best = int(np.argmax(result.iou_predictions[0]))
    return result.masks[0, best] > 0


def percentiles(values: list[float]) -> str:
    p50, p95 = np.percentile(values, [50, 95])
    return f"p50 {p50:.0f} ms, p95 {p95:.0f} ms (n={len(values)})"


# -- the tests -----------------------------------------------------------------------------------
def test_page_masks_exports_and_hover_storm_match_the_python_client(
    sam2_tiny_server, page_url, browser, downloads, image_file
):
    browser.get(page_url)
    wait_for(browser, "document.body.dataset.ready === 'true'", "the page to list the models")
    assert js(browser, "return annotator.state.model") == SESSION
    open_image(browser, image_file)
    assert error_text(browser) == ""
    assert js(browser, "return [annotator.state.image.width, annotator.state.image.height]") == [
        W,
        H,
    ]

    python_ms: list[float] = []
    with SAM2TritonClient(sam2_tiny_server.http_url) as client:
        client.set_image(image_file)  # the same file's bytes: the same image id on the server
        expected: list[np.ndarray] = []

        # Object 1: clicks at known pixels, positive and negative; each mask on screen.
        clicks = [
            (100, 80, False),
            (210, 150, True),
            (60, 60, False),
            (250, 40, True),
            (120, 110, False),
            (90, 160, True),
            (150, 70, False),
            (30, 200, True),
        ]
        for x, y, negative in clicks:
            click(browser, x, y, shift=negative)
            (obj,) = objects(browser)
            assert [round(v) for v in obj["points"][-1][:2]] == [x, y]
            assert obj["points"][-1][2] == (0 if negative else 1)
            mask = python_mask(client, obj, python_ms)
            np.testing.assert_array_equal(shown_mask(screen_pixels(browser), obj["colour"]), mask)
        expected.append(mask)
        page_ms = list(js(browser, "return annotator.stats.clickMs"))
        parts = js(browser, "return annotator.stats.clickParts")
        adopted = js(browser, "return annotator.stats.clickParts.filter(p => p.adopted).length")
        # The page's own requests again, from Python: through the gateway and to Triton
        # directly (where the browser's time goes: its request vs drawing; the gateway hop).
        image_id = js(browser, "return annotator.state.image.imageId")
        prompt_sets = [obj["points"][: k + 1] for k in range(len(clicks))]
        gateway_url = page_url.removesuffix("/web/")
        via_gateway = replay_ms(gateway_url, image_id, prompt_sets)
        direct = replay_ms(sam2_tiny_server.http_url, image_id, prompt_sets)

        # Undo removes the last point and restores its mask.
        press(browser, "z", ctrl=True)
        (obj,) = objects(browser)
        assert len(obj["points"]) == len(clicks) - 1

        # Object 2 (N): a box drag; object 1 stays drawn under it.
        press(browser, "n")
        drag(browser, (40, 30), (170, 130))
        first, second = objects(browser)
        assert second["box"] is not None and not second["points"]
        assert [round(v) for v in second["box"]] == [40, 30, 170, 130]
        box_mask = python_mask(client, second, [])
        undone = python_mask(client, first, [])
        pixels = screen_pixels(browser)
        np.testing.assert_array_equal(shown_mask(pixels, second["colour"]), box_mask)
        np.testing.assert_array_equal(shown_mask(pixels, first["colour"]), undone & ~box_mask)
        expected = [undone, box_mask]

        # Refinement with the previous mask (R): the server's kept logits, no error.
        press(browser, "r")
        click(browser, 60, 100)
        assert error_text(browser) == ""
        press(browser, "r")
        press(browser, "z", ctrl=True)  # back to the box alone

        # Object 3 (N): a hover storm of 50 mouse moves, latest-wins.
        press(browser, "n")
        counters = ClickCounters.of(
            sam2_tiny_server.http_url,
            sam2_tiny_server.metrics_url,
            session_decoder(sam2_tiny_server.http_url, SESSION),
            SESSION,
        )
        before = wait_until_quiet(counters, quiet_s=0.5)
        sent_before = js(browser, "return annotator.hoverLane.sent")
        # the moves to each click's pixel were hovers too: count the storm's alone
        js(browser, "Object.assign(annotator.stats, {hoverEvents: 0, hoverFirst: null})")
        hover_storm(browser)
        settle(browser)
        after = wait_until_quiet(counters, quiet_s=0.5)
        stats = js(browser, "return annotator.stats")
        sent = js(browser, "return annotator.hoverLane.sent") - sent_before
        storm_ms = stats["hoverLast"] - stats["hoverFirst"]
        d_ms = float(np.median(python_ms))
        bound = math.ceil(storm_ms / d_ms) + 2
        executed = (after - before).executed
        print(
            f"\nhover storm: {stats['hoverEvents']} mouse moves in {storm_ms:.0f} ms -> "
            f"{sent} requests sent, {executed} decoder executions; bound ceil(T/D)+2 = {bound} "
            f"(D = {d_ms:.0f} ms, the Python client's median click)"
        )
        assert stats["hoverEvents"] == HOVER_EVENTS
        assert executed == sent  # the server ran what the page sent, nothing more
        assert executed <= bound < HOVER_EVENTS
        js(
            browser,
            "document.getElementById('marks').dispatchEvent(new PointerEvent('pointerleave'))",
        )

    # Latency: printed, never asserted.
    ratio = np.median(page_ms) / np.median(python_ms)
    request_ms = [p["request"] for p in parts]
    draw_ms = [p["draw"] + p["paint"] for p in parts]
    print(
        f"click to mask on screen (browser): {percentiles(page_ms)}; {adopted} of "
        f"{len(page_ms)} took the answer of the preview in flight under the cursor\n"
        f"  of which its request: {percentiles(request_ms)}; decode + draw + paint: "
        f"{percentiles(draw_ms)}\n"
        f"the page's requests from Python: through the gateway {percentiles(via_gateway)}; "
        f"to Triton directly {percentiles(direct)}\n"
        f"Python client click (predict_full): {percentiles(python_ms)}\n"
        f"browser / Python client (p50): {ratio:.2f}x (goal <= 1.3x)"
    )

    # Exports: the COCO RLE and the label image hold the masks.
    browser.find_element("id", "export-coco").click()
    browser.find_element("id", "export-png").click()
    coco_path = wait_file(downloads / "cells_coco.json")
    png_path = wait_file(downloads / "cells_labels.png")
    document = json.loads(coco_path.read_text())
    assert document["images"] == [{"id": 1, "file_name": "cells.png", "width": W, "height": H}]
    annotations = document["annotations"]
    assert len(annotations) == 2  # object 3 has no mask (only hovered)
    for annotation, mask in zip(annotations, expected, strict=True):
        assert annotation["segmentation"]["size"] == [H, W]
        decoded = mask_codec.decode_rle(annotation["segmentation"]["counts"], (H, W))
        np.testing.assert_array_equal(decoded, mask)
        assert annotation["area"] == int(mask.sum())
    label = np.asarray(Image.open(io.BytesIO(png_path.read_bytes())))
    assert label.dtype == np.uint8 and label.shape == (H, W)
    drawn = np.zeros((H, W), np.uint8)
    for k, mask in enumerate(expected):
        drawn[mask] = k + 1
    np.testing.assert_array_equal(label, drawn)

    # The README's screenshot: made here, copied into docs/ when asked (a test run leaves
    # the checkout as it was).
    shot = downloads / SCREENSHOT.name
    browser.set_window_size(1000, 560)  # the README's width; the canvas stays at 1:1
    browser.save_screenshot(str(shot))
    if os.environ.get("TRITON_SAM_UPDATE_SCREENSHOT"):
        shutil.copyfile(shot, SCREENSHOT)
    print(f"screenshot: {shot}")


def test_refused_images_show_the_servers_message_and_the_page_keeps_working(
    sam2_tiny_server, page_url, browser, image_file, tmp_path
):
    browser.get(page_url)
    wait_for(browser, "document.body.dataset.ready === 'true'", "the page to list the models")
    open_image(browser, image_file)
    huge = tmp_path / "huge.png"
    Image.new("L", (5000, 5000), 128).save(huge)  # ~25 kB of PNG, 25 megapixels decoded
    not_image = tmp_path / "notes.png"
    not_image.write_text("not an image, whatever its name says\n")

    open_image(browser, huge)
    message = error_text(browser)
    print(f"\n5000 x 5000: {message}")
    assert "huge.png" in message and "image_bytes" in message and "5000x5000" in message
    open_image(browser, not_image)
    message = error_text(browser)
    print(f"not an image: {message}")
    assert "notes.png" in message and "image_bytes" in message and "cannot decode" in message

    # The image before is still open, and clicks still get masks.
    assert js(browser, "return annotator.state.image.name") == "cells.png"
    click(browser, 100, 80)
    assert error_text(browser) == ""
    (obj,) = objects(browser)
    with SAM2TritonClient(sam2_tiny_server.http_url) as client:
        client.set_image(image_file)
        mask = python_mask(client, obj, [])
    np.testing.assert_array_equal(shown_mask(screen_pixels(browser), obj["colour"]), mask)


def hover_storm(browser) -> None:
    """50 pointer moves across the image, ~10 ms apart (one WebDriver action sequence)."""
    from selenium.webdriver.common.action_chains import ActionChains

    marks = browser.find_element("id", "marks")
    actions = ActionChains(browser, duration=0)
    for k in range(HOVER_EVENTS):
        x = 20 + (W - 40) * k / (HOVER_EVENTS - 1)
        y = 40 + (H - 80) * k / (HOVER_EVENTS - 1)
        actions.move_to_element_with_offset(marks, *offset(browser, x, y))
        actions.pause(0.01)
    actions.perform()


def replay_ms(base_url: str, image_id: str, prompt_sets: list[list]) -> list[float]:
    """Round trips of the page's click requests (kserve.js's predict) sent from Python."""
    times = []
    outputs = ("masks_rle", "mask_scores", "image_size", "logits_key")
    with requests.Session() as session:
        for points in prompt_sets:
            n = len(points)
            body = {
                "inputs": [
                    tensor("image_id", [1, 1], "BYTES", [image_id]),
                    tensor("points", [1, n, 2], "FP32", [v for p in points for v in p[:2]]),
                    tensor("labels", [1, n], "INT32", [p[2] for p in points]),
                    tensor("multimask_output", [1, 1], "INT32", [int(n == 1)]),
                ],
                "outputs": [{"name": name} for name in outputs],
            }
            start = time.perf_counter()
            answer = session.post(f"{base_url}/v2/models/{SESSION}/infer", json=body, timeout=60)
            times.append((time.perf_counter() - start) * 1e3)
            answer.raise_for_status()
    return times


def tensor(name: str, shape: list[int], datatype: str, data: list) -> dict:
    return {"name": name, "shape": shape, "datatype": datatype, "data": data}


def wait_file(path: Path, timeout_s: float = 30) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0:
            time.sleep(0.2)  # Chromium renames the .crdownload when it is complete
            return path
        time.sleep(0.05)
    raise AssertionError(f"{path.name} was not downloaded")
