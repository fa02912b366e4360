"""The browser annotator on the SAM3 tracker's session model (the shared ``sam3_server``).

``sam3_session`` takes prompts in original pixels and answers finished masks like the SAM1
and SAM2.1 session models, so ``/web/models`` offers it and the page drives it exactly as it
drives them. One click on a small image in headless Chromium (``browser_support``): the mask
the page shows equals the Python client's (``SAM2TritonClient(model_type="sam3")``) for the
page's own point, read from the page so the sub-pixel position is the same; one point alone
asks for three masks and keeps the best scored, on the page and here.
"""

from __future__ import annotations

import numpy as np
import pytest
from browser_support import WAIT_S, chromium, error_text, js, open_image, wait_for
from PIL import Image

from triton_sam.client import SAM2TritonClient
from triton_sam.serving import masks as mask_codec
from triton_sam.tools.sample import sample_image
from triton_sam.web.serve import WebServer

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(600)]

W, H = 320, 224
IMAGE = sample_image(W, H, seed=12)


def test_a_sam3_tracker_click_on_the_page_is_the_python_clients_mask(sam3_server, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains

    path = tmp_path / "sam3.png"
    Image.fromarray(IMAGE).save(path)
    server = sam3_server
    with (
        WebServer(server.http_url, server.grpc_address, port=0, model_type="sam3") as web,
        chromium(tmp_path) as browser,
    ):
        browser.get(web.url)
        wait_for(browser, "document.body.dataset.ready === 'true'", "the page to list the models")
        offered = js(browser, "return annotator.state.models.filter(m => m.kind === 'session')")
        assert offered == [
            {"name": "sam3_session", "kind": "session", "label": "SAM3 tracker (sam3_session)"}
        ]
        open_image(browser, path)
        assert error_text(browser) == ""
        marks = browser.find_element("id", "marks")
        # Left of and above the canvas centre, wherever the view placed the image.
        ActionChains(browser, duration=0).move_to_element_with_offset(
            marks, -37, -21
        ).click().perform()
        browser.set_script_timeout(WAIT_S)
        wait_for(browser, "annotator.stats.clickMs.length > 0", "the click's mask")
        browser.execute_async_script("annotator.whenIdle().then(arguments[arguments.length - 1])")
        assert error_text(browser) == ""
        shown = js(
            browser,
            "const o = annotator.state.objects[0]; return {points: o.points, rle: o.rle, "
            "score: o.score, model: annotator.state.image.model}",
        )
    assert shown["model"] == "sam3_session"
    [(x, y, label)] = shown["points"]
    assert label == 1 and 0 <= x <= W and 0 <= y <= H
    with SAM2TritonClient(server.http_url, model_type="sam3") as client:
        client.set_image(IMAGE)
        result = client.predict_full(point_coords=[[x, y]], point_labels=[1], multimask_output=True)
    best = int(np.argmax(result.iou_predictions[0]))
    expected = result.masks[0, best] > 0
    assert 0 < expected.mean() < 1  # both classes present, or equality would be vacuous
    np.testing.assert_array_equal(mask_codec.decode_rle(shown["rle"], (H, W)), expected)
    assert shown["score"] == pytest.approx(float(result.iou_predictions[0, best]), abs=1e-6)
