"""The large model's parts: request checks, planning, crop RLE, handles, the upload spool,
its config and its place in the repository (the ops: test_large_service.py)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from triton_sam.errors import InputValidationError
from triton_sam.models.registry import get_family
from triton_sam.repository.config import parse_config
from triton_sam.repository.large_config import (
    LargeOptions,
    build_large_config,
    large_artifact,
    serves_large,
)
from triton_sam.repository.writer import embedded_twin, written_by_triton_sam
from triton_sam.serving import masks
from triton_sam.serving import protocol as envelope
from triton_sam.serving.bounds import MAX_POINTS, RequestError
from triton_sam.serving.large import crop, planning, requests
from triton_sam.serving.large.handles import Handles
from triton_sam.serving.large.spool import Spool, axes_of
from triton_sam.serving.protocol import large as protocol
from triton_sam.serving.tiles import Block, TileGrid


# -- requests ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("blob", "field"),
    [
        (b"x" * 101, "request: got 101 bytes"),
        (b"\xff", "request: not UTF-8 JSON"),
        (b"[1]", "request: expected a JSON object"),
        (b'{"op": "close", "op": "open"}', "request.op: given more than once"),
        (b'{"op": "delete"}', 'request.op: got "delete"'),
        (b'{"op": "close", "handel": "x"}', "request.handel: not a field of 'close'"),
    ],
)
def test_a_malformed_request_is_refused_naming_the_field(blob, field):
    with pytest.raises(RequestError, match=f"^{field}"):
        requests.parse(blob, 100)


def test_nested_objects_arrive_as_objects_and_keys_are_unique_at_any_depth():
    blob = b'{"op": "open", "dataset": "a/b", "mapping": {"kind": "range", "min": 0, "max": 9}}'
    assert requests.parse(blob, 1000)["mapping"] == {"kind": "range", "min": 0, "max": 9}
    with pytest.raises(RequestError, match="^request.min: given more than once"):
        requests.parse(b'{"op": "open", "mapping": {"min": 0, "min": 1}}', 1000)


@pytest.mark.parametrize(
    ("prompt", "field"),
    [
        ({"points": [[1, 2]]}, "request.labels"),
        ({"points": [[1, float("nan")]], "labels": [1]}, "request.points"),
        ({"points": [[True, 2]], "labels": [1]}, "request.points"),
        ({"points": [[1, 2, 3]], "labels": [1]}, "request.points"),
        ({"points": [[1, 2]] * (MAX_POINTS + 1), "labels": [1] * (MAX_POINTS + 1)}, "points"),
        ({"points": [[1, 2]], "labels": [2]}, "request.labels"),
        ({"box": [5, 5, 1, 1]}, "request.box"),
        (
            {"points": [[1, 2]] * (MAX_POINTS - 1), "labels": [1] * (MAX_POINTS - 1)}
            | {"box": [0, 0, 5, 5]},
            "request.points: got 63 points, expected 1..62",
        ),
        ({}, "request.points: no prompt"),
    ],
)
def test_prompts_are_checked(prompt, field):
    with pytest.raises(RequestError, match=field):
        requests.prompts(prompt)


def test_block_sides_are_bounded_by_max_block():
    assert requests.block_sides({}, "tile", 768, minimum=64) == (768, 768)
    with pytest.raises(RequestError, match="request.tile"):
        requests.block_sides({"tile": [32, 64]}, "tile", 768, minimum=64)
    with pytest.raises(RequestError, match="request.tile: tile .* is 2048 pixels.*max_block"):
        requests.check_block((1024, 512), (512, 0), 1024)
    requests.check_block((768, 768), (128, 128), 1024)


def test_handles_must_look_issued_and_z_only_on_volumes():
    with pytest.raises(RequestError, match="request.handle"):
        requests.handle({"handle": "short"})
    with pytest.raises(RequestError, match="request.z: given for a 2D image"):
        requests.optional_z({"z": 0}, None)
    with pytest.raises(RequestError, match="request.z: missing"):
        requests.optional_z({}, 5)
    with pytest.raises(RequestError, match="request.z: got 5"):
        requests.optional_z({"z": 5}, 5)
    assert requests.optional_z({"z": 4}, 5) == 4


# -- planning ------------------------------------------------------------------------------------
def test_frame_translates_drops_outside_points_and_cuts_the_box():
    prompt = planning.Prompt(
        np.array([[10.0, 20.0], [300.0, 20.0]]), np.array([1, 0]), np.array([0, 0, 200, 200.0])
    )
    framed = planning.frame(prompt, Block((16, 0), (144, 128)))
    assert framed.points.tolist() == [[10, 4]] and framed.labels.tolist() == [1]
    assert framed.dropped == 1 and framed.box.tolist() == [0, 0, 127, 127]
    with pytest.raises(RequestError, match="request.points: no prompt lies in the block"):
        planning.frame(prompt, Block((300, 300), (400, 400)))


def test_tile_block_is_micro_sams_tile_and_a_box_places_it_by_its_centre():
    grid = TileGrid((256, 256), (64, 64), (16, 16))
    box_only = planning.Prompt(None, None, np.array([130.0, 70.0, 150.0, 90.0]))
    assert planning.tile_block(grid, box_only) == (1 * 4 + 2, grid.outer(6))


def test_cut_is_an_edge_of_the_block_where_the_image_goes_on():
    block = Block((10, 0), (20, 10))  # the image's left edge at column 0
    shape = (30, 30)
    assert planning.cut(np.array([2, 0, 5, 5]), block, shape)  # top edge, rows go on above
    assert not planning.cut(np.array([0, 3, 5, 5]), block, shape)  # the image's own edge
    assert planning.cut(np.array([2, 3, 9, 5]), block, shape)  # right edge
    assert not planning.cut(np.array([2, 3, 9, 5]), block, (30, 10))  # ... the image's too


# -- crop RLE ------------------------------------------------------------------------------------
def test_a_mask_is_answered_as_its_crop_in_full_image_pixels():
    mask = np.zeros((50, 40), bool)
    mask[5:9, 30:40] = True
    mask[20, 33] = True
    block = Block((100, 200), (150, 240))
    got = crop.mask_answer(mask, block, (1000, 1000), 0.75)
    assert got["offset"] == [105, 230] and got["size"] == [16, 10] and got["area"] == 41
    assert got["box"] == [230, 105, 239, 120] and got["cut"] and got["score"] == 0.75
    assert set(got) == set(protocol.MASK_FIELDS)
    dense = crop.paste(got, (1000, 1000))
    assert np.array_equal(dense[100:150, 200:240], mask) and dense.sum() == 41
    assert masks.decode_rle(got["counts"], (16, 10)).sum() == 41
    empty = crop.mask_answer(np.zeros((5, 5), bool), block, (1000, 1000), 0.1)
    assert empty["size"] == [0, 0] and empty["area"] == 0 and not empty["cut"]
    assert not crop.paste(empty, (10, 10)).any()


# -- handles -------------------------------------------------------------------------------------
class _Closing:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def test_each_tenant_keeps_its_most_recent_handles():
    handles = Handles(2)
    images = [_Closing() for _ in range(3)]
    first, second = (handles.add("a", i) for i in images[:2])
    other = handles.add("b", _Closing())
    assert len(first) == 32 and int(first, 16) >= 0 and first != second
    handles.get("a", first)  # now the most recent: the second goes
    handles.add("a", images[2])
    assert images[1].closed and not images[0].closed and handles.count("a") == 2
    for tenant, handle in (("a", second), ("a", other), ("b", first)):
        with pytest.raises(envelope.ProtocolError) as e:
            handles.get(tenant, handle)
        assert e.value.code == envelope.ERR_HANDLE_NOT_FOUND
    handles.close_all()
    assert images[0].closed and images[2].closed


# -- the spool -----------------------------------------------------------------------------------
def test_uploads_count_each_pixel_once_and_give_their_bytes_back(tmp_path):
    spool = Spool(str(tmp_path), max_bytes=2 * (10 * 10 * 3 + 100))
    upload = spool.create("a", (10, 10, 3), "uint8", "yxc")
    assert spool.used["a"] == 10 * 10 * 3 + 100 and upload.total == 100
    piece = np.full((6, 10, 3), 7, np.uint8)
    assert upload.put((0, 0), piece) == 60
    assert upload.put((4, 0), piece) == 100 and upload.complete  # overlap counted once
    assert upload.levels == ((10, 10, 3),)  # a source of one level, as the readers' are
    assert np.array_equal(upload.read(slice(2, 4), slice(0, 10)), piece[:2])
    spool.create("a", (10, 10, 3), "uint8", "yxc")
    with pytest.raises(envelope.ProtocolError, match="request.shape.*max_upload_bytes") as e:
        spool.create("a", (1, 1), "uint8", "yx")
    assert e.value.code == envelope.ERR_LIMIT
    with pytest.raises(envelope.ProtocolError, match="max_upload_bytes"):  # no int64 wrap
        spool.create("c", (2**31 - 1,) * 3 + (3,), "float32", "zyxc")
    spool.create("b", (10, 10, 3), "uint8", "yxc")  # another tenant's budget
    path = upload.path
    upload.close()
    assert not os.path.exists(path) and spool.used["a"] == 10 * 10 * 3 + 100
    spool.create("a", (1, 1), "uint8", "yx")


@pytest.mark.parametrize(
    ("offset", "pixels", "field"),
    [
        ((0, 0, 0), np.zeros((2, 2), np.uint16), "request.offset: got"),
        ((3, 0), np.zeros((2, 2), np.uint16), "request.offset: a 2x2 piece at"),
        ((-1, 0), np.zeros((2, 2), np.uint16), "request.offset"),
        ((0, 0), np.zeros((2, 2), np.uint8), "pixels: got uint8"),
        ((0, 0), np.zeros((2, 2, 3), np.uint16), "pixels"),
    ],
)
def test_a_piece_outside_the_image_or_of_another_kind_is_refused(tmp_path, offset, pixels, field):
    upload = Spool(str(tmp_path), 10**6).create("", (4, 4), "uint16", "yx")
    with pytest.raises(RequestError, match=field):
        upload.put(offset, pixels)
    assert upload.received == 0


def test_volumes_take_pieces_per_slice_and_floats_must_be_finite(tmp_path):
    upload = Spool(str(tmp_path), 10**6).create("", (3, 4, 4), "float32", "zyx")
    assert upload.put((2, 0, 0), np.ones((4, 4, 1), np.float32)) == 16
    assert upload.read(slice(0, 2), slice(0, 2), z=2).tolist() == [[1, 1], [1, 1]]
    with pytest.raises(RequestError, match="request.offset: a 4x4 piece at \\[3, 0, 0\\]"):
        upload.put((3, 0, 0), np.ones((4, 4), np.float32))
    with pytest.raises(RequestError, match="pixels: got NaN"):
        upload.put((0, 0, 0), np.full((1, 1), np.nan, np.float32))


def test_axes_of_a_created_image():
    assert axes_of((5, 6), None) == "yx" and axes_of((5, 6, 3), None) == "yxc"
    assert axes_of((5, 6, 7), None) == "zyx" and axes_of((5, 6, 7, 1), None) == "zyxc"
    assert axes_of((5, 6, 3), "zyx") == "zyx"
    for shape, axes, field in (
        ((5, 6, 7), "yxc", "request.shape: got 7 channels"),
        ((5,), None, "request.shape"),
        ((5, 6), "xy", "request.axes"),
        ((0, 6), None, "request.shape"),
    ):
        with pytest.raises(RequestError, match=field):
            axes_of(shape, axes)


def test_a_private_spool_directory_is_removed_at_shutdown():
    spool = Spool(None, 10**6)
    spool.create("", (2, 2), "uint8", "yx")
    assert os.path.isdir(spool.directory)
    spool.close()
    assert not os.path.exists(spool.directory)


# -- config and repository -----------------------------------------------------------------------
@pytest.mark.parametrize("family", ["sam1", "sam2"])
def test_config_is_a_one_answer_python_model_over_the_session_model(family):
    spec = get_family(family)
    config = build_large_config(spec)
    assert config.name == f"{family}_large" and config.backend == "python"
    assert not config.model_transaction_policy.decoupled and config.max_batch_size == 0
    assert [t.name for t in config.input] == [protocol.REQUEST, *protocol.PIXEL_INPUTS.values()]
    assert [t.name for t in config.output] == [protocol.ANSWER, protocol.RGB]  # RGB: a read
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params[protocol.PARAM_KIND] == envelope.KIND_LARGE_IMAGE
    assert params["session_model"] == spec.session_model and params["data_roots"] == ""
    assert params["tile"] == str(protocol.DEFAULT_TILE)


def test_only_point_list_families_get_one_and_options_are_checked():
    assert serves_large(get_family("sam1")) and serves_large(get_family("sam2"))
    assert not serves_large(get_family("sam3"))
    with pytest.raises(InputValidationError, match="max_block"):
        LargeOptions(tile=2048, halo=128)
    with pytest.raises(InputValidationError, match="window"):
        LargeOptions(window=4096)
    with pytest.raises(InputValidationError, match="max_concurrent_opens"):
        LargeOptions(max_concurrent_opens=0)


def test_the_artifact_ships_what_the_model_imports_and_twins_on_one_cpu_instance():
    artifact = large_artifact(get_family("sam2"))
    assert written_by_triton_sam(artifact)
    assert {"model.py", "triton_sam_serving/large/service.py"} <= set(artifact.files)
    assert "triton_sam_serving/tiles.py" in artifact.files
    twin = parse_config(embedded_twin(artifact, "onnxruntime").config_text)
    (group,) = twin.instance_group
    assert group.count == 1


def test_the_watchdog_probes_large_models(tmp_path):
    from triton_sam.repository.writer import write_models
    from triton_sam.server.health import LARGE_PROBE, watched_models

    write_models(tmp_path, [large_artifact(get_family("sam2"))])
    assert watched_models(tmp_path) == {"sam2_large": envelope.KIND_LARGE_IMAGE}
    request = requests.parse(LARGE_PROBE, 1000)  # a request the model takes: a miss
    assert request == {"op": "status", "handle": "0" * 32}
    assert json.loads(LARGE_PROBE)["op"] in protocol.OPS
