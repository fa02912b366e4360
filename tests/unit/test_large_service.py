"""The large model's ops without Triton: uploads, tile / window / auto predictions, precompute,
status, handles and admission, over a stand-in session model and stand-in readers
(tests/large_stand_in.py; the live model: tests/integration/test_large_images.py)."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from large_stand_in import Datasets, Pixels, Session

from triton_sam.serving import protocol as envelope
from triton_sam.serving.bounds import RequestError
from triton_sam.serving.large import crop, service
from triton_sam.serving.protocol.large import LargeSettings

TILE, HALO = 64, 16


@pytest.fixture
def stand_ins(monkeypatch):
    files = {"em/section.zarr": np.zeros((200, 300), np.uint8)}
    datasets = Datasets(files)
    monkeypatch.setattr(service, "pixel_mapping", lambda: Pixels)
    monkeypatch.setattr(service, "datasets", lambda: datasets)
    return datasets


def make(tmp_path, **settings):
    session = Session()
    pools = ThreadPoolExecutor(2), ThreadPoolExecutor(2)
    base = {"family": "sam2", "session_model": "sam2_session", "spool_dir": str(tmp_path)}
    large = service.Service(
        LargeSettings(**(base | settings)), session, clicks=pools[0], background=pools[1]
    )
    return large, session


def call(large, request, pixels=None, tenant=""):
    blob = json.dumps(request).encode()
    return asyncio.run(large.answer(tenant, blob, pixels))


def upload(large, image, tenant="", **extra):
    made = call(
        large,
        {"op": "create", "shape": list(image.shape), "dtype": str(image.dtype), **extra},
        tenant=tenant,
    )
    handle = made["handle"]
    half = image.shape[0] // 2
    call(large, {"op": "put", "handle": handle, "offset": [0, 0]}, image[:half, :, None], tenant)
    done = call(
        large, {"op": "put", "handle": handle, "offset": [half, 0]}, image[half:, :, None], tenant
    )
    assert done == {"received": image.shape[0] * image.shape[1], "complete": True}
    return handle


def square(shape, top_left, side):
    image = np.zeros(shape, np.uint8)
    r, c = top_left
    image[r : r + side, c : c + side] = 200
    return image


def test_tile_mode_answers_the_tile_blocks_mask_in_full_image_pixels(tmp_path, stand_ins):
    large, session = make(tmp_path, tile=TILE, halo=HALO)
    image = square((160, 200), (70, 75), 10)  # inside tile (1, 1)'s core
    handle = upload(large, image, tile=[TILE, TILE], halo=[HALO, HALO])
    got = call(large, {"op": "predict", "handle": handle, "points": [[80, 75]], "labels": [1]})
    assert got["mode"] == "tile" and got["tiles"] == [1 * 4 + 1] and got["embedded"] == 1
    assert got["block"] == [64 - HALO, 64 - HALO, 128 + HALO, 128 + HALO]
    (mask,) = got["masks"]
    assert mask["offset"] == [70, 75] and mask["size"] == [10, 10] and mask["area"] == 100
    assert mask["box"] == [75, 70, 84, 79] and not mask["cut"]
    assert np.array_equal(crop.paste(mask, image.shape), image > 127)
    # the session saw the click in the block's frame
    assert session.predicted[-1]["points"].tolist() == [[80 - 48, 75 - 48]]
    again = call(large, {"op": "predict", "handle": handle, "points": [[80, 75]], "labels": [1]})
    assert again["embedded"] == 0 and session.encoded == 1  # the block's id was remembered


def test_auto_answers_an_object_cut_by_its_tile_on_a_window_that_holds_it(tmp_path, stand_ins):
    large, _ = make(tmp_path, tile=TILE, halo=HALO, window=96)
    image = square((160, 200), (50, 70), 40)  # crosses the tile edge at 64 (+ halo: 80)
    handle = upload(large, image, tile=[TILE, TILE], halo=[HALO, HALO])
    click = {"op": "predict", "handle": handle, "points": [[75, 55]], "labels": [1]}
    tiled = call(large, {**click, "mode": "tile"})
    assert tiled["mode"] == "tile" and tiled["masks"][0]["cut"]
    assert tiled["masks"][0]["area"] < 40 * 40  # micro-sam's rule cuts it at the halo
    auto = call(large, click)
    assert auto["mode"] == "window" and not auto["masks"][0]["cut"]
    assert np.array_equal(crop.paste(auto["masks"][0], image.shape), image > 127)
    window = call(large, {**click, "mode": "window"})
    assert window["mode"] == "window" and window["block"][2] - window["block"][0] == 96


def test_points_outside_the_tile_are_dropped_and_counted(tmp_path, stand_ins):
    large, session = make(tmp_path, tile=TILE, halo=HALO)
    handle = upload(large, square((160, 200), (70, 75), 10), tile=[TILE, TILE], halo=[HALO, HALO])
    got = call(
        large,
        {
            "op": "predict",
            "handle": handle,
            "points": [[70, 70], [90, 90], [150, 70]],  # the last one is past 128 + 16
            "labels": [1, 1, 0],
            "mode": "tile",
        },
    )
    assert got["dropped"] == 1 and len(session.predicted[-1]["points"]) == 2


def test_multimask_answers_best_first(tmp_path, stand_ins):
    large, _ = make(tmp_path, tile=TILE, halo=HALO)
    handle = upload(large, square((64, 64), (10, 10), 5), tile=[TILE, TILE], halo=[0, 0])
    got = call(
        large,
        {"op": "predict", "handle": handle, "box": [8, 8, 20, 20], "multimask_output": True},
    )
    scores = [m["score"] for m in got["masks"]]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)


def test_a_forgotten_embedding_is_embedded_again_once(tmp_path, stand_ins):
    large, session = make(tmp_path)
    handle = upload(large, square((64, 64), (10, 10), 5))
    click = {"op": "predict", "handle": handle, "points": [[12, 12]], "labels": [1]}
    assert call(large, click)["embedded"] == 1
    session.forget()  # the session model evicted it (or restarted)
    got = call(large, click)
    assert got["embedded"] == 1 and got["masks"][0]["area"] == 25 and session.encoded == 2


def test_precompute_embeds_the_listed_tiles_and_status_says_which_are_held(tmp_path, stand_ins):
    large, session = make(tmp_path, tile=TILE, halo=HALO, max_tiles_per_request=3)
    rng = np.random.default_rng(0)
    handle = upload(large, rng.integers(0, 255, (128, 128), dtype=np.uint8), tile=[64, 64])
    assert call(large, {"op": "status", "handle": handle})["held"] == []
    assert call(large, {"op": "embed", "handle": handle, "tiles": [0, 3]}) == {
        "embedded": [0, 3],
        "held": [],
    }
    assert call(large, {"op": "embed", "handle": handle, "tiles": [3, 1]}) == {
        "embedded": [1],
        "held": [3],
    }
    status = call(large, {"op": "status", "handle": handle})
    assert status["held"] == [0, 1, 3] and status["grid"] == [2, 2] and status["complete"]
    session.forget()
    assert call(large, {"op": "status", "handle": handle})["held"] == []
    for tiles in ([4], [0, 0], [0, 1, 2, 3], []):  # outside the grid, twice, too many, none
        with pytest.raises(RequestError, match="request.tiles"):
            call(large, {"op": "embed", "handle": handle, "tiles": tiles})


def test_an_incomplete_upload_is_refused_for_predict_and_embed(tmp_path, stand_ins):
    large, _ = make(tmp_path)
    made = call(large, {"op": "create", "shape": [32, 32], "dtype": "uint8"})
    assert not made["complete"] and made["axes"] == "yx"
    handle = made["handle"]
    got = call(
        large, {"op": "put", "handle": handle, "offset": [0, 0]}, np.ones((16, 32, 1), np.uint8)
    )
    assert got == {"received": 16 * 32, "complete": False}
    for request in (
        {"op": "predict", "handle": handle, "points": [[1, 1]], "labels": [1]},
        {"op": "embed", "handle": handle, "tiles": [0]},
    ):
        with pytest.raises(RequestError, match="request.handle: the image is not complete"):
            call(large, request)


def test_handles_belong_to_their_tenant_and_forged_ones_miss(tmp_path, stand_ins):
    large, _ = make(tmp_path)
    handle = upload(large, square((32, 32), (1, 1), 4), tenant="a")
    for tenant, value in (("b", handle), ("", handle), ("a", "0" * 32)):
        with pytest.raises(envelope.ProtocolError) as e:
            call(large, {"op": "status", "handle": value}, tenant=tenant)
        assert e.value.code == envelope.ERR_HANDLE_NOT_FOUND
    call(large, {"op": "close", "handle": handle}, tenant="a")
    with pytest.raises(envelope.ProtocolError, match="request.handle"):
        call(large, {"op": "status", "handle": handle}, tenant="a")


def test_open_reads_a_dataset_under_a_data_root_for_its_tenants_only(tmp_path, stand_ins):
    roots = json.dumps({"lab": {"path": "/data", "tenants": ["a"]}})
    large, _ = make(tmp_path, data_roots=roots, tile=128, halo=0)
    opened = call(large, {"op": "open", "dataset": "lab/em/section.zarr"}, tenant="a")
    assert opened["shape"] == [200, 300] and opened["grid"] == [2, 3]
    assert opened["mapping"] == {"kind": "none", "resolved": True} and opened["complete"]
    for tenant, dataset in (("b", "lab/em/section.zarr"), ("a", "lab/../etc/passwd")):
        with pytest.raises(RequestError, match="request.dataset"):
            call(large, {"op": "open", "dataset": dataset}, tenant=tenant)
    with pytest.raises(RequestError, match="request.mapping"):
        call(large, {"op": "open", "dataset": "lab/em/section.zarr", "mapping": 3}, tenant="a")
    assert stand_ins.opened[-1].closed  # a refused mapping closes what it opened
    with pytest.raises(RequestError, match="request.handle: an opened dataset takes no pieces"):
        call(
            large,
            {"op": "put", "handle": opened["handle"], "offset": [0, 0]},
            np.zeros((1, 1, 1), np.uint8),
            "a",
        )


def test_opens_past_their_line_are_refused_overloaded(tmp_path, stand_ins):
    large, _ = make(tmp_path, max_concurrent_opens=1, max_waiting_opens=1)
    started = []

    async def burst():
        await large.opens.acquire()  # an open in progress holds the one slot
        started.append(1)
        request = json.dumps({"op": "create", "shape": [8, 8], "dtype": "uint8"}).encode()
        waiting = asyncio.ensure_future(large.answer("", request, None))
        await asyncio.sleep(0)
        with pytest.raises(envelope.ProtocolError) as refused:
            await large.answer("", request, None)
        large.opens.release()
        return refused.value.code, await waiting

    code, answered = asyncio.run(burst())
    assert code == envelope.ERR_OVERLOADED and answered["shape"] == [8, 8]


def test_puts_past_their_line_are_refused_overloaded_and_their_pieces_not_kept(tmp_path, stand_ins):
    """Each put holds its piece in memory until it is written: puts in work and waiting are
    bounded, past that a put is refused Overloaded (the client retries it), so a burst of
    uploads never holds more than a few pieces."""
    large, _ = make(tmp_path, max_concurrent_puts=1, max_waiting_puts=1)
    handle = call(large, {"op": "create", "shape": [8, 8], "dtype": "uint8"})["handle"]
    piece = np.ones((4, 8, 1), np.uint8)

    def put(offset):
        body = {"op": "put", "handle": handle, "offset": [offset, 0]}
        return large.answer("", json.dumps(body).encode(), piece)

    async def burst():
        await large.puts.acquire()  # a put in work holds the one slot
        waiting = asyncio.ensure_future(put(0))
        await asyncio.sleep(0)
        with pytest.raises(envelope.ProtocolError) as refused:
            await put(4)
        large.puts.release()
        return refused.value.code, await waiting, await put(4)

    code, first, second = asyncio.run(burst())
    assert code == envelope.ERR_OVERLOADED
    assert first == {"received": 32, "complete": False}
    assert second == {"received": 64, "complete": True}  # the refused put, sent again


def test_pixels_only_with_a_put_and_a_put_only_with_pixels(tmp_path, stand_ins):
    large, _ = make(tmp_path)
    handle = call(large, {"op": "create", "shape": [8, 8], "dtype": "uint8"})["handle"]
    with pytest.raises(RequestError, match="^pixels: given to 'status'"):
        call(large, {"op": "status", "handle": handle}, np.zeros((1, 1, 1), np.uint8))
    with pytest.raises(RequestError, match="^pixels: missing"):
        call(large, {"op": "put", "handle": handle, "offset": [0, 0]})
    with pytest.raises(envelope.ProtocolError, match="max_piece_pixels") as e:
        big = make(tmp_path, max_piece_pixels=4)[0]
        h = call(big, {"op": "create", "shape": [8, 8], "dtype": "uint8"})["handle"]
        call(big, {"op": "put", "handle": h, "offset": [0, 0]}, np.zeros((3, 2, 1), np.uint8))
    assert e.value.code == envelope.ERR_LIMIT


def test_prompts_outside_the_image_are_refused_naming_the_field(tmp_path, stand_ins):
    large, _ = make(tmp_path)
    handle = upload(large, square((32, 32), (1, 1), 4))
    for prompt, name in (
        ({"points": [[32, 0]], "labels": [1]}, "request.points"),
        ({"box": [40, 40, 50, 50]}, "request.box"),
        ({"points": [[1, 1]], "labels": [1], "z": 0}, "request.z"),
        ({"points": [[1, 1]], "labels": [1], "mode": "tiles"}, "request.mode"),
    ):
        with pytest.raises(RequestError, match=name):
            call(large, {"op": "predict", "handle": handle, **prompt})


def test_auto_tries_at_most_two_windows_and_says_when_the_last_still_cuts(tmp_path, stand_ins):
    large, session = make(tmp_path, tile=TILE, halo=HALO, window=64)
    image = square((256, 256), (20, 20), 200)  # larger than any window
    handle = upload(large, image, tile=[TILE, TILE], halo=[HALO, HALO])
    got = call(large, {"op": "predict", "handle": handle, "points": [[70, 70]], "labels": [1]})
    assert got["mode"] == "window" and got["masks"][0]["cut"]
    # the tile, then a window centred on it; the next window, centred on that window's mask,
    # is the same block again: not run twice
    assert len(session.predicted) == 2 and got["block"] == [64, 64, 128, 128]


@pytest.mark.parametrize(("tile", "halo"), [(64, 16), (64, 100), (80, 0)])
def test_status_finds_every_remembered_tile_whatever_its_halo(tmp_path, stand_ins, tile, halo):
    large, _ = make(tmp_path, max_block=512)
    rng = np.random.default_rng(1)
    image = rng.integers(0, 255, (200, 230), dtype=np.uint8)
    handle = upload(large, image, tile=[tile, tile], halo=[halo, halo])
    count = call(large, {"op": "status", "handle": handle})["grid"]
    ids = list(range(count[0] * count[1]))
    for start in range(0, len(ids), 16):
        call(large, {"op": "embed", "handle": handle, "tiles": ids[start : start + 16]})
    call(
        large,
        {"op": "predict", "handle": handle, "points": [[5, 5]], "labels": [1], "mode": "window"},
    )  # a window is remembered too, and is no tile
    assert call(large, {"op": "status", "handle": handle})["held"] == ids


def test_an_evicted_or_closed_upload_leaves_no_file_and_frees_its_bytes(tmp_path, stand_ins):
    large, _ = make(tmp_path, max_handles=1)
    first = call(large, {"op": "create", "shape": [16, 16], "dtype": "uint8"})
    assert len(list(tmp_path.iterdir())) == 1 and large.spool.used[""] == 2 * 16 * 16
    second = call(large, {"op": "create", "shape": [8, 8], "dtype": "uint8"})  # evicts first
    assert len(list(tmp_path.iterdir())) == 1 and large.spool.used[""] == 2 * 8 * 8
    with pytest.raises(envelope.ProtocolError, match="request.handle"):
        call(large, {"op": "status", "handle": first["handle"]})
    call(large, {"op": "close", "handle": second["handle"]})
    assert not list(tmp_path.iterdir()) and "" not in large.spool.used
