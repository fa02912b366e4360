"""The embedded CPU twin serves the session model's encoder with fused attention
(``repository/cpu_graphs.py``): the production graphs stay as exported, the copy is reused
while the export is unchanged and redone when it changes, a failed fusion serves the export
as it is, and the fused encoder computes the export's features within the fp32 export
tolerance (float reassociation only; the served path's parity with the official predictor is
checked end to end by ``tests/parity``, which serves this same twin)."""

from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import onnx
import pytest

from triton_sam.errors import ExportError
from triton_sam.export import onnx_utils, optimize
from triton_sam.repository import cpu_graphs
from triton_sam.repository.writer import embedded_repository

ENCODER, DECODER = "sam2_encoder", "sam2_decoder"


def _ops(path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}


@pytest.fixture
def export(sam2_tiny_export, tmp_path):
    """A private copy of the production repository (its files may be touched here)."""
    repo = tmp_path / "model_repository"
    shutil.copytree(sam2_tiny_export, repo, symlinks=False)
    return repo


def test_twin_fuses_the_encoder_and_leaves_the_export_alone(export, tmp_path):
    twin = embedded_repository(export, tmp_path / "twin")
    served = twin / ENCODER / "1" / "model.onnx"
    assert "MultiHeadAttention" in _ops(served) and "Softmax" not in _ops(served)
    assert cpu_graphs.graph_family(served) == ("sam2", True)
    # The production graphs are as exported; the decoder is served as exported.
    assert "MultiHeadAttention" not in _ops(export / ENCODER / "1" / "model.onnx")
    assert cpu_graphs.graph_family(export / ENCODER / "1" / "model.onnx") == ("sam2", False)
    decoder = (twin / DECODER / "1" / "model.onnx").resolve()
    assert decoder == (export / DECODER / "1" / "model.onnx").resolve()
    # The copy lives outside any repository (Triton would load a subdirectory of one).
    assert served.resolve().is_relative_to(cpu_graphs.cache_dir_for(tmp_path / "twin"))


def test_the_copy_is_reused_until_the_export_changes(export, tmp_path, monkeypatch):
    embedded_repository(export, tmp_path / "twin")
    calls = []
    real = optimize.fuse_attention
    monkeypatch.setattr(optimize, "fuse_attention", lambda *a: calls.append(a) or real(*a))
    embedded_repository(export, tmp_path / "twin")
    assert calls == []  # unchanged export: the copy is reused
    source = export / ENCODER / "1" / "model.onnx"
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 10**9))
    twin = embedded_repository(export, tmp_path / "twin")
    assert len(calls) == 1  # a re-export (new mtime) is fused again
    assert cpu_graphs.graph_family(twin / ENCODER / "1" / "model.onnx")[1]


def test_no_fusion_when_asked_or_when_it_fails(export, tmp_path, monkeypatch, caplog):
    exported = (export / ENCODER / "1" / "model.onnx").resolve()
    plain = embedded_repository(export, tmp_path / "plain", fuse_attention=False)
    assert (plain / ENCODER / "1" / "model.onnx").resolve() == exported

    def broken(path, family):
        raise ExportError("fuse_attention: the exported pattern changed")

    monkeypatch.setattr(optimize, "fuse_attention", broken)
    with caplog.at_level(logging.WARNING):
        twin = embedded_repository(export, tmp_path / "twin")
    assert (twin / ENCODER / "1" / "model.onnx").resolve() == exported  # served, slower
    assert "serving the encoder as exported" in caplog.text
    assert not any(p.name.startswith(".sam2_encoder.fusing") for p in tmp_path.rglob("*"))


def test_graphs_of_unknown_origin_or_already_fused_are_served_as_they_are(export, tmp_path):
    graph = export / ENCODER / "1" / "model.onnx"
    onnx_utils.set_metadata(graph, {"triton_sam.variant": "not-a-variant"})
    assert cpu_graphs.graph_family(graph) == (None, False)
    twin = embedded_repository(export, tmp_path / "twin")
    assert (twin / ENCODER / "1" / "model.onnx").resolve() == graph.resolve()
    onnx_utils.set_metadata(graph, {"triton_sam.variant": "sam2.1_hiera_tiny"})
    optimize.fuse_attention(graph, "sam2")  # an export made with export.fuse_attention=true
    twin = embedded_repository(export, tmp_path / "twin2")
    assert (twin / ENCODER / "1" / "model.onnx").resolve() == graph.resolve()


def test_the_fused_encoder_computes_the_exports_features(sam2_tiny_export, tmp_path):
    import onnxruntime as ort

    twin = embedded_repository(sam2_tiny_export, tmp_path / "twin")
    image = np.random.default_rng(3).standard_normal((1, 3, 1024, 1024)).astype(np.float32)
    outputs = {}
    for label, path in (
        ("exported", sam2_tiny_export / ENCODER / "1" / "model.onnx"),
        ("fused", twin / ENCODER / "1" / "model.onnx"),
    ):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        outputs[label] = dict(zip(names, session.run(None, {"image": image}), strict=True))
    tol = onnx_utils.FP32_TOLERANCE  # the export check's: fusion reassociates sums only
    for name, expected in outputs["exported"].items():
        assert tol.mismatch(outputs["fused"][name], expected) is None
