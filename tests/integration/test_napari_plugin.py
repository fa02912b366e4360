"""The napari plugin in a real viewer against the shared SAM2.1-tiny server (and, first, the
concept and tracker servers: the module's last test uses the shared server, so this module's
fixtures close their clients before tests/conftest.py stops it).

napari draws with OpenGL, which Qt's ``offscreen`` platform does not provide (the canvas fails
in vispy's ``glGetParameter``), so the viewer runs on an X server: the one in ``$DISPLAY``, or
an ``Xvfb`` this module starts (Debian: ``apt-get install xvfb libxcb-icccm4
libxcb-keysyms1 libxcb-xinerama0``, which PyQt5's xcb platform plugin links).

Every mask the widget writes is compared pixel for pixel with the public Python client's on
the same server and the same prompts. The widget's requests run on worker threads; the tests
wait (``qtbot.waitUntil``) until it has no request in flight.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from triton_sam import SAM2TritonClient, SAM2VideoTritonClient, to_sam_rgb

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(600)]

SHAPE = (256, 320)
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "napari-plugin.png"
WAIT_MS = 120_000


def _image() -> np.ndarray:
    """uint16 discs on a ramp: the widget maps 16-bit pixels by the server's percentiles."""
    yy, xx = np.mgrid[0 : SHAPE[0], 0 : SHAPE[1]]
    image = (xx * 40 + yy * 20).astype(np.uint16)
    for cy, cx, r in ((80, 90, 40), (170, 220, 55)):
        image[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = 60_000
    return image


@pytest.fixture(scope="session")
def display():
    """An X display for Qt's xcb platform (OpenGL through Mesa); session scope, as pytest-qt's
    ``qapp`` (the one QApplication) is, so that it exists before the application does."""
    # OpenAI's triton package (torch imports it, e.g. for an export later in this process)
    # segfaults when it is first imported after Mesa's OpenGL is loaded (both carry LLVM;
    # reproduced: viewer, then `import triton`). Imported before the viewer, both live.
    if importlib.util.find_spec("triton") is not None:
        importlib.import_module("triton")
    if os.environ.get("DISPLAY"):
        os.environ["QT_QPA_PLATFORM"] = "xcb"
        return os.environ["DISPLAY"]
    if shutil.which("Xvfb") is None:
        pytest.fail("napari needs an X server: install Debian's xvfb (see the module docstring)")
    # -displayfd: Xvfb picks a free display and writes its number once it accepts clients.
    # It exits with this process (PR_SET_PDEATHSIG), not at fixture teardown: Qt's
    # application outlives the fixtures, and Qt aborts the process when its X server goes.
    read_end, write_end = os.pipe()
    subprocess.Popen(
        ["Xvfb", "-displayfd", str(write_end), "-screen", "0", "1280x1024x24", "-nolisten", "tcp"],
        pass_fds=(write_end,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,
    )
    os.close(write_end)
    with os.fdopen(read_end) as ready:
        number = ready.readline().strip()
    assert number, "Xvfb did not start"
    os.environ["DISPLAY"], os.environ["QT_QPA_PLATFORM"] = f":{number}", "xcb"
    return os.environ["DISPLAY"]


def _die_with_parent() -> None:
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1  # noqa: N806 - prctl(2)'s name
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@pytest.fixture(scope="module")
def viewer(display, qapp):
    import napari

    viewer = napari.Viewer(show=False)
    yield viewer
    viewer.close()


@pytest.fixture(scope="module")
def client(sam2_tiny_server):
    """The reference: the public client on the same server, the same pixel mapping."""
    with SAM2TritonClient(sam2_tiny_server.grpc_url, "sam2", "grpc") as c:
        c.set_image(to_sam_rgb(_image()))
        yield c


def test_concept_phrases_on_a_concept_server_match_the_client(viewer, concept_server):
    """The concept box appears only for a server with a concept model; each instance of the
    phrase becomes a new object, the client's masks pixel for pixel."""
    from triton_sam.napari.widget import SegmentAnythingWidget

    rgb = np.random.default_rng(0).integers(0, 256, (61, 83, 3)).astype(np.uint8)
    viewer.add_image(rgb, name="photo", rgb=True)
    concepts = SegmentAnythingWidget(viewer)
    concepts.url.setText(concept_server.grpc_url.split("://")[-1])
    concepts.connect_button.click()
    _settle(concepts)
    assert concepts.last_error is None, concepts.last_error
    assert concepts.concept_button.isVisibleTo(concepts)
    assert not concepts.everything_button.isVisibleTo(concepts)
    concepts.image.setCurrentText("photo")
    concepts.concept_text.setText("cat")
    concepts.concept_button.click()
    _settle(concepts)
    assert concepts.last_error is None, concepts.last_error
    with SAM2TritonClient(concept_server.grpc_url, "sam3_concept", "grpc") as client:
        client.set_image(rgb)
        found = client.predict_concepts("cat").masks
    assert len(found) > 0  # random weights: the small model finds many "cats"
    expected = np.zeros(rgb.shape[:2], np.uint32)
    for k, mask in enumerate(found):
        expected[mask & (expected == 0)] = 1 + k  # earlier instances keep their pixels
    np.testing.assert_array_equal(concepts.layers.objects.data, expected)
    assert concepts.object_id == 1 + len(found)
    concepts.close()
    viewer.layers.remove("photo")


@pytest.fixture(scope="module")
def video_server(sam2_video_export, embedded_triton, tmp_path_factory):
    """The tracker over the session's tracking export (as test_video_tracker.py serves it)."""
    from triton_sam.repository.config import RepositoryOptions
    from triton_sam.repository.video_config import TrackerOptions, write_video_models
    from triton_sam.repository.writer import embedded_repository

    repo = tmp_path_factory.mktemp("napari_video") / "model_repository"
    write_video_models(
        repo,
        sam2_video_export.graphs,
        sam2_video_export.config,
        RepositoryOptions(),
        TrackerOptions(max_sessions=2),
    )
    return embedded_triton(embedded_repository(repo), startup_timeout_s=180.0)


def test_propagation_through_z_and_a_correction_match_the_video_client(viewer, video_server):
    """A click on the middle slice tracked both ways, then a click on the last slice (a
    correction) tracked again: slice for slice the video client's masks for the same calls."""
    from triton_sam.napari.widget import SegmentAnythingWidget

    z, y, x = 3, 33, 47
    zz, yy, xx = np.mgrid[0:z, 0:y, 0:x]
    volume = np.where((xx - 20 - 2 * zz) ** 2 + (yy - 15) ** 2 < 49, 220, 30).astype(np.uint8)
    viewer.add_image(volume, name="stack")
    tracker = SegmentAnythingWidget(viewer)
    tracker.url.setText(video_server.grpc_url.split("://")[-1])
    tracker.connect_button.click()
    _settle(tracker)
    assert tracker.propagate_button.isVisibleTo(tracker) and tracker.last_error is None
    tracker.image.setCurrentText("stack")
    clicks = [(1, 15, 22), (2, 15, 24)]  # (slice, row, col)
    got = []
    for click in clicks:
        viewer.dims.set_current_step(0, click[0])
        tracker.prepare_layers().points.add(list(click))
        tracker.propagate_button.click()
        _settle(tracker)
        assert tracker.last_error is None, tracker.last_error
        got.append(tracker.layers.objects.data.copy())

    with SAM2VideoTritonClient(video_server.grpc_url) as client:
        state = client.init_state(np.repeat(volume[..., None], 3, axis=-1))  # grey as RGB
        for click, labels in zip(clicks, got, strict=True):
            frame, row, col = click
            client.add_new_points_or_box(state, frame, 1, points=[[col, row]], labels=[1])
            masks = {}
            for reverse in (False, True):
                for f, _, logits in client.propagate_in_video(state, frame, reverse=reverse):
                    masks[f] = logits[0, 0] > 0
            assert sorted(masks) == [0, 1, 2]
            for f in range(z):
                np.testing.assert_array_equal(labels[f] == 1, masks[f], err_msg=f"slice {f}")
        client.close_state(state)
    tracker.close()
    viewer.layers.remove("stack")


@pytest.fixture(scope="module")
def widget(viewer, sam2_tiny_server):
    from triton_sam.napari.widget import SegmentAnythingWidget

    viewer.add_image(_image(), name="cells")
    widget = SegmentAnythingWidget(viewer)
    viewer.window.add_dock_widget(widget, name="Segment Anything (Triton)")
    widget.url.setText(sam2_tiny_server.grpc_url.split("://")[-1])
    widget.protocol.setCurrentText("grpc")
    widget.connect_button.click()
    _settle(widget)
    assert widget.last_error is None, widget.last_error
    yield widget
    widget.close()


def _settle(widget) -> None:
    """Process Qt events until the widget has no request in flight."""
    from qtpy.QtWidgets import QApplication

    deadline = time.monotonic() + WAIT_MS / 1000
    while not widget.idle or widget.hover.busy:
        assert time.monotonic() < deadline, "the widget did not finish its requests"
        QApplication.processEvents()
        time.sleep(0.01)
    QApplication.processEvents()


def _mask(client, coords_rc, labels, box=None) -> np.ndarray:
    coords = None if coords_rc is None else np.asarray(coords_rc, float)[:, ::-1]
    logits, _ = client.predict(coords, None if labels is None else np.asarray(labels), box)
    return logits[0, 0] > 0


def test_points_and_a_box_through_the_widget_give_the_clients_mask(widget, client):
    from triton_sam.napari import layers as L

    widget.embed_button.click()
    _settle(widget)
    points, boxes = widget.layers.points, widget.layers.boxes
    points.add([80, 90])  # positive: new points are positive at first
    L.set_new_point_label(points, "negative")
    points.add([170, 220])
    L.set_new_point_label(points, "positive")
    boxes.add_rectangles(np.array([[30, 40], [30, 150], [130, 150], [130, 40]]))
    widget.segment_button.click()
    _settle(widget)
    expected = _mask(client, [[80, 90], [170, 220]], [1, 0], np.array([40, 30, 150, 130]))
    assert expected.any()
    np.testing.assert_array_equal(widget.layers.objects.data == 1, expected)
    assert set(np.unique(widget.layers.objects.data)) == {0, 1}
    # Tools the server does not offer are hidden: no concept model here.
    assert not widget.concept_button.isVisibleTo(widget)
    assert widget.everything_button.isVisibleTo(widget)


def test_commit_then_undo_takes_back_only_the_last_object(widget, client):
    first = widget.layers.objects.data.copy()
    widget.commit_button.click()
    assert len(widget.layers.points.data) == 0 and len(widget.layers.boxes.data) == 0
    widget.layers.points.add([170, 220])
    widget.segment_button.click()
    _settle(widget)
    second = _mask(client, [[170, 220]], [1]) & (first == 0)  # object 1 keeps its pixels
    assert second.any()
    np.testing.assert_array_equal(widget.layers.objects.data == 2, second)
    widget.undo_button.click()
    np.testing.assert_array_equal(widget.layers.objects.data, first)


def test_auto_mode_segments_when_a_prompt_is_added(widget, client):
    widget.commit_button.click()
    widget.auto.setChecked(True)
    try:
        widget.layers.points.add([60, 260])  # no Segment click
        _settle(widget)
    finally:
        widget.auto.setChecked(False)
    objects = widget.layers.objects.data
    expected = _mask(client, [[60, 260]], [1]) & ~np.isin(objects, [1, 2])  # earlier objects kept
    assert expected.any()
    np.testing.assert_array_equal(objects == widget.object_id, expected)


def test_hover_storm_paints_only_the_latest_preview(widget, client):
    before = widget.hover.counts.submitted
    spots = [(60 + 10 * i, 70 + 12 * i) for i in range(10)]
    for spot in spots:  # one UI-thread burst: answers arrive after the last is asked for
        widget.hover_at(spot)
    _settle(widget)
    counts = widget.hover.counts
    assert counts.failed == 0, widget.last_error
    assert counts.submitted - before == 10
    assert counts.painted == 1  # the newest only
    assert counts.executed + counts.skipped == 10  # each job either ran or was never sent
    assert counts.discarded == counts.executed - 1  # every stale answer that came back
    np.testing.assert_array_equal(widget.layers.preview.data > 0, _mask(client, [spots[-1]], [1]))


def test_segment_everything_fills_labels_like_the_clients_generate_masks(
    widget, client, sam2_tiny_server
):
    params = {"points_per_side": 4, "points_per_batch": 8}
    widget.segment_everything(**params)
    _settle(widget)
    assert widget.last_error is None, widget.last_error
    result = client.generate_masks(grpc_url=sam2_tiny_server.grpc_url, **params)
    expected = np.zeros(SHAPE, np.uint32)
    masks = result.masks()
    for k in sorted(range(len(result)), key=lambda k: -result.instances[k]["area"]):
        expected[masks[k]] = k + 1  # larger first: smaller instances stay on top
    np.testing.assert_array_equal(widget.viewer.layers["SAM everything"].data, expected)
    assert widget.progress.value() == widget.progress.maximum()
    # Cancelled before its first batch is answered: a message, no layer rewritten.
    widget.segment_everything(**params)
    widget.cancel_button.click()
    _settle(widget)
    assert widget.last_error == "Segment everything: cancelled"


def test_a_large_image_goes_through_the_servers_tiled_path(widget, client):
    """Above the size threshold (lowered here for a small image) the widget opens the image
    on the server's sam2_large model and clicks it there, as the client's LargeImage does."""
    widget.session.large_image_pixels = SHAPE[0] * SHAPE[1] - 1
    try:
        widget.embed_button.click()
        _settle(widget)
        assert widget.session.embedded.large is not None, widget.last_error
        widget.commit_button.click()
        before = widget.layers.objects.data.copy()
        widget.layers.points.add([80, 90])
        widget.segment_button.click()
        _settle(widget)
    finally:
        widget.session.large_image_pixels = SHAPE[0] * SHAPE[1] * 64
    with client.open_array(to_sam_rgb(_image()), progress=False) as large:
        (mask,) = large.predict([[90, 80]], [1])
    expected = mask.dense(SHAPE) & (before == 0)  # earlier objects keep their pixels
    np.testing.assert_array_equal(widget.layers.objects.data == widget.object_id, expected)


def test_a_lost_server_is_a_message_not_a_traceback(viewer, widget):
    from triton_sam.napari.widget import SegmentAnythingWidget

    lost = SegmentAnythingWidget(viewer)
    assert not lost.segment_button.isEnabled()  # nothing to click before connecting
    lost.url.setText("127.0.0.1:9")  # the discard port: nothing listens
    lost.connect_button.click()
    _settle(lost)
    assert "no ready Triton server at 127.0.0.1:9" in lost.status.text()
    lost.close()


def test_a_bearer_token_reaches_the_server_through_the_token_proxy(
    viewer, client, sam2_tiny_server
):
    """Behind the shipped nginx token proxy: without the token Connect is refused (a
    message), with it the widget connects and segments; the token is never shown."""
    from triton_sam.napari.widget import SegmentAnythingWidget
    from triton_sam.scaleout.nginx import new_token
    from triton_sam.scaleout.proxy import NginxProxy

    token = new_token()
    server = sam2_tiny_server
    with NginxProxy([server.http_address], [server.grpc_address], tokens={token: "lab"}) as proxy:
        behind = SegmentAnythingWidget(viewer)
        behind.url.setText(proxy.grpc_address)
        behind.connect_button.click()
        _settle(behind)
        assert behind.session is None and "Connect failed" in behind.last_error
        behind.token.setText(token)
        behind.connect_button.click()
        _settle(behind)
        assert behind.last_error is None, behind.last_error
        behind.image.setCurrentText("cells")
        layers = behind.prepare_layers()  # the layers of "cells", shared with other widgets
        behind.object_id = int(layers.objects.data.max()) + 1
        behind.commit()  # clears the prompts left by the tests before
        before = layers.objects.data.copy()
        layers.points.add([80, 90])
        behind.segment_button.click()
        _settle(behind)
        assert behind.last_error is None, behind.last_error
        expected = _mask(client, [[80, 90]], [1]) & (before == 0)
        np.testing.assert_array_equal(layers.objects.data == behind.object_id, expected)
        assert token not in behind.status.text()
        behind.close()


def test_the_manifest_is_valid_and_napari_opens_the_widget(viewer):
    """The manifest the entry point names loads and validates, and napari opens its widget.

    An install made after the entry point was added finds the plugin by discovery; an
    editable install that predates it (re-install to refresh its entry points) has no entry
    point yet, so the declared manifest is registered by hand, from the same resource."""
    from importlib import metadata, resources

    import npe2
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    declared = pyproject["project"]["entry-points"]["napari.manifest"]["triton-sam"]
    module, resource = declared.split(":")
    manifest = npe2.PluginManifest.from_file(resources.files(module) / resource)
    assert manifest.name == "triton-sam"
    assert [w.display_name for w in manifest.contributions.widgets] == ["Segment Anything (Triton)"]
    manager = npe2.PluginManager.instance()
    installed = [
        e for e in metadata.entry_points(group="napari.manifest") if e.name == "triton-sam"
    ]
    if installed:
        assert installed[0].value == declared
        manager.discover()
        assert "triton-sam" in manager
    elif "triton-sam" not in manager:
        manager.register(manifest)
    dock, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything (Triton)")
    assert type(widget).__name__ == "SegmentAnythingWidget"
    viewer.window.remove_dock_widget(dock)


def test_screenshot_for_the_docs(viewer, widget):
    """Writes docs/images/napari-plugin.png only when TRITON_SAM_SCREENSHOTS=1."""
    from PIL import Image

    viewer.window.resize(1280, 760)
    for name in ("SAM everything", "SAM preview"):
        viewer.layers[name].visible = False
    viewer.layers.selection.active = viewer.layers["SAM objects"]
    viewer.reset_view()
    image = viewer.screenshot(canvas_only=False, flash=False)
    assert image.ndim == 3 and image.shape[2] == 4 and image[..., :3].std() > 0
    if os.environ.get("TRITON_SAM_SCREENSHOTS") == "1":
        Image.fromarray(image[..., :3]).save(SCREENSHOT, optimize=True)


def test_click_latency_bench_times_both_paths(viewer, sam2_tiny_server):
    """The bench (``triton-sam bench napari``) on the shared server: 2 timed clicks a path
    here; TRITON_SAM_NAPARI_CLICKS=N times N and prints the table."""
    from triton_sam.bench.napari_latency import napari_click_latency

    clicks = int(os.environ.get("TRITON_SAM_NAPARI_CLICKS", "2"))
    url = sam2_tiny_server.grpc_url.split("://")[-1]
    report = napari_click_latency(url, clicks=clicks, shape=(256, 320), viewer=viewer)
    assert len(report.napari_ms) == len(report.client_ms) == clicks
    print(report.table())
