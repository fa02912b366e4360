"""SAM3 concept export: four graphs with the spec's contract, verified against Sam3Model.

The export under test is the session's one (``concept_build``: small random-init Sam3Model,
re-scaled weights, python target); its ORT-vs-torch check ran at build time over dynamic
batches (1 and 2 images), phrases (1, 2 and 3 per image), a threshold in a gap of the
scores, and ``max_instances`` cutting.
"""

from __future__ import annotations

import numpy as np
import pytest

from triton_sam.errors import CheckpointError, ExportValidationError
from triton_sam.models.sam3_concept import SAM3_CONCEPT_FAMILY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_registered_family_is_the_contract_of_sam3_default_config():
    from transformers import Sam3Config

    from triton_sam.export.sam3_concept import family_for_config, small_config
    from triton_sam.models import get_family, get_model

    assert family_for_config(Sam3Config()) == SAM3_CONCEPT_FAMILY
    assert get_family("sam3_concept") is SAM3_CONCEPT_FAMILY
    assert get_model("sam3_concept").family is SAM3_CONCEPT_FAMILY
    assert family_for_config(small_config()).width == 64


def test_graphs_declare_the_spec_dims_batch_and_phrases_symbolic(concept_build, concept_spec):
    import onnx

    repo, _ = concept_build
    for graph in concept_spec.family.graphs:
        model = onnx.load(str(repo / graph.model / "1" / "model.onnx"), load_external_data=False)
        assert model.opset_import[0].version >= 17
        assert [i.name for i in model.graph.input] == [t.name for t in graph.inputs]
        assert [o.name for o in model.graph.output] == [t.name for t in graph.outputs]
        # Triton's onnxruntime backend compares output dims with config.pbtxt exactly.
        for value, spec in zip(
            [*model.graph.input, *model.graph.output], [*graph.inputs, *graph.outputs], strict=True
        ):
            dims = value.type.tensor_type.shape.dim
            assert dims[0].dim_param, f"{graph.role}.{spec.name}: batch must be symbolic"
            for d, expected in zip(dims[1:], spec.shape, strict=True):
                if expected > 0:
                    assert d.dim_value == expected, f"{graph.role}.{spec.name}: {dims}"
                else:
                    assert d.dim_param and not d.dim_value, f"{graph.role}.{spec.name}: {dims}"


def test_export_matches_torch_within_the_stated_tolerances(concept_build):
    _, build = concept_build
    errors = build.export.max_abs_error
    print("\nORT vs torch max abs error:", {k: f"{v:.2e}" for k, v in errors.items()})
    expected = {
        "vision.fpn_features.0", "vision.fpn_features.1", "vision.fpn_features.2",
        "text.text_features", "exemplar.exemplar_features",
        "decoder.scores", "decoder.boxes", "decoder.masks", "decoder.query_index",
        "decoder.num_instances", "decoder.presence",
    }  # fmt: skip
    assert set(errors) == expected
    assert set(build.export.tolerance) == expected  # every output checked, within its own
    print("tolerances:", {k: v.describe() for k, v in build.export.tolerance.items()})
    # the selection is exact: same queries, same counts
    assert errors["decoder.query_index"] == 0 and errors["decoder.num_instances"] == 0


def test_verification_collects_every_mismatch_then_raises_once(concept_build, concept_spec):
    from triton_sam.export.concept_graphs import _verify

    repo, build = concept_build
    fam = concept_spec.family
    rng = np.random.default_rng(0)
    graphs = {g.role: repo / g.model / "1" / "model.onnx" for g in fam.graphs}
    ids = np.zeros((1, 32), np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    wrong = {"text_features": rng.standard_normal((1, 32, fam.width)).astype(np.float32)}
    pixels = {"pixel_values": np.zeros((1, 3, 1008, 1008), np.float32)}
    wrong_vision = {t.name: np.zeros((1, *t.shape), np.float32) + 1e3 for t in fam.vision.outputs}
    result = type(build.export)(graphs, build.export.tokenizer, build.export.pad_token_id)
    checked = {"text": [("bad", feeds, wrong)], "vision": [("bad", pixels, wrong_vision)]}
    checked["exemplar"] = checked["decoder"] = []
    with pytest.raises(ExportValidationError) as raised:
        _verify(result, fam, checked)
    lines = raised.value.mismatches
    assert len(lines) == 4  # three vision outputs and the text output, all reported
    assert sum(line.startswith("vision:") for line in lines) == 3


def test_a_checkpoint_of_another_width_is_refused(concept_checkpoint):
    from triton_sam.export.sam3_concept import build_model
    from triton_sam.models import get_model

    with pytest.raises(CheckpointError, match="width 64 .* serves width 256"):
        build_model(get_model("sam3_concept"), concept_checkpoint)


def test_wrappers_stay_in_eval_mode_after_an_export(concept_spec, concept_checkpoint, tmp_path):
    # The legacy exporter restores the mode a module had; a training-mode wrapper would leave
    # the DETR dropout on and corrupt every later torch reference run.
    from triton_sam.export import ExportOptions, GraphExport, trace_graphs
    from triton_sam.export.sam3_concept import build_model, wrap_text

    model = build_model(concept_spec, concept_checkpoint)
    wrapper = wrap_text(model)
    ids = np.zeros((2, 32), np.int64)
    trace_graphs(
        [
            GraphExport(
                concept_spec.family.text,
                wrapper,
                {"input_ids": ids, "attention_mask": np.ones_like(ids)},
            )
        ],
        tmp_path,
        ExportOptions(),
        {},
    )
    assert not any(m.training for m in model.modules())


def test_exemplar_graph_takes_one_image_and_refuses_two_loudly(concept_build, concept_spec):
    # upstream's roi_align call unrolls the traced batch: the repository serves the graph with
    # max_batch_size 1; a batch of 2 must fail, never answer for the first image only.
    import onnxruntime as ort

    repo, _ = concept_build
    graph = concept_spec.family.exemplar
    session = ort.InferenceSession(
        str(repo / graph.model / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )

    def feeds(batch: int, boxes: int) -> dict[str, np.ndarray]:
        level = np.zeros((batch, *graph.inputs[0].shape), np.float32)
        box = np.tile(np.float32([0.5, 0.5, 0.2, 0.3]), (batch, boxes, 1))
        return {graph.inputs[0].name: level, "exemplar_boxes": box,
                "exemplar_labels": np.ones((batch, boxes), np.int64)}  # fmt: skip

    [tokens] = session.run(None, feeds(1, 5))
    assert tokens.shape == (1, 5 + 1, concept_spec.family.width)  # 5 boxes + CLS
    with pytest.raises(Exception, match="Split"):
        session.run(None, feeds(2, 3))
