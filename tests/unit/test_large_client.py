"""The large-image client against a stand-in transport that speaks the contract
(``triton_sam/serving/protocol/large.py``) from memory and records every request."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from large_support import HANDLE, Call, FakeLargeServer, client_over

from triton_sam import HandleNotFoundError, LargeImage, SparseMask
from triton_sam.client.large_image import LargeModel
from triton_sam.client.wire_errors import translate_error
from triton_sam.errors import (
    InputValidationError,
    InvalidRequestError,
    ServerError,
    ServerOverloadedError,
    ServerUnavailableError,
)


def _image(server: FakeLargeServer) -> LargeImage:
    return client_over(server).open_dataset("em/section.zarr")


# -- open ----------------------------------------------------------------------------------


def test_open_dataset_sends_one_open_to_the_familys_large_model():
    server = FakeLargeServer(shape=(10, 7))
    image = client_over(server, "sam1").open_dataset(
        "em/section.zarr", key="0", mapping={"kind": "range", "min": 0, "max": 9},
        tile=512, halo=(64, 32),
    )  # fmt: skip
    [call] = server.calls
    assert call.model == "sam1_large" and call.pixels is None
    assert call.body == {
        "op": "open",
        "dataset": "em/section.zarr",
        "key": "0",
        "mapping": {"kind": "range", "min": 0, "max": 9},
        "tile": [512, 512],
        "halo": [64, 32],
    }
    assert (image.handle, image.shape, image.axes, image.grid) == (HANDLE, (10, 7), "yx", (3, 2))
    assert image.image_size == (10, 7) and image.depth is None


def test_a_halo_of_zero_is_sent_not_taken_for_the_default():
    server = FakeLargeServer()
    client_over(server).open_dataset("em/a.zarr", halo=0)
    client_over(server).open_dataset("em/a.zarr")
    assert server.calls[0].body["halo"] == [0, 0] and "halo" not in server.calls[1].body


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"dataset": "nopath"}, "dataset"),
        ({"dataset": "em/a.zarr", "mapping": {"kind": "gamma"}}, "mapping"),
        ({"dataset": "em/a.zarr", "tile": 0}, "tile"),
        ({"dataset": "em/a.zarr", "halo": (1, 2, 3)}, "halo"),
        ({"dataset": "em/a.zarr", "halo": -1}, "halo"),
    ],
)
def test_bad_open_arguments_are_named_before_anything_is_sent(kwargs, field):
    server = FakeLargeServer()
    with pytest.raises(InputValidationError) as info:
        client_over(server).open_dataset(**kwargs)
    assert info.value.field == field and not server.calls


# -- open_array: pieces ----------------------------------------------------------------------


class BoundedArray:
    """A caller's array (zarr-like): slicing only, each read counted; never read whole."""

    def __init__(self, data: np.ndarray):
        self.data, self.shape, self.dtype = data, data.shape, data.dtype
        self.reads: list[int] = []

    def __getitem__(self, key):
        out = self.data[key]
        self.reads.append(out.size)
        return out

    def __array__(self, *args, **kwargs):
        raise AssertionError("the whole array was read")


@pytest.mark.parametrize(
    "shape, dtype, piece",
    [((10, 7), np.uint16, 4), ((9, 9, 3), np.uint8, 4), ((3, 5, 6), np.float32, 2)],
)
def test_open_array_puts_every_pixel_exactly_once_in_bounded_reads(shape, dtype, piece):
    data = np.arange(math.prod(shape)).reshape(shape).astype(dtype)
    array = BoundedArray(data)
    server = FakeLargeServer()
    image = client_over(server).open_array(array, piece=piece, progress=False)
    assert server.calls[0].body == {"op": "create", "shape": list(shape), "dtype": data.dtype.name}
    np.testing.assert_array_equal(server.canvas, data)
    assert (server.writes == 1).all()  # the pieces tile the image exactly once
    channels = shape[-1] if len(shape) == 3 and shape[-1] == 3 else 1
    assert max(array.reads) <= piece * piece * channels
    assert sum(array.reads) == data.size  # each pixel read once
    assert image.complete and len(server.calls) == 1 + len(array.reads)


def test_open_array_sends_small_ints_and_doubles_as_float32_and_refuses_the_rest():
    server = FakeLargeServer()
    client_over(server).open_array(np.full((3, 3), -5, np.int16), progress=False)
    assert server.calls[0].body["dtype"] == "float32" and (server.canvas == -5).all()
    for bad in (np.zeros((3, 3), np.int32), np.zeros((3,), np.uint8), [[1, 2]]):
        with pytest.raises(InputValidationError, match="array: "):
            client_over(server).open_array(bad, progress=False)


def test_a_failed_upload_closes_the_half_sent_image():
    server = FakeLargeServer()
    answer = server.infer

    def infer(model, inputs, outputs, **kwargs):  # the second put fails
        if server.ops().count("put") == 1 and b'"put"' in inputs["request"][0]:
            server.calls.append(Call(model, {"op": "put"}, None, None))
            raise ServerError("disk full")
        return answer(model, inputs, outputs, **kwargs)

    server.infer = infer
    with pytest.raises(ServerError, match="disk full"):
        client_over(server).open_array(np.zeros((10, 7), np.uint8), piece=4, progress=False)
    assert server.ops() == ["create", "put", "put", "close"] and server.closed


# -- predict -----------------------------------------------------------------------------------


def test_predict_sends_full_image_prompts_and_answers_sparse_masks():
    server = FakeLargeServer(shape=(10, 7))
    image = _image(server)
    [mask] = image.predict(
        point_coords=[[2.5, 5.0], [3, 6]], point_labels=[1, 0], box=[1, 4, 4, 8],
        multimask_output=True, mode="window",
    )  # fmt: skip
    assert server.calls[-1].body == {
        "op": "predict",
        "handle": HANDLE,
        "mode": "window",
        "multimask_output": True,
        "points": [[2.5, 5.0], [3.0, 6.0]],
        "labels": [1, 0],
        "box": [1.0, 4.0, 4.0, 8.0],
    }
    assert isinstance(mask, SparseMask) and mask.offset == (5, 2) and mask.area == 3
    assert sorted(zip(*np.nonzero(mask.dense(image.image_size)), strict=True)) == [
        (5, 2), (6, 2), (6, 3),
    ]  # fmt: skip
    answer = image.last_answer
    assert (answer.tiles, answer.embedded, answer.mode) == ((3,), 1, "window")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"point_coords": [[8, 1]], "point_labels": [1]}, "point_coords"),  # x past 7 cols
        ({"point_coords": [[1, 1]], "point_labels": [2]}, "point_labels"),
        ({}, "point_coords"),
        ({"box": [1, 1, 2, 2], "mode": "tiles"}, "mode"),
        ({"box": [1, 1, 2, 2], "z": 0}, "z"),  # a 2-D image has no slices
    ],
)
def test_bad_prompts_are_named_before_anything_is_sent(kwargs, field):
    server = FakeLargeServer(shape=(10, 7))
    image = _image(server)
    with pytest.raises(InputValidationError) as info:
        image.predict(**kwargs)
    assert info.value.field == field and server.ops() == ["open"]


def test_a_volume_needs_its_slice():
    server = FakeLargeServer(shape=(4, 10, 7))
    image = _image(server)
    assert image.depth == 4 and image.image_size == (10, 7)
    for z in (None, 4, -1):
        with pytest.raises(InputValidationError, match="z: .*0..3"):
            image.predict(box=[1, 1, 2, 2], z=z)
    image.predict(box=[1, 1, 2, 2], z=2)
    assert server.calls[-1].body["z"] == 2


# -- precompute --------------------------------------------------------------------------------


def test_precompute_resumes_from_the_tiles_the_server_holds():
    server = FakeLargeServer(shape=(10, 7), tile=(4, 4), held={0, 1})  # 3 x 2 = 6 tiles
    image = _image(server)
    result = image.precompute(progress=False, batch=2)
    assert server.ops() == ["open", "status", "embed", "embed"]
    assert [c.body["tiles"] for c in server.calls[2:]] == [[2, 3], [4, 5]]
    assert (result.tiles, result.embedded, result.held, result.remaining) == (6, 4, 2, 0)
    again = image.precompute(progress=False, batch=2)
    assert server.ops()[-1] == "status" and (again.embedded, again.held) == (0, 6)


def test_precompute_a_region_embeds_the_tiles_touching_it():
    server = FakeLargeServer(shape=(10, 7), tile=(4, 4))
    _image(server).precompute(region=(3, 3, 5, 5), progress=False)
    assert server.calls[-1].body["tiles"] == [0, 1, 2, 3]  # rows 0-1 x cols 0-1 of the grid
    for region in ((0, 0, 11, 7), (5, 5, 5, 6), (0, 0, 1)):
        with pytest.raises(InputValidationError, match="region: "):
            _image(server).precompute(region=region, progress=False)


def test_cancel_stops_between_batches_and_says_what_remains():
    server = FakeLargeServer(shape=(10, 7), tile=(4, 4))
    cancel = threading.Event()
    server.on_embed = cancel.set  # set while the first batch is answered
    result = _image(server).precompute(progress=False, batch=2, cancel=cancel)
    assert server.ops().count("embed") == 1
    assert result.cancelled and (result.embedded, result.remaining) == (2, 4)


def test_overloaded_is_retried_with_backoff_and_other_errors_are_not():
    server = FakeLargeServer(shape=(10, 7), tile=(4, 4))
    image = _image(server)
    waits: list[float] = []
    image.model.sleep = waits.append
    server.fail = [ServerOverloadedError("busy"), ServerOverloadedError("busy")]
    result = image.precompute(progress=False)
    assert result.embedded == 6 and len(waits) == 2 and waits[1] > waits[0] > 0
    server.fail = [InvalidRequestError("request.tiles: 17 ids, expected at most 16")]
    with pytest.raises(InvalidRequestError, match="request.tiles"):
        image.precompute(progress=False)


def test_open_is_retried_after_overloaded_only():
    server = FakeLargeServer()
    model = LargeModel(server, "sam2_large")
    model.sleep = lambda s: None
    server.fail = [ServerOverloadedError("busy")]
    assert model.call({"op": "open", "dataset": "em/a"})["handle"] == HANDLE
    server.fail = [ServerUnavailableError("connection reset")]  # may have issued a handle
    with pytest.raises(ServerUnavailableError):
        model.call({"op": "open", "dataset": "em/a"})
    assert server.ops() == ["open", "open", "open"]


# -- handles -----------------------------------------------------------------------------------


def test_close_forgets_the_handle_and_a_closed_image_says_to_open_again():
    server = FakeLargeServer()
    with _image(server) as image:
        pass
    assert server.ops() == ["open", "close"]
    image.close()  # idempotent: nothing sent
    with pytest.raises(HandleNotFoundError, match="open it again"):
        image.predict(box=[1, 1, 2, 2])
    assert server.ops() == ["open", "close"]


def test_a_handle_the_server_lost_raises_and_closing_it_is_quiet():
    server = FakeLargeServer()
    image = _image(server)
    server.closed = True  # evicted, or the server restarted
    with pytest.raises(HandleNotFoundError):
        image.precompute(progress=False)
    image.close()


def test_every_request_of_an_image_carries_one_routing_key_never_the_handle():
    server = FakeLargeServer()
    image = _image(server)
    image.predict(box=[1, 1, 2, 2])
    image.close()
    keys = {c.routing_key for c in server.calls}
    assert len(keys) == 1 and None not in keys and HANDLE not in keys


# -- the server's errors, as the one translator maps them --------------------------------------


@pytest.mark.parametrize("status", ["404", "StatusCode.NOT_FOUND"])
def test_handle_not_found_maps_to_its_error(status):
    from tritonclient.utils import InferenceServerException

    e = InferenceServerException(
        msg="triton_sam.HandleNotFound: request.handle: not held", status=status
    )
    error = translate_error(e, what="infer on sam2_large")
    assert isinstance(error, HandleNotFoundError) and "open it again" in str(error)


def test_overloaded_and_invalid_input_map_to_their_errors():
    from tritonclient.utils import InferenceServerException

    busy = InferenceServerException(msg="triton_sam.Overloaded: opens: 8 waiting", status="503")
    assert isinstance(translate_error(busy, what="x"), ServerOverloadedError)
    bad = InferenceServerException(
        msg="triton_sam.InvalidInput: request.tile: [10, 10], expected >= 64", status="400"
    )
    error = translate_error(bad, what="x")
    assert isinstance(error, InvalidRequestError) and "request.tile" in str(error)
