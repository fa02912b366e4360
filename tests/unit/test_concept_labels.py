"""OME-Zarr label volumes from concept-tracking answers: what is written reads back through
zarr and through the project's own OME-Zarr reader (``serving.datasets``), voxel for voxel,
with the NGFF 0.4 label metadata; bad requests are refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr

from triton_sam.client.concept_labels import OmeZarrLabelWriter
from triton_sam.errors import InputValidationError
from triton_sam.serving.concept_video.results import FrameResult
from triton_sam.serving.datasets.zarr_source import open_zarr

SHAPE = (4, 23, 31)  # (Z, Y, X): odd, smaller than a chunk
PROMPTS = {0: "red car", 1: "mitochondrion"}


def _answers(seed: int) -> list[FrameResult]:
    """Per section: object 0 and 2 (prompt 0, apart), object 1 (prompt 1, overlapping 0)."""
    rng = np.random.default_rng(seed)
    out = []
    for z in range(SHAPE[0]):
        masks = np.zeros((3, *SHAPE[1:]), bool)
        x = int(rng.integers(0, 10))
        masks[0, 2:10, x : x + 8] = True
        masks[1, 5:15, x + 4 : x + 14] = True  # another prompt: may overlap object 0
        masks[2, 15:22, 20:30] = z != 2  # absent on section 2
        keep = [0, 1] if z == 2 else [0, 1, 2]
        out.append(
            FrameResult(
                frame_idx=z, object_ids=np.array([0, 1, 2])[keep],
                scores=np.ones(len(keep), np.float32), boxes=np.zeros((len(keep), 4), np.float32),
                masks=masks[keep], prompt_ids=np.array([0, 1, 0])[keep],
            )
        )  # fmt: skip
    return out


def _expected(answers: list[FrameResult], prompt_id: int) -> np.ndarray:
    volume = np.zeros(SHAPE, np.uint32)
    for z, answer in enumerate(answers):
        for obj_id, mask, p in zip(answer.object_ids, answer.masks, answer.prompt_ids, strict=True):
            if p == prompt_id:
                volume[z][mask] = obj_id + 1
    return volume


def test_labels_read_back_through_zarr_and_our_ome_reader(tmp_path: Path) -> None:
    image = np.random.default_rng(0).integers(0, 255, SHAPE, dtype=np.uint8)
    answers = _answers(1)
    writer = OmeZarrLabelWriter(tmp_path / "vol.zarr", PROMPTS, SHAPE, image=image,
                                scale=(40.0, 4.0, 4.0))  # fmt: skip
    for z, answer in enumerate(answers):
        writer.write(z, answer)
    root = zarr.open_group(tmp_path / "vol.zarr", mode="r")
    assert root["labels"].attrs["labels"] == ["prompt-0", "prompt-1"]
    np.testing.assert_array_equal(root["0"][:], image)
    for prompt_id, phrase in PROMPTS.items():
        label = root[f"labels/prompt-{prompt_id}"]
        attrs = label.attrs.asdict()
        assert attrs["image-label"] == {"version": "0.4", "source": {"image": "../../"}}
        assert attrs["triton_sam"] == {"prompt": phrase, "prompt_id": prompt_id}
        scale = attrs["multiscales"][0]["datasets"][0]["coordinateTransformations"][0]
        assert scale == {"type": "scale", "scale": [40.0, 4.0, 4.0]}
        expected = _expected(answers, prompt_id)
        np.testing.assert_array_equal(label["0"][:], expected)
        source = open_zarr(tmp_path / "vol.zarr" / "labels" / f"prompt-{prompt_id}", None, "f")
        assert source.axes == "zyx" and source.shape == SHAPE
        for z in range(SHAPE[0]):
            np.testing.assert_array_equal(
                source.read(slice(0, SHAPE[1]), slice(0, SHAPE[2]), z), expected[z]
            )
    # both prompts kept where their objects overlap
    both = (root["labels/prompt-0/0"][:] > 0) & (root["labels/prompt-1/0"][:] > 0)
    assert both.sum() > 0
    # chunks: one section per chunk, "/"-separated (NGFF 0.4)
    meta = json.loads((tmp_path / "vol.zarr/labels/prompt-0/0/.zarray").read_text())
    assert meta["chunks"] == [1, SHAPE[1], SHAPE[2]] and meta["dimension_separator"] == "/"


def test_labels_join_an_existing_image_and_take_its_scale(tmp_path: Path) -> None:
    image = np.zeros(SHAPE, np.uint16)
    OmeZarrLabelWriter(tmp_path / "v.zarr", {0: "a"}, SHAPE, image=image, scale=(2.0, 1.0, 1.0))
    writer = OmeZarrLabelWriter(tmp_path / "v.zarr", {3: "b"}, SHAPE)
    answer = _answers(2)[0]
    answer = FrameResult(0, answer.object_ids, answer.scores, answer.boxes, answer.masks,
                         np.full(len(answer.object_ids), 3))  # fmt: skip
    writer.write(0, answer)
    root = zarr.open_group(tmp_path / "v.zarr", mode="r")
    assert root["labels"].attrs["labels"] == ["prompt-0", "prompt-3"]
    attrs = root["labels/prompt-3"].attrs.asdict()
    assert attrs["multiscales"][0]["datasets"][0]["coordinateTransformations"][0]["scale"] == [
        2.0, 1.0, 1.0,
    ]  # fmt: skip
    assert int(root["labels/prompt-3/0"][0].max()) == 3  # object 2 -> label 3


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda p: OmeZarrLabelWriter(p / "n.zarr", PROMPTS, SHAPE), "image"),
        (lambda p: OmeZarrLabelWriter(p / "n.zarr", PROMPTS, (4, 5)), "shape"),
        (lambda p: OmeZarrLabelWriter(p / "n.zarr", {}, SHAPE, image=np.zeros(SHAPE)), "prompts"),
        (lambda p: OmeZarrLabelWriter(p / "n.zarr", PROMPTS, SHAPE, image=np.zeros((4, 5, 6))),
         "image"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(tmp_path: Path, call, field: str) -> None:
    with pytest.raises(InputValidationError, match=f"^{field}:"):
        call(tmp_path)
    assert not (tmp_path / "n.zarr").exists()  # nothing half-written


def test_write_refusals_name_the_field(tmp_path: Path) -> None:
    writer = OmeZarrLabelWriter(tmp_path / "w.zarr", {0: "a"}, SHAPE, image=np.zeros(SHAPE))
    answer = _answers(0)[0]
    with pytest.raises(InputValidationError, match="^z:"):
        writer.write(SHAPE[0], answer)
    with pytest.raises(InputValidationError, match=r"^result.prompt_ids:.*\[1\]"):
        writer.write(0, answer)  # holds an object of prompt 1
    small = FrameResult(0, answer.object_ids, answer.scores, answer.boxes,
                        answer.masks[:, :5], answer.prompt_ids)  # fmt: skip
    with pytest.raises(InputValidationError, match="^result.masks:"):
        writer.write(0, small)
    with pytest.raises(InputValidationError, match="^shape:"):
        OmeZarrLabelWriter(tmp_path / "w.zarr", {0: "a"}, (4, 23, 30))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(InputValidationError, match="^root:"):
        OmeZarrLabelWriter(tmp_path / "other", {0: "a"}, SHAPE, image=np.zeros(SHAPE))
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["notes.txt"]
