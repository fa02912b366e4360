"""`triton-sam precompute` and `segment-large` over the stand-in large model (no server)."""

from __future__ import annotations

import json
import signal
import threading

import numpy as np
import pytest
from large_support import FakeLargeServer, client_over
from PIL import Image
from typer.testing import CliRunner

from triton_sam.cli import app
from triton_sam.cli import large as large_cli
from triton_sam.errors import InputValidationError


@pytest.fixture
def server(monkeypatch):
    server = FakeLargeServer(shape=(10, 7), tile=(4, 4), held={0})
    monkeypatch.setattr(large_cli, "_client", lambda url, protocol, family: client_over(server))
    return server


def _run(*args):
    return CliRunner().invoke(app, list(args))


def test_precompute_embeds_a_region_resuming_and_prints_the_counts(server):
    result = _run("precompute", "em/section.zarr", "--region", "0,0,5,7", "--key", "0")
    assert result.exit_code == 0, result.output
    assert server.ops() == ["open", "status", "embed", "close"]
    assert server.calls[0].body == {"op": "open", "dataset": "em/section.zarr", "key": "0"}
    assert server.calls[2].body["tiles"] == [1, 2, 3]  # tile 0 was held
    assert "4 tiles, 3 embedded now, 1 held already" in result.output


def test_segment_large_writes_the_mask_fields_as_json(server, tmp_path):
    out = tmp_path / "mask.json"
    result = _run("segment-large", "em/s.zarr", "--point", "2,5", "--point", "3,6",
                  "--label", "1", "--label", "0", "--out", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    body = server.calls[1].body
    assert (body["points"], body["labels"], body["mode"]) == ([[2, 5], [3, 6]], [1, 0], "auto")
    assert json.loads(out.read_text())["offset"] == [5, 2]
    assert "crop 2x2 at (row, col) (5, 2)" in result.output


def test_segment_large_writes_the_crop_as_an_image_with_its_fields_beside_it(server, tmp_path):
    out = tmp_path / "mask.png"
    assert _run("segment-large", "em/s.zarr", "--point", "2,5", "--out", str(out)).exit_code == 0
    crop = np.asarray(Image.open(out))
    np.testing.assert_array_equal(crop, np.array([[255, 0], [255, 255]], np.uint8))
    assert json.loads(out.with_suffix(".json").read_text())["size"] == [2, 2]


@pytest.mark.parametrize(
    "args, field",
    [
        (["--point", "2,5", "--out", "mask.jpg"], "--out"),
        (["--point", "2", "--out", "mask.json"], "--point"),
        (["--point", "2,5,1", "--out", "mask.json"], "--point"),
    ],
)
def test_bad_options_are_named_before_anything_is_sent(server, args, field):
    result = _run("segment-large", "em/s.zarr", *args)
    assert isinstance(result.exception, InputValidationError), result.output
    assert result.exception.field == field and not server.calls


def test_the_first_ctrl_c_cancels_and_the_second_interrupts():
    cancel = threading.Event()
    before = signal.getsignal(signal.SIGINT)
    with large_cli._first_ctrl_c_cancels(cancel):
        handler = signal.getsignal(signal.SIGINT)
        handler(signal.SIGINT, None)
        assert cancel.is_set()
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGINT, None)
    assert signal.getsignal(signal.SIGINT) is before


def test_everything_large_writes_the_label_image_and_the_records(server, monkeypatch, tmp_path):
    import zarr

    from triton_sam.client import everything as job
    from triton_sam.client.endpoint import Endpoint
    from triton_sam.client.everything import EverythingResult
    from triton_sam.serving import masks

    server.endpoint, server.tls = Endpoint("localhost:8001", "grpc", False), None

    def generate(endpoint, model, inputs, **options):  # one 2x2 object in tile 0's core
        r0, c0, r1, c1 = (int(v) for v in inputs["block"])
        found = np.zeros((r1 - r0, c1 - c0), bool)
        if (r0, c0) == (0, 0):
            found[1:3, 1:3] = True
        counts = masks.encode_rle(found).decode()
        records = [{"segmentation": {"size": list(found.shape), "counts": counts},
                    "bbox": [1, 1, 1, 1], "predicted_iou": 0.9}] if found.any() else []  # fmt: skip
        return EverythingResult(found.shape, records)

    monkeypatch.setattr(job, "generate", generate)
    out, coco = tmp_path / "labels.ome.zarr", tmp_path / "labels.json"
    result = _run("everything-large", "em/s.zarr", "--out", str(out), "--coco", str(coco))
    assert result.exit_code == 0, result.output
    assert "1 instances from 6 tiles" in result.output
    labels = zarr.open_group(str(out), mode="r")["0"][:]
    assert labels.shape == (10, 7) and (labels == 1).sum() == 4 and labels[1:3, 1:3].all()
    assert json.loads(coco.read_text())["instances"][0]["area"] == 4
