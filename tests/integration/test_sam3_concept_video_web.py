"""The page's "Video concepts" panel on the served ``sam3_concept_video`` (the session's
shared ``concept_video_server``: the seeded small model of tests/concept_video_e2e_support.py,
one export and one start for this file and tests/integration/test_sam3_concept_video.py).

In headless Chromium (``browser_support``): the clip's frames as PNG files, chosen together
and taken in name order (numbers by value), the phrase, the settings overrides the random model
needs to find objects (the "advanced" field), Propagate. Every answered frame's object ids,
prompt ids, scores, boxes and decoded masks equal ``SAM3ConceptVideoClient``'s on the same
frames and settings (exact: the same server and graphs; the page's frames go up as their PNG
bytes and the server decodes them to the same pixels). The downloaded JSON holds the same.
Another tenant holding the page's session id is refused as if it did not exist. Cancel
mid-way stops the propagation on the server (its count of frames processed).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace

import numpy as np
import pytest
import requests
from browser_support import WAIT_S, chromium, error_text, js, wait_for
from concept_video_e2e_support import NUM_FRAMES, PHRASE, SETTINGS, clip
from PIL import Image

from triton_sam.client.concept_video import SAM3ConceptVideoClient
from triton_sam.serving import masks as mask_codec
from triton_sam.serving.concept_video.service import SERVED_SETTINGS
from triton_sam.serving.protocol import concept_video as protocol
from triton_sam.serving.protocol.tenancy import TENANT_HEADER
from triton_sam.web.serve import WebServer

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(900)]
# What a propagation sends to run with the clip's settings at the served bound on objects (as
# tests/integration/test_sam3_concept_video.py: the served defaults find nothing here).
SERVED = replace(SETTINGS, max_num_objects=protocol.MAX_OBJECTS)
OVERRIDES = {k: v for k, v in asdict(SERVED).items() if v != getattr(SERVED_SETTINGS, k)}
ROUTE = f"concept-video/{protocol.MODEL}"


@pytest.fixture(scope="module")
def page(concept_video_server, tmp_path_factory):
    """(gateway, browser, download folder): the page loaded, listing the models."""
    downloads = tmp_path_factory.mktemp("video_concepts_page")
    server = concept_video_server
    with (
        WebServer(server.http_url, server.grpc_address, port=0) as web,
        chromium(downloads) as browser,
    ):
        browser.get(web.url)
        wait_for(browser, "document.body.dataset.ready === 'true'", "the page to list the models")
        yield web, browser, downloads


def save_frames(frames: list[np.ndarray], folder, names: list[str]) -> list[str]:
    folder.mkdir(exist_ok=True)
    paths = []
    for frame, name in zip(frames, names, strict=True):
        Image.fromarray(frame).save(folder / name)
        paths.append(str(folder / name))
    return paths


def propagate_on_the_page(browser, paths: list[str], phrase: str, settings: dict) -> None:
    """Chooses the frames (all at once, in the order given), types the phrase and the
    settings, presses Propagate."""
    browser.find_element("id", "vc-files").send_keys("\n".join(paths))
    wait_for(browser, f"annotator.videoConcepts.bitmaps.length === {len(paths)}", "the frames")
    field = browser.find_element("id", "vc-settings")
    if not field.is_displayed():
        browser.find_element("css selector", "#video-concepts summary").click()
    field.clear()
    field.send_keys(json.dumps(settings))
    phrase_field = browser.find_element("id", "vc-phrase")
    phrase_field.clear()
    phrase_field.send_keys(phrase)
    browser.find_element("id", "vc-propagate").click()


def gateway(web, body: dict, tenant: str | None = None) -> requests.Response:
    headers = {TENANT_HEADER: tenant} if tenant else {}
    return requests.post(web.url + ROUTE, json=body, headers=headers, timeout=WAIT_S)


def test_the_page_tracks_a_phrase_as_the_python_client(page, concept_video_server, tmp_path):
    web, browser, downloads = page
    offered = js(browser, "return annotator.state.models")
    assert {"name": protocol.MODEL, "kind": "concept_video",
            "label": f"SAM3 video concepts ({protocol.MODEL})"} in offered  # fmt: skip
    assert js(browser, "return document.getElementById('video-concepts').hidden") is False
    frames = clip()
    # Chosen out of order; taken by name with numbers by value (f10 after f9).
    names = [f"f{8 + i}.png" for i in range(NUM_FRAMES)]
    paths = save_frames(frames, tmp_path / "frames", names)
    propagate_on_the_page(browser, paths[::-1], PHRASE, OVERRIDES)
    wait_for(
        browser,
        "annotator.videoConcepts.state === 'done' || annotator.stats.errors.length",
        "the propagation's totals",
        timeout_s=300,
    )
    assert error_text(browser) == ""
    vc = js(
        browser,
        "const v = annotator.videoConcepts; return {session: v.session, progress: v.progress, "
        "files: v.files.map(f => f.name), frames: [...v.results.values()], "
        "sliderMax: document.getElementById('vc-slider').max}",
    )
    assert vc["files"] == names and vc["sliderMax"] == str(NUM_FRAMES - 1)
    assert vc["progress"] == [NUM_FRAMES, NUM_FRAMES]

    browser.find_element("id", "vc-download").click()
    download = downloads / f"{PHRASE}_video_concepts.json"
    deadline = time.monotonic() + WAIT_S
    while not download.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    saved = json.loads(download.read_text())

    # The page's session: its tenant (the default one) reads it; another is refused as if
    # it did not exist, for a read and for a propagation.
    mine = gateway(web, {"command": "info", "session_id": vc["session"]})
    assert mine.status_code == 200
    assert mine.json()["status"]["session"]["frames_tracked"] == NUM_FRAMES
    for body in ({"command": "info"}, {"command": "propagate"}):
        refused = gateway(web, {**body, "session_id": vc["session"]}, tenant="intruder")
        assert refused.status_code == 404 and refused.json()["code"] == "SessionNotFound"
        assert vc["session"] not in refused.text

    with SAM3ConceptVideoClient(concept_video_server.grpc_url) as client:
        session = client.open(frames)
        assert client.add_prompt(session, [PHRASE]) == [0]
        served = list(client.propagate(session, settings=OVERRIDES))
        client.close(session)
    shown = sorted(vc["frames"], key=lambda f: f["frame_index"])
    assert [f["frame_index"] for f in shown] == [f.result.frame_idx for f in served]
    hw = frames[0].shape[:2]
    for ours, theirs in zip(shown, served, strict=True):
        result = theirs.result
        assert ours["object_ids"] == result.object_ids.tolist()
        assert ours["prompt_ids"] == result.prompt_ids.tolist()
        # float32 on the wire, float64 in JSON: back to float32 exactly.
        np.testing.assert_array_equal(np.float32(ours["scores"]), result.scores)
        np.testing.assert_array_equal(np.float32(ours["boxes"]).reshape(-1, 4), result.boxes)
        decoded = [mask_codec.decode_rle(c, hw) for c in ours["masks_rle"]]
        np.testing.assert_array_equal(np.array(decoded, bool).reshape(result.masks.shape),
                                      result.masks)  # fmt: skip
    assert sum(len(f["object_ids"]) for f in shown) > 0  # objects found: equality means something
    assert saved["files"] == names and saved["video_hw"] == list(hw)
    assert saved["phrase"] == PHRASE and saved["settings"] == OVERRIDES
    assert [f["object_ids"] for f in saved["frames"]] == [f["object_ids"] for f in shown]
    assert [[m["counts"] for m in f["masks"]] for f in saved["frames"]] == [
        f["masks_rle"] for f in shown
    ]
    print(f"\nvideo concepts: {len(shown)} frames, objects per frame "
          f"{[len(f['object_ids']) for f in shown]}")  # fmt: skip


def test_cancel_stops_the_propagation_on_the_server(page, tmp_path):
    web, browser, _ = page
    frames = clip() * 4  # 3 frames run when measured; twelve leave room for a loaded machine
    names = [f"c{i}.png" for i in range(len(frames))]
    paths = save_frames(frames, tmp_path / "frames", names)
    propagate_on_the_page(browser, paths, PHRASE, OVERRIDES)
    wait_for(
        browser,
        "(annotator.videoConcepts.state === 'propagating' && annotator.videoConcepts.progress[0]"
        " >= 1) || annotator.stats.errors.length",
        "the first frame processed",
        timeout_s=300,
    )
    assert error_text(browser) == ""
    cancel = browser.find_element("id", "vc-cancel")
    assert cancel.is_enabled()
    cancel.click()
    wait_for(browser, "annotator.videoConcepts.state === 'cancelled'", "the page's cancel")
    session = js(browser, "return annotator.videoConcepts.session")
    # The server asks before each frame whether the request was cancelled; ``info`` waits
    # for the frame in progress (one lock for frames and commands), so the count is read once
    # the server says the propagation ended. A cancel that did not reach it would run all.
    for _ in range(120):
        status = gateway(web, {"command": "info", "session_id": session}).json()["status"]
        if not status["session"]["propagating"]:
            break
    else:
        raise AssertionError("the propagation never ended")
    ran = status["session"]["frames_tracked"]
    print(f"\ncancel after the first frame: {ran} of {len(frames)} frames processed")
    assert 1 <= ran < len(frames)
    assert "cancelled" in browser.find_element("id", "stats").text
    # Leave the shared server as found (its bound on sessions is shared with other tests).
    assert gateway(web, {"command": "close", "session_id": session}).json() == {}
