"""Videos and volumes as frames (client side, no server)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from PIL import Image

from triton_sam.client.video_source import open_video
from triton_sam.errors import InputValidationError


def _save(path, value, size=(7, 5)):
    Image.fromarray(np.full((size[1], size[0], 3), value, np.uint8)).save(path)
    return path


def test_a_folder_is_read_in_frame_number_order_as_file_bytes(tmp_path):
    for i in (10, 2, 1):
        _save(tmp_path / f"{i}.png", i)
    (tmp_path / "notes.txt").write_text("not a frame")
    video = open_video(tmp_path)
    assert (video.num_frames, video.height, video.width, video.is_volume) == (3, 5, 7, False)
    assert [int(video.pixels(i)[0, 0, 0]) for i in range(3)] == [1, 2, 10]
    assert video.encoded(0) == (tmp_path / "1.png").read_bytes()


def test_names_that_are_not_numbers_sort_by_name(tmp_path):
    for name, value in (("b.png", 2), ("a.png", 1)):
        _save(tmp_path / name, value)
    assert int(open_video(tmp_path).pixels(0)[0, 0, 0]) == 1


def test_frames_of_another_size_are_refused_when_read(tmp_path):
    _save(tmp_path / "0.png", 1)
    _save(tmp_path / "1.png", 1, size=(9, 9))
    video = open_video(tmp_path)
    with pytest.raises(InputValidationError, match="frame 0 7x5"):
        video.pixels(1)


def test_grayscale_volume_keeps_its_pixels():
    volume = np.arange(3 * 4 * 5, dtype=np.uint8).reshape(3, 4, 5)
    video = open_video(volume)
    assert (video.num_frames, video.height, video.width, video.is_volume) == (3, 4, 5, True)
    np.testing.assert_array_equal(video.pixels(2), volume[2])
    assert video.encoded(0) is None


def test_a_16_bit_volume_is_scaled_over_its_whole_range():
    volume = np.array([[[1000, 3000]], [[2000, 5000]]], np.uint16)
    video = open_video(volume)
    assert video.pixels(0).tolist() == [[0, 128]] and video.pixels(1).tolist() == [[64, 255]]
    assert open_video(np.ones((2, 2, 2), bool)).pixels(0).max() == 255


@pytest.mark.parametrize(
    "shape", [(4, 5), (2, 4, 5, 2), (1, 2, 3, 4, 3), (0, 4, 5)], ids=["2d", "c2", "5d", "empty"]
)
def test_a_volume_of_the_wrong_rank_names_the_field(shape):
    with pytest.raises(InputValidationError) as info:
        open_video(np.zeros(shape, np.uint8))
    assert info.value.field == "video"


def test_a_list_of_arrays_or_images_is_a_video():
    frames = [np.zeros((4, 6, 3), np.uint8), Image.new("L", (6, 4), 9)]
    video = open_video(frames)
    assert (video.num_frames, video.height, video.width, video.is_volume) == (2, 4, 6, False)
    assert video.pixels(1).shape == (4, 6, 3) and video.pixels(1)[0, 0, 0] == 9


def test_a_multipage_tiff_is_a_volume(tmp_path):
    pages = [Image.fromarray(np.full((4, 5), v, np.uint8)) for v in (3, 7)]
    pages[0].save(tmp_path / "stack.tif", save_all=True, append_images=pages[1:])
    video = open_video(tmp_path / "stack.tif")
    assert video.is_volume and video.num_frames == 2 and int(video.pixels(1)[0, 0]) == 7


@pytest.mark.parametrize("bad", ["missing", "empty", "text", 3], ids=str)
def test_unusable_inputs_say_what_is_expected(tmp_path, bad):
    if bad == "missing":
        bad = tmp_path / "nope"
    elif bad == "empty":
        bad = tmp_path
    elif bad == "text":
        bad = tmp_path / "a.txt"
        bad.write_text("x")
    with pytest.raises(InputValidationError, match="video"):
        open_video(bad)


def test_an_mp4_needs_ffmpeg_or_decodes_with_it(tmp_path):
    path = tmp_path / "clip.mp4"
    if shutil.which("ffmpeg") is None:
        path.write_bytes(b"not really a video")
        with pytest.raises(InputValidationError, match="ffmpeg"):
            open_video(path)
        return
    import subprocess

    subprocess.run(
        [
            "ffmpeg",
            "-v",
            "error",
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=64x48:rate=5",
            "-t",
            "1",
            "-pix_fmt",
            "yuv420p",
            str(path),
        ],
        check=True,
    )
    video = open_video(path)
    assert (video.num_frames, video.height, video.width) == (5, 48, 64)
