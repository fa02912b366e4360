"""``triton-sam track --phrase`` without a server: what ``track_concepts`` writes from the
client's answers (``concepts.json`` with COCO RLE per frame, ``labels.ome.zarr`` with the
frames in grayscale and one label image per phrase), that the session is closed however the
propagation ends, and the refusals naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from PIL import Image

from triton_sam.client.concept_video import ConceptVideoFrame
from triton_sam.client.track_concepts import track_concepts
from triton_sam.errors import InputValidationError
from triton_sam.serving.concept_video.results import FrameResult
from triton_sam.serving.masks import decode_rle

SHAPE = (3, 20, 24)  # (Z, Y, X)


class FakeClient:
    """``SAM3ConceptVideoClient``'s calls: answers per frame as the server's, labels written
    by ``propagate`` as the real client writes them; records what was called."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls: list[str] = []
        self.fail_at = fail_at

    def open(self, source) -> str:
        self.calls.append(f"open {source.num_frames}x{source.height}x{source.width}")
        self.frames = [source.pixels(i) for i in range(source.num_frames)]
        return "session"

    def add_prompt(self, session: str, phrases) -> list[int]:
        self.calls.append(f"add_prompt {list(phrases)}")
        return list(range(len(phrases)))

    def propagate(self, session: str, *, settings=None, labels=None, progress=None):
        for z, frame in enumerate(self.frames):
            if z == self.fail_at:
                raise RuntimeError("the stream broke")
            masks = np.zeros((2, *SHAPE[1:]), bool)
            masks[0] = frame[..., 0] > 128  # object 3 (prompt 0) where the frame is bright
            masks[1, 2:6, 3 + z : 9 + z] = True  # object 5 (prompt 1) moving right
            result = FrameResult(
                frame_idx=z, object_ids=np.array([3, 5]), scores=np.array([0.9, 0.8], np.float32),
                boxes=np.array([[0, 0, 1, 1], [3 + z, 2, 8 + z, 5]], np.float32), masks=masks,
                prompt_ids=np.array([0, 1]),
            )  # fmt: skip
            if labels is not None:
                labels.write(z, result)
            if progress is not None:
                progress(z + 1, len(self.frames))
            yield ConceptVideoFrame(result, np.ones(2, np.float32), np.zeros(0, np.int32), (z, 3))

    def close(self, session: str) -> None:
        self.calls.append("close")


def _video() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (*SHAPE, 3), dtype=np.uint8)


def test_writes_rle_per_frame_and_an_ome_zarr_label_image_per_phrase(tmp_path: Path) -> None:
    video, client, seen = _video(), FakeClient(), []
    result = track_concepts(
        client, video, ["cell", "vesicle"], tmp_path, progress=lambda *done: seen.append(done)
    )
    assert client.calls == ["open 3x20x24", "add_prompt ['cell', 'vesicle']", "close"]
    assert result.frames == 3 and result.objects == {"cell": [3], "vesicle": [5]}
    assert seen == [(1, 3), (2, 3), (3, 3)]
    written = json.loads((tmp_path / "concepts.json").read_text())
    assert written["phrases"] == {"0": "cell", "1": "vesicle"}
    for z, frame in enumerate(written["frames"]):
        assert frame["frame"] == z and [o["id"] for o in frame["objects"]] == [3, 5]
        cell = frame["objects"][0]
        assert cell["phrase"] == "cell" and cell["rle"]["size"] == list(SHAPE[1:])
        mask = decode_rle(cell["rle"]["counts"].encode(), SHAPE[1:])
        np.testing.assert_array_equal(mask, video[z, ..., 0] > 128)
    root = zarr.open_group(tmp_path / "labels.ome.zarr", mode="r")
    gray = np.stack([np.asarray(Image.fromarray(f).convert("L")) for f in video])
    np.testing.assert_array_equal(root["0"][:], gray)  # the frames, as Pillow makes them gray
    cells = root["labels/prompt-0/0"][:]
    np.testing.assert_array_equal(cells > 0, video[..., 0] > 128)
    assert set(np.unique(cells)) <= {0, 3 + 1}  # object id + 1: 0 is the background


def test_the_session_is_closed_when_the_stream_breaks(tmp_path: Path) -> None:
    client = FakeClient(fail_at=1)
    with pytest.raises(RuntimeError, match="stream broke"):
        track_concepts(client, _video(), ["cell", "vesicle"], tmp_path)
    assert client.calls[-1] == "close"


@pytest.mark.parametrize(
    "phrases, existing, field",
    [([], False, "phrase"), (["  "], False, "phrase"), (["cell"], True, "out")],
)
def test_refusals_name_the_field(tmp_path: Path, phrases, existing, field) -> None:
    if existing:
        (tmp_path / "labels.ome.zarr").mkdir()
    with pytest.raises(InputValidationError) as err:
        track_concepts(FakeClient(), _video(), phrases, tmp_path)
    assert err.value.field == field
