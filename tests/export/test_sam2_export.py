"""Export tier: SAM2.1-tiny (random init, official config) -> ONNX, on CPU, no server.

The self-check's tolerance is FP32_TOLERANCE (relative to each output's magnitude, see
export/onnx_utils.py) for fp32 exports and FP16_TOLERANCE for fp16 ones; these tests prove the
check runs and can fail (tests/export/test_export_gates.py: over seeds, and with planted bugs).
"""

from __future__ import annotations

import dataclasses
import importlib
import pickle

import numpy as np
import pytest
import torch

from triton_sam.errors import CheckpointError, ExportValidationError, InputValidationError
from triton_sam.export import ExportOptions, export_model, onnx_utils
from triton_sam.models import get_model, model_names

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SPEC = get_model("sam2.1_hiera_tiny")


@pytest.fixture(scope="module")
def exported(sam2_tiny_build):
    """The session's one SAM2.1-tiny export (tests/conftest.py: default ``ExportOptions``,
    checked against torch), its graphs as written in the repository (the export's scratch
    folder is gone): exporting it again here cost ~25 s of CI for the same graphs."""
    repo, build = sam2_tiny_build
    graphs = {
        role: repo / model / "1" / "model.onnx"
        for role, model in zip(build.export.graphs, build.models, strict=True)
    }
    return dataclasses.replace(build.export, graphs=graphs)


def test_every_registered_variant_has_an_exporter_with_the_family_interface():
    # One wrap_<role> per graph the family declares (pairs: encoder, decoder; concept
    # families: vision, text, decoder).
    for name in model_names():
        family = get_model(name).family
        module = importlib.import_module(family.exporter)
        wrappers = [f"wrap_{graph.role}" for graph in family.graphs]
        for fn in ("build_model", "save_random_checkpoint", *wrappers):
            assert callable(getattr(module, fn)), f"{name}: {module.__name__}.{fn}"


def test_export_writes_graphs_with_the_spec_contract(exported):
    import onnx

    fam = SPEC.family
    for path, inputs, outputs in (
        (exported.encoder, fam.encoder_inputs, fam.encoder_outputs),
        (exported.decoder, fam.decoder_inputs, fam.decoder_outputs),
    ):
        model = onnx.load(str(path), load_external_data=False)
        assert model.opset_import[0].version >= 17
        assert [i.name for i in model.graph.input] == [t.name for t in inputs]
        assert [o.name for o in model.graph.output] == [t.name for t in outputs]
        # Outputs too: Triton's onnxruntime backend compares their dims with the config's
        # exactly, so the fixed sizes must be declared (a symbolic dim would not load).
        declared = [*model.graph.input, *model.graph.output]
        for value, spec in zip(declared, [*inputs, *outputs], strict=True):
            dims = value.type.tensor_type.shape.dim
            assert dims[0].dim_param, f"{spec.name}: batch dim must be symbolic"
            for d, expected in zip(dims[1:], spec.shape, strict=True):
                assert d.dim_value == expected if expected > 0 else d.dim_param


def test_self_check_ran_within_the_stated_tolerance(exported):
    assert exported.tolerance is onnx_utils.FP32_TOLERANCE
    assert set(exported.max_abs_error) >= {"image_embed", "high_res_feats_0", "masks"}
    assert max(exported.max_abs_error.values()) < 1e-4


def test_verification_lists_every_mismatching_output(exported):
    feeds = {"image": np.zeros((1, 3, 1024, 1024), np.float32)}
    real = onnx_utils.run_onnx(exported.encoder, feeds)
    wrong = {k: v + (0.1 if k != "high_res_feats_1" else 0.0) for k, v in real.items()}
    with pytest.raises(ExportValidationError) as info:
        onnx_utils.verify_graph(
            exported.encoder, [("zeros", feeds, wrong)], onnx_utils.FP32_TOLERANCE
        )
    assert len(info.value.mismatches) == 2
    assert "image_embed" in str(info.value) and "high_res_feats_0" in str(info.value)


def test_fp16_conversion_keeps_fp32_io_and_passes_its_tolerance(exported, tmp_path):
    import onnx

    path = tmp_path / "decoder.onnx"
    path.write_bytes(exported.decoder.read_bytes())
    rng = np.random.default_rng(0)
    fam = SPEC.family
    feeds = {
        t.name: rng.standard_normal((1, *[d if d > 0 else 3 for d in t.shape])).astype(np.float32)
        for t in fam.decoder_inputs
    }
    feeds["point_labels"] = np.array([[2, 3, -1]], np.float32)
    feeds["has_mask_input"] = np.ones((1, 1), np.float32)
    expected = onnx_utils.run_onnx(path, feeds)
    onnx_utils.convert_to_fp16(path)
    model = onnx.load(str(path))
    assert all(i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for i in model.graph.input)
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)
    onnx_utils.verify_graph(path, [("fp16", feeds, expected)], onnx_utils.FP16_TOLERANCE)


def test_fp16_encoder_loads_and_passes_its_tolerance(exported, tmp_path):
    """The encoder's positional encoding has a Range, which has no fp16 kernel: the converter
    must keep it (and the constants and casts feeding it) in fp32, or the graph does not load
    ("Type 'tensor(float16)' of input parameter ... of operator (Range)")."""
    path = tmp_path / "encoder.onnx"
    path.write_bytes(exported.encoder.read_bytes())
    feeds = {"image": np.random.default_rng(2).standard_normal((1, 3, 1024, 1024), np.float32)}
    expected = onnx_utils.run_onnx(path, feeds)
    onnx_utils.convert_to_fp16(path)
    onnx_utils.verify_graph(path, [("fp16", feeds, expected)], onnx_utils.FP16_TOLERANCE)
    assert [p.name for p in tmp_path.iterdir()] == ["encoder.onnx"]  # no temporary left


def test_external_data_export_loads_and_matches(sam2_tiny_checkpoint, exported, tmp_path):
    result = export_model(
        SPEC, sam2_tiny_checkpoint, tmp_path, ExportOptions(external_data=True, verify=False)
    )
    sidecars = onnx_utils.external_data_files(result.encoder)
    assert [p.name for p in sidecars] == ["encoder.onnx_data"]
    assert result.encoder.stat().st_size < 5_000_000 < sidecars[0].stat().st_size
    feeds = {"image": np.random.default_rng(1).standard_normal((1, 3, 1024, 1024), np.float32)}
    a = onnx_utils.run_onnx(result.encoder, feeds)
    b = onnx_utils.run_onnx(exported.encoder, feeds)
    np.testing.assert_allclose(a["image_embed"], b["image_embed"], atol=1e-5)


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_checkpoints_are_loaded_with_weights_only(tmp_path):
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump({"model": _Evil()}, f)
    with pytest.raises(CheckpointError, match="cannot load"):
        export_model(SPEC, path, tmp_path / "out")


def test_mismatched_checkpoint_names_the_keys(tmp_path):
    path = tmp_path / "partial.pt"
    torch.save({"model": {"not_a_key": torch.zeros(1)}}, path)
    with pytest.raises(CheckpointError, match="missing keys"):
        export_model(SPEC, path, tmp_path / "out")


# -- CPU options: fused attention, int8 encoder weights ------------------------------------------
@pytest.fixture(scope="module")
def cpu_optimised(sam2_tiny_checkpoint, tmp_path_factory):
    """One export with both options (each is checked on its own below)."""
    options = ExportOptions(fuse_attention=True, quantize="int8")
    return export_model(SPEC, sam2_tiny_checkpoint, tmp_path_factory.mktemp("cpu_opt"), options)


def _op_types(path):
    import onnx

    return {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}


def test_fused_attention_replaces_every_hiera_attention(cpu_optimised):
    # SAM2.1-tiny's Hiera has 12 blocks, each with one attention.
    assert cpu_optimised.fused_operators["MultiHeadAttention"] == 12
    assert "MultiHeadAttention" in _op_types(cpu_optimised.encoder)
    assert "Softmax" not in _op_types(cpu_optimised.encoder)


def test_int8_encoder_is_checked_with_its_own_tolerance(cpu_optimised):
    from triton_sam.export.optimize import INT8_TOLERANCE

    ops = _op_types(cpu_optimised.encoder)
    assert "DynamicQuantizeLinear" in ops or "DynamicQuantizeMatMul" in ops
    assert "MatMulInteger" in ops or "DynamicQuantizeMatMul" in ops
    assert cpu_optimised.encoder_tolerance is INT8_TOLERANCE
    # the decoder stays fp32, checked as such
    assert cpu_optimised.tolerance is onnx_utils.FP32_TOLERANCE
    assert "MatMulInteger" not in _op_types(cpu_optimised.decoder)
    # The check ran (and passed, within the guard); int8 does move the features.
    assert cpu_optimised.max_abs_error["image_embed"] > 1e-3


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"quantize": "int4"}, "quantize"),
        ({"quantize": "int8", "fp16": True}, "quantize"),
    ],
)
def test_bad_cpu_options_name_the_field(kwargs, field):
    with pytest.raises(InputValidationError) as info:
        ExportOptions(**kwargs)
    assert info.value.field == field
