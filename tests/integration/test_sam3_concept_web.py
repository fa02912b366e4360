"""The browser annotator on a server whose only model for it is ``sam3_concept``.

A phrase typed into the page segments every instance (one object each): the page sends the
image's pixels from its canvas once, then the image id. Each mask equals the Python client's
(``predict_concepts``) on the same pixels. Its own file, run right after the concept serving
tests, so the shared concept server is stopped as early as before (tests/conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from browser_support import chromium, error_text, js, open_image, wait_for
from PIL import Image

from triton_sam.client import SAM2TritonClient
from triton_sam.serving import masks as mask_codec
from triton_sam.web.serve import WebServer

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(600)]


def test_a_concept_phrase_segments_every_instance_as_the_python_client(concept_server, tmp_path):
    """On a server whose only model for the page is ``sam3_concept``: the image's pixels from
    the page's canvas, a phrase, every instance an object, each mask the Python client's."""
    server = concept_server
    rgb = np.random.default_rng(0).integers(0, 256, (61, 83, 3), dtype=np.uint8)
    path = tmp_path / "noise.png"
    Image.fromarray(rgb).save(path)
    with (
        WebServer(server.http_url, server.grpc_address, port=0) as web,
        chromium(tmp_path) as browser,
    ):
        browser.get(web.url)
        wait_for(browser, "document.body.dataset.ready === 'true'", "the page to list the models")
        assert js(browser, "return document.getElementById('concept').hidden") is False
        open_image(browser, path)
        phrase = browser.find_element("id", "phrase")
        phrase.send_keys("cat\n")  # Enter submits the form
        wait_for(
            browser,
            "annotator.state.objects.length > 1 || annotator.stats.errors.length",
            "the instances",
        )
        assert error_text(browser) == ""
        shown = js(browser, "return annotator.state.objects.filter(o => o.rle).map(o => o.rle)")
        # a second phrase sends the image id, not the pixels
        phrase.send_keys("cat\n")
        wait_for(
            browser,
            f"annotator.state.objects.filter(o => o.rle).length > {len(shown)}",
            "the second answer",
        )
        stats = browser.find_element("id", "stats").text
    with SAM2TritonClient(server.http_url, model_type="sam3_concept") as client:
        client.set_image(rgb)
        expected = client.predict_concepts("cat").masks
    print(f"\nconcept 'cat': {len(shown)} instances; second phrase: {stats}")
    assert len(shown) == len(expected) > 0
    for counts, mask in zip(shown, expected, strict=True):
        np.testing.assert_array_equal(mask_codec.decode_rle(counts, rgb.shape[:2]), mask)
    sent = int(stats.split("sent ")[1].split(" B")[0])
    assert sent < rgb.size  # the id, not the pixels
