"""A large image's pixels and its tiled segment-everything, from the client's side, over the
large model's stand-in (``tests/large_support.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from large_support import HANDLE, FakeLargeServer, client_over

from triton_sam.client import everything as job
from triton_sam.client.endpoint import Endpoint
from triton_sam.client.everything import EverythingResult
from triton_sam.client.large_views import ServerVolume
from triton_sam.client.volume import window_source
from triton_sam.errors import InputValidationError
from triton_sam.serving.protocol import everything as everything_protocol
from triton_sam.serving.tiles import Block


def opened(shape=(40, 30), **options):
    server = FakeLargeServer(shape=shape, tile=(16, 16), halo=(4, 4), **options)
    return server, client_over(server).open_dataset("em/x.zarr")


def test_read_asks_for_the_block_and_answers_the_mapped_pixels():
    server, image = opened()
    rgb = image.read((2, 3, 10, 20))
    assert rgb.shape == (8, 17, 3) and rgb.dtype == np.uint8
    assert rgb[1, 2, 0] == 3 + 5  # row 3, col 5 of the stand-in's pattern
    assert server.calls[-1].body == {"op": "read", "handle": HANDLE, "block": [2, 3, 10, 20]}
    coarse = image.read((0, 0, 40, 30), step=4)
    assert coarse.shape == (10, 8, 3) and server.calls[-1].body["step"] == 4


def test_a_block_outside_the_image_is_refused_before_sending():
    server, image = opened()
    sent = len(server.calls)
    for block in ((0, 0, 41, 30), (5, 5, 5, 9), (0, 0, 10)):
        with pytest.raises(InputValidationError, match="block"):
            image.read(block)
    assert len(server.calls) == sent


def test_a_server_volume_slices_like_an_array_a_window_at_a_time():
    server, image = opened(shape=(6, 40, 30))
    volume = ServerVolume(image)
    assert volume.shape == (6, 40, 30, 3) and volume.dtype == np.uint8
    frames = window_source(volume, Block((8, 4), (24, 20)))  # what the volume tracker reads
    frame = frames.pixels(2)
    assert frame.shape == (16, 16, 3)
    sent = server.calls[-1].body
    assert sent == {"op": "read", "handle": HANDLE, "block": [8, 4, 24, 20], "z": 2}
    assert frame[0, 0, 0] == 8 + 4 + 2


def test_only_volumes_have_a_server_volume():
    _, image = opened()
    with pytest.raises(InputValidationError, match="volume"):
        ServerVolume(image)


def test_segment_everything_runs_one_job_per_tile_on_the_handle(monkeypatch):
    server, image = opened()
    server.endpoint, server.tls = Endpoint("localhost:8001", "grpc", False), None
    seen = []

    def generate(endpoint, model, inputs, **options):
        seen.append((model, inputs[everything_protocol.HANDLE][0].decode(),
                     inputs[everything_protocol.BLOCK].tolist()))  # fmt: skip
        return EverythingResult((1, 1), [])

    monkeypatch.setattr(job, "generate", generate)
    result = image.segment_everything(points_per_side=4)
    assert result.tiles == 6 and len(result) == 0
    assert {model for model, _, _ in seen} == {"sam2_everything"}
    assert {handle for _, handle, _ in seen} == {HANDLE}
    assert seen[0][2] == [0, 0, 20, 20]  # tile 0 with its halo, clipped at the image's edge
    with pytest.raises(InputValidationError, match="params"):
        image.segment_everything(points_per_side=0)
