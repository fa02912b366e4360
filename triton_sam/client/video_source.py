"""Videos and volumes as a sequence of frames, for the video clients (numpy + PIL).

What ``SAM2VideoPredictor.init_state`` takes, and more: a folder of frames, an mp4 (decoded
with the ``ffmpeg`` program), a list of images, a 3-D numpy volume (Z, Y, X) or (Z, Y, X, C),
or a multi-page TIFF stack. Frames are read lazily: a long video is never held decoded on the
client. Files are handed to the server as their own bytes (JPEG/PNG/TIFF; the server decodes
them with Pillow, as upstream does); arrays as uint8 pixels.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from triton_sam.errors import InputValidationError

FRAME_EXTENSIONS = (".jpg", ".jpeg", ".png", ".tif", ".tiff", ".bmp", ".webp")
VIDEO_EXTENSIONS = (".mp4", ".mov", ".avi", ".mkv", ".webm")
STACK_EXTENSIONS = (".tif", ".tiff")
_EXPECTED = (
    "a folder of frames, an mp4 file, a multi-page TIFF stack, a list of images, or a "
    "numpy volume (Z, Y, X) / (Z, Y, X, C) with C = 1 or 3"
)


@dataclass
class VideoSource:
    """Frames of a video or volume, read on demand.

    Attributes:
        num_frames: frames (z-slices for a volume).
        height / width: size of every frame, in pixels.
        is_volume: True for a numpy volume or a TIFF stack (outputs go to a TIFF stack).
    """

    num_frames: int
    height: int
    width: int
    is_volume: bool
    _pixels: Callable[[int], np.ndarray]
    _encoded: Callable[[int], bytes | None]

    def pixels(self, index: int) -> np.ndarray:
        """Frame ``index`` as uint8 [H, W] or [H, W, 3]."""
        return self._pixels(index)

    def encoded(self, index: int) -> bytes | None:
        """Frame ``index`` as its encoded file bytes, or None for an in-memory frame."""
        return self._encoded(index)


def open_video(video: object) -> VideoSource:
    """A :class:`VideoSource` over ``video`` (see the module docstring for what is accepted).

    A folder's frames are sorted by their integer stem when every stem is an integer (as
    upstream names them: ``00000.jpg``), else by name. Volumes that are not uint8 are scaled
    to 0..255 over the whole volume (min to max), so a 16-bit EM stack keeps its contrast;
    bool volumes become 0 / 255.

    Raises:
        InputValidationError: (field ``video``) an unsupported type, a missing path, an empty
            folder, frames of different sizes, or a volume of the wrong rank.
    """
    if isinstance(video, VideoSource):  # frames someone already reads lazily (a volume's windows)
        return video
    if isinstance(video, np.ndarray):
        return _from_volume(video)
    if isinstance(video, (str, os.PathLike)):
        path = Path(video)
        if path.is_dir():
            return _from_files(_folder_frames(path))
        if not path.is_file():
            raise InputValidationError("video", f"{path} does not exist; expected {_EXPECTED}")
        if path.suffix.lower() in VIDEO_EXTENSIONS:
            return _from_volume(_decode_video(path), is_volume=False)
        if path.suffix.lower() in STACK_EXTENSIONS:
            return _from_volume(read_stack(path))
        raise InputValidationError("video", f"{path}: unknown file type; expected {_EXPECTED}")
    if isinstance(video, Sequence) and not isinstance(video, (str, bytes)) and video:
        if all(isinstance(v, (str, os.PathLike)) for v in video):
            return _from_files([Path(v) for v in video])
        return _from_volume(np.stack([_as_frame(v, i) for i, v in enumerate(video)]), False)
    raise InputValidationError("video", f"got {type(video).__name__}; expected {_EXPECTED}")


def read_stack(path: Path) -> np.ndarray:
    """A multi-page TIFF as a (Z, Y, X[, C]) array (tifffile when installed, else Pillow)."""
    try:
        import tifffile
    except ImportError:
        tifffile = None
    if tifffile is not None:
        return np.asarray(tifffile.imread(path))
    pages = []
    with Image.open(path) as image:
        for i in range(getattr(image, "n_frames", 1)):
            image.seek(i)
            pages.append(np.asarray(image))
    return np.stack(pages)


def _folder_frames(folder: Path) -> list[Path]:
    files = [p for p in folder.iterdir() if p.suffix.lower() in FRAME_EXTENSIONS and p.is_file()]
    if not files:
        raise InputValidationError(
            "video", f"{folder} holds no frames (files ending in {', '.join(FRAME_EXTENSIONS)})"
        )
    if all(p.stem.isdigit() for p in files):
        return sorted(files, key=lambda p: int(p.stem))
    return sorted(files)


def _from_files(paths: list[Path]) -> VideoSource:
    for p in paths:
        if not p.is_file():
            raise InputValidationError("video", f"frame {p} does not exist")
    with Image.open(paths[0]) as first:
        width, height = first.size

    def pixels(i: int) -> np.ndarray:
        with Image.open(paths[i]) as image:
            rgb = np.asarray(image.convert("RGB"))
        if rgb.shape[:2] != (height, width):
            raise InputValidationError(
                "video",
                f"frame {paths[i]} is {rgb.shape[1]}x{rgb.shape[0]}, frame 0 {width}x{height}",
            )
        return rgb

    return VideoSource(len(paths), height, width, False, pixels, lambda i: paths[i].read_bytes())


def _from_volume(volume: np.ndarray, is_volume: bool = True) -> VideoSource:
    volume = np.asarray(volume)
    if volume.ndim == 4 and volume.shape[-1] in (1, 3):
        pass
    elif volume.ndim != 3:
        raise InputValidationError(
            "video",
            f"got an array of shape {volume.shape}; expected a volume (Z, Y, X) or "
            "(Z, Y, X, C) with C = 1 or 3",
        )
    if 0 in volume.shape:
        raise InputValidationError("video", f"got an empty volume of shape {volume.shape}")
    volume = _to_uint8(volume)
    return VideoSource(
        volume.shape[0],
        volume.shape[1],
        volume.shape[2],
        is_volume,
        lambda i: np.ascontiguousarray(volume[i]),
        lambda i: None,
    )


def _to_uint8(volume: np.ndarray) -> np.ndarray:
    if volume.dtype == np.uint8:
        return volume
    if volume.dtype == bool:
        return volume.astype(np.uint8) * 255
    if not np.issubdtype(volume.dtype, np.number):
        raise InputValidationError("video", f"got dtype {volume.dtype}; expected numbers")
    lo, hi = float(np.min(volume)), float(np.max(volume))
    if not np.isfinite([lo, hi]).all():
        raise InputValidationError("video", "the volume holds NaN or inf")
    scaled = (volume.astype(np.float64) - lo) * (255.0 / (hi - lo) if hi > lo else 0.0)
    return np.round(scaled).astype(np.uint8)


def _as_frame(image: object, index: int) -> np.ndarray:
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    array = np.asarray(image)
    if array.dtype != np.uint8 or array.ndim not in (2, 3):
        raise InputValidationError(
            "video", f"frame {index}: got {array.dtype} {array.shape}; expected uint8 HxW or HxWx3"
        )
    return array if array.ndim == 3 else np.repeat(array[..., None], 3, axis=2)


def _decode_video(path: Path) -> np.ndarray:
    """Every frame of a video file as uint8 (N, H, W, 3), through the ``ffmpeg`` program."""
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise InputValidationError(
            "video",
            f"{path}: decoding videos needs the ffmpeg program (apt install ffmpeg), or extract "
            "the frames first: ffmpeg -i video.mp4 -q:v 2 -start_number 0 frames/%05d.jpg",
        )
    probe = subprocess.run(
        [
            ffmpeg,
            "-v",
            "error",
            "-i",
            str(path),
            "-frames:v",
            "1",
            "-f",
            "image2pipe",
            "-c:v",
            "png",
            "-",
        ],
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0 or not probe.stdout:
        raise InputValidationError(
            "video", f"{path}: ffmpeg cannot read it: {probe.stderr[-300:]!r}"
        )
    with Image.open(io.BytesIO(probe.stdout)) as first:
        width, height = first.size
    raw = subprocess.run(
        [ffmpeg, "-v", "error", "-i", str(path), "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        capture_output=True,
        check=False,
    )
    if raw.returncode != 0:
        raise InputValidationError("video", f"{path}: ffmpeg failed: {raw.stderr[-300:]!r}")
    frame_bytes = height * width * 3
    count = len(raw.stdout) // frame_bytes
    if count == 0:
        raise InputValidationError("video", f"{path}: no frames decoded")
    return np.frombuffer(raw.stdout[: count * frame_bytes], np.uint8).reshape(
        count, height, width, 3
    )
