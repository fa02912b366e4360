"""Segment everything on the browser page, against the embedded server (SAM2.1-tiny).

The page (headless Chromium, as tests/integration/test_web_page.py drives it) opens a PNG,
presses **Segment everything** (key E) with a small grid, and its objects' RLE must be the
instances ``SAM2TritonClient.generate_masks`` gets for the same image and parameters (the
same server, the same model: the same bytes). A refused parameter shows the server's message
naming it, and the page keeps working.
"""

from __future__ import annotations

import pytest
from browser_support import chromium, error_text, js, open_image, wait_for
from PIL import Image

from triton_sam.client import SAM2TritonClient
from triton_sam.tools.sample import sample_image
from triton_sam.web.serve import WebServer, served_family

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(600)]

H, W = 120, 160
IMAGE = sample_image(W, H, seed=7)
# Thresholds that keep every mask (as tests/integration/test_everything_serving.py's KEEP_ALL),
# so a random-init model still answers instances to compare.
PARAMS = {
    "points_per_side": 2,
    "pred_iou_thresh": 0.0,
    "stability_score_thresh": 0.0,
    "box_nms_thresh": 1.0,
}


@pytest.fixture(scope="module")
def page(sam2_tiny_server, sam2_tiny_repository, tmp_path_factory):
    family = served_family(sam2_tiny_repository)
    server = sam2_tiny_server
    tmp = tmp_path_factory.mktemp("everything")
    path = tmp / "cells.png"
    Image.fromarray(IMAGE).save(path)
    with (
        WebServer(server.http_url, server.grpc_address, port=0, model_type=family) as web,
        chromium(tmp) as browser,
    ):
        browser.get(web.url)
        wait_for(browser, "document.body.dataset.ready === 'true'", "the page to start")
        yield browser, path


def _press_e(browser) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).send_keys("e").perform()


def test_page_objects_are_the_clients_instances(page, sam2_tiny_server):
    browser, path = page
    assert js(browser, "return !document.getElementById('everything').hidden")
    open_image(browser, path)
    before = js(browser, "return annotator.state.objects.length")
    js(browser, "annotator.everythingParams = arguments[0]", PARAMS)
    js(browser, "document.getElementById('stats').textContent = ''")
    _press_e(browser)
    wait_for(
        browser,
        "document.getElementById('stats').textContent.includes('instances')",
        "segment everything's instances",
        timeout_s=120,
    )
    rles = js(browser, f"return annotator.state.objects.slice({before}).map(o => o.rle)")
    with SAM2TritonClient(sam2_tiny_server.grpc_url, model_type="sam2", protocol="grpc") as c:
        expected = c.generate_masks(IMAGE, **PARAMS)
    assert len(expected) > 0
    assert rles == [r["segmentation"]["counts"] for r in expected.instances]


def test_a_refused_parameter_is_shown_and_the_page_keeps_working(page):
    browser, path = page
    open_image(browser, path)
    js(browser, "annotator.everythingParams = {points_per_side: 'many'}")
    _press_e(browser)
    wait_for(browser, "!document.getElementById('error').hidden", "the error")
    assert "points_per_side" in error_text(browser)
    assert js(browser, "return document.getElementById('everything').textContent") == (
        "Segment everything"
    )
    js(browser, "annotator.everythingParams = arguments[0]", PARAMS)
    before = js(browser, "return annotator.state.objects.length")
    js(browser, "document.getElementById('stats').textContent = ''")
    _press_e(browser)
    wait_for(
        browser,
        "document.getElementById('stats').textContent.includes('instances')",
        "segment everything after the error",
        timeout_s=120,
    )
    assert js(browser, "return annotator.state.objects.length") > before
