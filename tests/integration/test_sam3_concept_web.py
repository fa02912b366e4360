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


# -- exemplars: "more like this" / "less like this" boxes ---------------------------------------
QUERIES = 200  # the model's queries: instances per prompt at score threshold 0
IMAGE_A = np.random.default_rng(1).integers(0, 256, (72, 96, 3), dtype=np.uint8)
IMAGE_B = np.random.default_rng(2).integers(0, 256, (64, 88, 3), dtype=np.uint8)


def drag_box(browser, start, end) -> None:
    """A pointer drag on the page from image pixel ``start`` to ``end`` ((x, y) each),
    wherever the view placed and scaled the image."""
    from selenium.webdriver.common.action_chains import ActionChains

    marks = browser.find_element("id", "marks")
    rect = js(
        browser,
        "const c = document.getElementById('marks'); const r = c.getBoundingClientRect();"
        "return [r.width / c.width, r.height / c.height, r.width, r.height]",
    )
    sx, sy, width, height = rect

    def at(x, y):
        return int(round(x * sx - width / 2)), int(round(y * sy - height / 2))

    (x0, y0), (x1, y1) = at(*start), at(*end)
    actions = ActionChains(browser, duration=0).move_to_element_with_offset(marks, x0, y0)
    actions.click_and_hold()
    for k in range(1, 5):
        actions.move_to_element_with_offset(marks, x0 + (x1 - x0) * k // 4, y0 + (y1 - y0) * k // 4)
    actions.release().perform()


def segment_all(browser, phrase: str) -> dict:
    """Submits the concept form with ``phrase`` (may be empty); the answer's stats entry."""
    before = js(browser, "return annotator.stats.concepts.length + annotator.stats.errors.length")
    field = browser.find_element("id", "phrase")
    field.clear()
    field.send_keys(phrase + "\n")  # Enter submits the form
    wait_for(
        browser,
        f"annotator.stats.concepts.length + annotator.stats.errors.length > {before}",
        "the concept's answer",
    )
    assert error_text(browser) == ""
    return js(browser, "return annotator.stats.concepts.at(-1)")


def shown_masks(browser) -> list[str]:
    return js(browser, "return annotator.state.objects.filter(o => o.rle).map(o => o.rle)")


def assert_page_shows(shown: list[str], expected: np.ndarray, hw, room: int) -> None:
    """The objects an answer added are the Python client's instances, in order, up to the
    ``room`` the page had left of its 255 objects (a random-init model can answer more)."""
    assert len(shown) == min(len(expected), room)
    for counts, mask in zip(shown, expected, strict=False):
        np.testing.assert_array_equal(mask_codec.decode_rle(counts, hw), mask)


def test_exemplar_boxes_on_the_page_are_predict_concepts_boxes_and_the_id_is_kept(
    concept_server, tmp_path
):
    """(b) A "more like this" and a "less like this" box, no phrase: the page's instances are
    ``predict_concepts(boxes=..., box_labels=...)``'s. (c) The exemplar id the server
    answered is kept: on a second image the page sends it (no boxes), alone and then with a
    phrase, and its instances are ``predict_concepts([phrase,] exemplar_ids=[id])``'s. A box
    the server refuses shows its message naming ``exemplar_boxes[0]``; Clear forgets
    everything."""
    from selenium.webdriver.support.ui import Select

    server = concept_server
    paths = []
    for name, rgb in (("a.png", IMAGE_A), ("b.png", IMAGE_B)):
        paths.append(tmp_path / name)
        Image.fromarray(rgb).save(paths[-1])
    with (
        WebServer(server.http_url, server.grpc_address, port=0) as web,
        chromium(tmp_path) as browser,
    ):
        browser.get(web.url)
        wait_for(browser, "document.body.dataset.ready === 'true'", "the page to list the models")
        mode = Select(browser.find_element("id", "exemplar-mode"))
        # No session model on this server: a drag draws an exemplar from the start.
        assert mode.first_selected_option.get_attribute("value") == "1"
        # Score above 0: every one of the 200 queries is an instance, so the comparison covers
        # all of them (a random-init model scores few above the default 0.3 from boxes alone).
        threshold = browser.find_element("id", "threshold")
        threshold.clear()
        threshold.send_keys("0")
        open_image(browser, paths[0])
        drag_box(browser, (10, 12), (50, 44))
        mode.select_by_value("0")
        drag_box(browser, (60, 30), (90, 66))
        status = browser.find_element("id", "exemplars").text
        assert status == "Exemplars: 2 boxes to send (1 more, 1 less)"
        first = segment_all(browser, "")
        on_a = shown_masks(browser)
        status = browser.find_element("id", "exemplars").text
        assert first["labels"] == [1, 0] and first["ids"] == []
        assert status == f"Exemplars: in use: exemplar {first['exemplarId'][:8]}… (1 more, 1 less)"

        open_image(browser, paths[1])
        second = segment_all(browser, "")  # the kept exemplar alone
        on_b = shown_masks(browser)
        third = segment_all(browser, "cat")  # and with a phrase
        on_b_cat = shown_masks(browser)[len(on_b) :]
        for answer in (second, third):
            assert answer["boxes"] == [] and answer["ids"] == [first["exemplarId"]]

        # A box past the image (the page clamps drags, so one is planted as a stale or
        # scripted one would be): the server's refusal is shown, naming the box.
        js(browser, "annotator.exemplars.add([0, 0, 500, 40], annotator.state.image)")
        browser.find_element("id", "phrase").send_keys("\n")
        wait_for(browser, "annotator.stats.errors.length > 0", "the refusal")
        refused = error_text(browser)
        browser.find_element("id", "exemplars-clear").click()
        cleared = js(
            browser,
            "return [annotator.exemplars.pending.length, annotator.exemplars.kept.length, "
            "document.getElementById('exemplars').textContent]",
        )
    assert "InvalidInput" in refused and "exemplar_boxes[0]" in refused
    assert "outside the image" in refused
    assert cleared == [0, 0, ""]

    boxes = np.array(first["boxes"], np.float32)
    assert boxes.shape == (2, 4) and (boxes[:, 2:] > boxes[:, :2]).all()
    with SAM2TritonClient(server.http_url, model_type="sam3_concept") as client:
        client.set_image(IMAGE_A)
        by_boxes = client.predict_concepts(boxes=boxes, box_labels=first["labels"], threshold=0.0)
        client.set_image(IMAGE_B)
        by_id = client.predict_concepts(exemplar_ids=[first["exemplarId"]], threshold=0.0)
        by_id_cat = client.predict_concepts(
            "cat", exemplar_ids=[first["exemplarId"]], threshold=0.0
        )
    print(
        f"\nexemplars on A: {len(by_boxes.masks)} instances; kept id with 'cat' on B: "
        f"{len(by_id.masks)}; sent {first['sent']} B then {second['sent']} B, {third['sent']} B"
    )
    assert first["instances"] == len(by_boxes.masks) == QUERIES
    assert second["instances"] == len(by_id.masks) == QUERIES
    assert third["instances"] == len(by_id_cat.masks) == QUERIES
    # Some masks have pixels, or equality would prove little.
    assert by_boxes.masks.any(axis=(1, 2)).sum() > 0 and by_id.masks.any(axis=(1, 2)).sum() > 0
    # Each image opens with one empty object; the third answer had what the second left.
    assert_page_shows(on_a, by_boxes.masks, IMAGE_A.shape[:2], room=MAX_OBJECTS - 1)
    assert_page_shows(on_b, by_id.masks, IMAGE_B.shape[:2], room=MAX_OBJECTS - 1)
    room = MAX_OBJECTS - 1 - len(on_b)
    assert_page_shows(on_b_cat, by_id_cat.masks, IMAGE_B.shape[:2], room=room)
    assert not np.array_equal(by_id.masks, by_id_cat.masks)  # the phrase mattered
