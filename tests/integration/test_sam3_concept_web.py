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

MAX_OBJECTS = 255  # the page's bound (app.js): label values 1..255 of an 8-bit PNG


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
        answered = []
        for _ in range(2):  # the second time, the server holds the image: its id is sent
            phrase.clear()
            phrase.send_keys("cat\n")  # Enter submits the form
            wait_for(
                browser,
                f"annotator.stats.concepts.length > {len(answered)} "
                "|| annotator.stats.errors.length",
                "the phrase's answer",
            )
            assert error_text(browser) == ""
            answered = js(browser, "return annotator.stats.concepts")
        shown = js(browser, "return annotator.state.objects.filter(o => o.rle).map(o => o.rle)")
        objects = js(browser, "return annotator.state.objects.length")
    with SAM2TritonClient(server.http_url, model_type="sam3_concept") as client:
        client.set_image(rgb)
        expected = client.predict_concepts("cat").masks
    first, second = answered
    print(
        f"\nconcept 'cat': {first['instances']} instances; sent {first['sent']} B, then "
        f"{second['sent']} B"
    )
    assert first["instances"] == second["instances"] == len(expected)
    # Each answer's instances became objects, up to the 8-bit label image's 255 objects (a
    # random-init model can answer hundreds): the page keeps the first ones and says so.
    assert len(shown) == min(2 * len(expected), len(shown) + MAX_OBJECTS - objects)
    if len(shown) < 2 * len(expected):
        assert objects == MAX_OBJECTS
    for counts, mask in zip(shown, [*expected, *expected], strict=False):
        np.testing.assert_array_equal(mask_codec.decode_rle(counts, rgb.shape[:2]), mask)
    assert first["sent"] > rgb.size > second["sent"]  # the pixels once, then the id
