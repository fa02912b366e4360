"""The napari plugin's Qt-free parts: prompts from layers, masks into labels (with undo),
latest-wins, what a server offers, and the pixel mapping it shares with the server."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from triton_sam import EverythingResult, ServedModel, resolve_pixel_mapping, to_sam_rgb
from triton_sam.napari.labels import everything_labels, replace_object
from triton_sam.napari.latest import LatestOnly
from triton_sam.napari.prompts import box_prompt, combine, points_prompt
from triton_sam.napari.session import Offer
from triton_sam.serving.datasets import pixels
from triton_sam.serving.masks import encode_rle


def test_points_on_the_slice_become_xy_clicks_with_their_labels():
    coords = np.array([[1, 10, 20], [2, 11, 21], [1, 30, 40]], float)  # (z, row, col)
    prompt = points_prompt(coords, ["positive", "negative", "negative"], z=1)
    np.testing.assert_array_equal(prompt.point_coords, [[20, 10], [40, 30]])
    np.testing.assert_array_equal(prompt.point_labels, [1, 0])
    assert points_prompt(coords, ["positive"] * 3, z=0).empty
    assert points_prompt(np.empty((0, 2)), [], None).empty


def test_the_last_rectangle_on_the_slice_is_the_box():
    rect = np.array([[5, 6], [5, 30], [25, 30], [25, 6]], float)  # (row, col) corners
    ellipse = rect + 1
    prompt = box_prompt([rect, ellipse], ["rectangle", "ellipse"])
    np.testing.assert_array_equal(prompt.box, [6, 5, 30, 25])  # X0, Y0, X1, Y1
    on_slice_2 = np.hstack([np.full((4, 1), 2.0), rect])
    assert box_prompt([on_slice_2], ["rectangle"], z=1).empty
    both = combine(points_prompt(rect[:1], ["positive"]), box_prompt([rect], ["rectangle"]))
    assert both.point_coords.shape == (1, 2) and both.box is not None


def test_a_segmentation_is_one_undo_step_and_spares_other_objects():
    from napari.layers import Labels

    layer = Labels(np.zeros((2, 6, 8), np.uint32))
    other = np.zeros((6, 8), bool)
    other[0, :] = True
    replace_object(layer, {1: other}, 7)
    first = np.zeros((6, 8), bool)
    first[:3, :3] = True
    assert replace_object(layer, {1: first}, 1) == 6  # row 0 belongs to object 7
    second = np.zeros((6, 8), bool)
    second[2:5, 2:5] = True  # object 1 moves: its old pixels become background
    replace_object(layer, {1: second}, 1)
    assert (layer.data[1] == 1).sum() == 9 and (layer.data[1] == 7).sum() == 8
    layer.undo()
    np.testing.assert_array_equal(layer.data[1] == 1, first & ~other)
    layer.undo()
    assert (layer.data == 1).sum() == 0 and (layer.data == 7).sum() == 8


def test_everything_labels_paint_larger_instances_first():
    big = np.zeros((4, 5), bool)
    big[:, :4] = True
    small = np.zeros((4, 5), bool)
    small[1:3, 1:3] = True
    records = [
        {"segmentation": {"size": [4, 5], "counts": encode_rle(m).decode()}, "area": int(m.sum())}
        for m in (small, big)
    ]
    labels = everything_labels(EverythingResult((4, 5), records))
    expected = np.where(small, 1, np.where(big, 2, 0))  # instance k is label k + 1
    np.testing.assert_array_equal(labels, expected)


def test_latest_wins_skips_superseded_jobs_and_discards_stale_answers():
    delivered = []
    hold = threading.Event()
    started = threading.Event()
    latest = LatestOnly(delivered.append)  # answers are shown when the test runs them
    shown = []

    def first():
        started.set()
        hold.wait(10)
        return "first"

    latest.submit(first, lambda a, e: shown.append(a))
    assert started.wait(10)
    latest.submit(lambda: "second", lambda a, e: shown.append(a))  # replaced before it runs
    latest.submit(lambda: "third", lambda a, e: shown.append(a))
    hold.set()
    for _ in range(2):
        while not delivered:
            threading.Event().wait(0.01)
        delivered.pop(0)()  # on "the UI thread"
    latest.close()
    assert shown == ["third"]
    c = latest.counts
    assert (c.submitted, c.skipped, c.executed, c.painted, c.discarded) == (3, 1, 2, 1, 1)


def test_the_offer_shows_only_the_tools_the_server_has():
    models = [
        ServedModel("sam2_session", "session", "sam2"),
        ServedModel("sam2_everything", "everything", "sam2"),
        ServedModel("sam3_concept", "concept", "sam3_concept"),
    ]
    offer = Offer.of(models)
    assert offer.families == ["sam2"] and offer.everything == {"sam2"}
    assert offer.concepts and not offer.tracker and not offer.large
    assert not Offer.of(models[:1]).concepts


def test_z_propagation_tracks_with_the_family_of_the_clicks_when_the_server_has_it():
    from triton_sam.client.catalog import _family

    # the catalog names a tracker's family from its model name
    assert _family("sam3_tracker", "tracker") == "sam3"
    assert _family("sam2_tracker", "tracker") == "sam2"
    both = Offer.of(
        [ServedModel(f"sam{i}_tracker", "tracker", f"sam{i}") for i in (2, 3)]
        + [ServedModel("sam3_session", "session", "sam3")]
    )
    assert both.tracker and both.trackers == {"sam2", "sam3"}
    assert both.tracker_for("sam3") == "sam3_tracker"
    assert both.tracker_for("sam1") == "sam2_tracker"  # no SAM1 tracker: SAM2.1's
    assert both.tracker_for(None) == "sam2_tracker"  # a tracker-only server
    only3 = Offer.of([ServedModel("sam3_tracker", "tracker", "sam3")])
    assert only3.tracker_for("sam2") == "sam3_tracker"


def test_pixels_in_memory_map_as_the_server_maps_them():
    rng = np.random.default_rng(0)
    volume = rng.integers(0, 4000, (3, 20, 30)).astype(np.uint16)
    mapping = resolve_pixel_mapping(volume, volume=True)
    low, high = np.percentile(volume[1].astype(np.float64), [1, 99])  # the middle slice
    assert mapping == {"kind": "range", "min": low, "max": high}
    rgb = to_sam_rgb(volume[0], mapping)
    served = pixels.to_rgb(volume[0], pixels.Mapping("range", min=low, max=high))
    np.testing.assert_array_equal(rgb, served)
    grey = rng.integers(0, 255, (4, 5)).astype(np.uint8)
    np.testing.assert_array_equal(to_sam_rgb(grey), np.repeat(grey[..., None], 3, axis=-1))
    from triton_sam import InputValidationError

    with pytest.raises(InputValidationError) as info:
        to_sam_rgb(grey, {"kind": "percentile", "low": 1, "high": 99})
    assert info.value.field == "mapping"


def test_a_token_becomes_the_proxys_bearer_header_and_a_bad_one_is_refused():
    from triton_sam import InputValidationError
    from triton_sam.client.endpoint import bearer_headers

    assert bearer_headers(None) == {}
    assert bearer_headers("abc123") == {"authorization": "Bearer abc123"}  # gRPC: lower case
    for bad in ("", "two words", "line\nbreak"):
        with pytest.raises(InputValidationError) as info:
            bearer_headers(bad)
        assert info.value.field == "token" and bad not in str(info.value) or bad == ""
