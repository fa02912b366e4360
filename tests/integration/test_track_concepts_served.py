"""``triton-sam track FRAMES --phrase P`` against the served ``sam3_concept_video`` (the session's
one build and server, tests/conftest.py): the frames go up as PNG files (the server decodes
them), and what the command writes (``concepts.json``, ``labels.ome.zarr``) equals what
``SAM3ConceptVideoClient`` receives for the same frames sent as pixels, which
``test_sam3_concept_video.py`` matches to the in-process pipeline."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import numpy as np
import pytest
import zarr
from concept_video_e2e_support import PHRASE, SETTINGS, clip
from PIL import Image
from typer.testing import CliRunner

from triton_sam.cli import app
from triton_sam.client.concept_video import SAM3ConceptVideoClient
from triton_sam.serving.concept_video.service import SERVED_SETTINGS
from triton_sam.serving.masks import decode_rle
from triton_sam.serving.protocol import concept_video as protocol

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(600)]
SERVED = replace(SETTINGS, max_num_objects=protocol.MAX_OBJECTS)
OVERRIDES = {k: v for k, v in asdict(SERVED).items() if v != getattr(SERVED_SETTINGS, k)}


def test_track_phrase_writes_what_the_client_receives(concept_video_server, tmp_path):
    frames = clip()
    folder = tmp_path / "frames"
    folder.mkdir()
    for z, frame in enumerate(frames):
        Image.fromarray(frame).save(folder / f"{z:05d}.png")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        ["track", str(folder), "--phrase", PHRASE, "--settings", json.dumps(OVERRIDES),
         "--url", concept_video_server.grpc_url, "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    with SAM3ConceptVideoClient(concept_video_server.grpc_url) as client:
        session = client.open(frames)
        client.add_prompt(session, [PHRASE])
        answers = [a.result for a in client.propagate(session, settings=OVERRIDES)]
        client.close(session)
    written = json.loads((out / "concepts.json").read_text())
    assert [f["frame"] for f in written["frames"]] == [a.frame_idx for a in answers]
    labels = zarr.open_group(out / "labels.ome.zarr", mode="r")["labels/prompt-0/0"][:]
    expected = np.zeros(labels.shape, labels.dtype)
    for frame, answer in zip(written["frames"], answers, strict=True):
        assert [o["id"] for o in frame["objects"]] == answer.object_ids.tolist()
        for obj, mask, box in zip(frame["objects"], answer.masks, answer.boxes, strict=True):
            assert obj["phrase"] == PHRASE and obj["box"] == box.tolist()
            np.testing.assert_array_equal(
                decode_rle(obj["rle"]["counts"].encode(), mask.shape), mask
            )
        for obj_id, mask in zip(answer.object_ids, answer.masks, strict=True):
            expected[answer.frame_idx][mask] = obj_id + 1
    assert sum(len(a.object_ids) for a in answers) > 0
    np.testing.assert_array_equal(labels, expected)
