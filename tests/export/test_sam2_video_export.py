"""Export tier: the five SAM2.1 tracking graphs (random-init tiny with the test's scaled output
layers), each checked against upstream's torch code path at export time (atol = rtol = 1e-4)."""

from __future__ import annotations

import json

import onnx
import pytest

from triton_sam.errors import ExportError
from triton_sam.export import onnx_utils
from triton_sam.export.sam2_video import GRAPH_KEYS, TRACKER_CONFIG_FILENAME, tracker_config
from triton_sam.serving.protocol import tracker as protocol
from triton_sam.serving.tracking.config import TrackerConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_every_graph_has_the_protocols_contract(sam2_video_export):
    assert set(sam2_video_export.graphs) == set(GRAPH_KEYS) == set(protocol.GRAPHS)
    for key, path in sam2_video_export.graphs.items():
        model = onnx.load(str(path), load_external_data=False)
        assert model.opset_import[0].version == 17
        inputs, outputs = protocol.GRAPHS[key]
        assert [i.name for i in model.graph.input] == [name for name, _, _ in inputs], key
        assert [o.name for o in model.graph.output] == [name for name, _, _ in outputs], key
        for value, (name, _, shape) in zip(model.graph.input, inputs, strict=True):
            dims = value.type.tensor_type.shape.dim
            assert dims[0].dim_param, f"{key}.{name}: the batch dim must be symbolic"
            for dim, size in zip(dims[1:], shape, strict=True):
                assert (dim.dim_value == size) if size > 0 else bool(dim.dim_param), (key, name)
        # the onnxruntime backend compares output dims exactly: fixed where the spec is
        for value, (name, _, shape) in zip(model.graph.output, outputs, strict=True):
            dims = value.type.tensor_type.shape.dim
            assert dims[0].dim_param and [d.dim_value for d in dims[1:]] == list(shape), name


def test_memory_and_pointer_counts_are_shared_dynamic_axes(sam2_video_export):
    model = onnx.load(str(sam2_video_export.graphs["memory_attention"]), load_external_data=False)
    dims = {i.name: [d.dim_param for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert dims["memory"][1] == dims["memory_tpos"][1] == "num_memories"
    assert dims["obj_ptrs"][1] == dims["obj_ptr_tpos"][1] == "num_pointers"


def test_export_check_covered_every_output_within_tolerance(sam2_video_export):
    expected = {f"{key}.{name}" for key in GRAPH_KEYS for name, _, _ in protocol.GRAPHS[key][1]}
    assert set(sam2_video_export.max_abs_error) == expected
    assert sam2_video_export.tolerance is onnx_utils.FP32_TOLERANCE
    assert max(sam2_video_export.max_abs_error.values()) < 1e-4


def test_the_tracker_config_is_written_beside_the_graphs(sam2_video_export):
    folder = sam2_video_export.graphs["video_encoder"].parent
    config = TrackerConfig.from_json((folder / TRACKER_CONFIG_FILENAME).read_text())
    assert config == sam2_video_export.tracker_config == TrackerConfig()  # SAM2.1's settings
    assert json.loads(config.to_json())["num_maskmem"] == 7


def test_settings_the_orchestration_does_not_reproduce_are_refused(sam2_tiny_spec):
    from triton_sam.export.sam2_video import build_video_model

    model = build_video_model(sam2_tiny_spec, None)
    model.non_overlap_masks = True
    model.fill_hole_area = 8
    with pytest.raises(ExportError, match="non_overlap_masks.*fill_hole_area"):
        tracker_config(model)
