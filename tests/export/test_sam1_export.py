"""Export tier: SAM1 ViT-B (random init, official builder) -> ONNX, on CPU, no server.

The export checked here is the session's one ViT-B export (``sam1_vit_b_build``, external
data forced on), also served by the parity tests. Its self-check tolerance is
FP32_TOLERANCE (relative to each output's magnitude); measured max |ORT - torch|: ~1e-5 on the image
embedding, < 1e-6 on decoder logits and scores.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from triton_sam.client.prompts import build_decoder_prompts
from triton_sam.errors import CheckpointError, ConfigError
from triton_sam.export import export_model, onnx_utils
from triton_sam.export import sam1 as sam1_exporter
from triton_sam.models import get_model

slow = pytest.mark.slow
SPEC = get_model("sam1_vit_b")
HW = (640, 480)  # H, W: portrait


@pytest.fixture(scope="module")
def model(sam1_vit_b_checkpoint):
    return sam1_exporter.build_model(SPEC, sam1_vit_b_checkpoint)


@pytest.fixture(scope="module")
def graphs(sam1_vit_b_build) -> dict[str, Path]:
    repo, _ = sam1_vit_b_build
    return {g: repo / f"sam1_{g}" / "1" / "model.onnx" for g in ("encoder", "decoder")}


@slow
def test_export_writes_graphs_with_the_spec_contract(graphs):
    import onnx

    fam = SPEC.family
    for graph, inputs, outputs in (
        ("encoder", fam.encoder_inputs, fam.encoder_outputs),
        ("decoder", fam.decoder_inputs, fam.decoder_outputs),
    ):
        proto = onnx.load(str(graphs[graph]), load_external_data=False)
        assert proto.opset_import[0].version >= 17
        assert [i.name for i in proto.graph.input] == [t.name for t in inputs]
        assert [o.name for o in proto.graph.output] == [t.name for t in outputs]
        # Outputs too: Triton's onnxruntime backend compares their dims with the config's
        # exactly, so the fixed sizes must be declared (a symbolic dim would not load).
        declared = [*proto.graph.input, *proto.graph.output]
        for value, spec in zip(declared, [*inputs, *outputs], strict=True):
            dims = value.type.tensor_type.shape.dim
            assert dims[0].dim_param, f"{spec.name}: batch dim must be symbolic"
            for d, expected in zip(dims[1:], spec.shape, strict=True):
                assert d.dim_value == expected if expected > 0 else d.dim_param


@slow
def test_self_check_ran_within_the_stated_tolerance(sam1_vit_b_build):
    _, build = sam1_vit_b_build
    assert build.export.tolerance is onnx_utils.FP32_TOLERANCE
    names = {t.name for t in (*SPEC.family.encoder_outputs, *SPEC.family.decoder_outputs)}
    assert set(build.export.max_abs_error) == names
    assert max(build.export.max_abs_error.values()) < 1e-4


@slow
def test_forced_external_data_keeps_every_weight_in_the_sidecar(graphs):
    for graph, path in graphs.items():
        sidecars = onnx_utils.external_data_files(path)
        assert [p.name for p in sidecars] == [f"{graph}{onnx_utils.EXTERNAL_DATA_SUFFIX}"]
        assert path.stat().st_size < 1_000_000 < sidecars[0].stat().st_size


@slow
def test_batched_decoder_pairs_each_prompt_set_with_its_own_embedding(model):
    """Triton batches requests of different images: item i must only see embedding i."""
    decoder = sam1_exporter.wrap_decoder(model)
    rng = torch.Generator().manual_seed(0)
    feeds = (
        torch.randn(2, 256, 64, 64, generator=rng),
        torch.rand(2, 3, 2, generator=rng) * 1024,
        torch.tensor([[1.0, 0.0, -1.0], [1.0, 2.0, 3.0]]),
        torch.randn(2, 1, 256, 256, generator=rng),
        torch.tensor([[0.0], [1.0]]),
    )
    with torch.no_grad():
        batched = decoder(*feeds)
        for i in range(2):
            single = decoder(*(f[i : i + 1] for f in feeds))
            for b, s in zip(batched, single, strict=True):
                torch.testing.assert_close(b[i : i + 1], s, atol=1e-5, rtol=0)


@slow
@pytest.mark.parametrize("prompt", ["click", "box", "box+click"])
def test_client_prompt_layout_embeds_as_sam_predictor(model, prompt):
    """Our point layout through SamOnnxModel == PromptEncoder.forward(points, boxes)."""
    fam = SPEC.family
    clicks = dict(point_coords=[[100.0, 200.0], [300.0, 50.0]], point_labels=[1, 0])
    box = dict(box=[40.0, 60.0, 420.0, 500.0])
    kwargs = {"click": clicks, "box": box, "box+click": {**clicks, **box}}[prompt]
    full = dict(point_coords=None, point_labels=None, box=None, mask_input=None) | kwargs
    feeds = build_decoder_prompts(**full, orig_hw=HW, family=fam)
    decoder = sam1_exporter.wrap_decoder(model)
    pe = model.prompt_encoder
    points, boxes = None, None
    if "point_coords" in kwargs:
        from segment_anything.utils.transforms import ResizeLongestSide

        coords = ResizeLongestSide(1024).apply_coords(np.array(clicks["point_coords"]), HW)
        points = (torch.tensor(coords, dtype=torch.float)[None], torch.tensor([[1, 0]]))
    if "box" in kwargs:
        from segment_anything.utils.transforms import ResizeLongestSide

        xyxy = ResizeLongestSide(1024).apply_boxes(np.array(box["box"]), HW)
        boxes = torch.tensor(xyxy, dtype=torch.float)
    with torch.no_grad():
        ours = decoder.prompts._embed_points(
            torch.from_numpy(feeds["point_coords"]), torch.from_numpy(feeds["point_labels"])
        )
        ref, _ = pe(points=points, boxes=boxes, masks=None)
    assert ours.shape == ref.shape
    # Upstream embeds box corners in a separate call: float rounding of sin/cos(2*pi*x) moves
    # them by ~2e-6; a wrong order or padding would differ by O(1).
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


@slow
def test_self_contained_and_external_data_decoders_agree(model, tmp_path):
    decoder = sam1_exporter.wrap_decoder(model)
    fam = SPEC.family
    rng = np.random.default_rng(0)
    feeds = {
        "image_embeddings": rng.standard_normal((1, 256, 64, 64), np.float32),
        "point_coords": np.array([[[100.0, 200.0], [0.0, 0.0]]], np.float32),
        "point_labels": np.array([[1.0, -1.0]], np.float32),
        "mask_input": np.zeros((1, 1, 256, 256), np.float32),
        "has_mask_input": np.zeros((1, 1), np.float32),
    }
    outs = {}
    for external in (False, True):
        path = onnx_utils.export_graph(
            decoder,
            tuple(torch.from_numpy(feeds[t.name]) for t in fam.decoder_inputs),
            tmp_path / str(external) / "decoder.onnx",
            input_names=[t.name for t in fam.decoder_inputs],
            output_names=[t.name for t in fam.decoder_outputs],
            dynamic_axes={t.name: {0: "batch"} for t in fam.decoder_inputs},
            opset=17,
            external_data=external,
        )
        assert bool(onnx_utils.external_data_files(path)) == external
        assert sorted(p.name for p in path.parent.iterdir()) == sorted(
            ["decoder.onnx"] + (["decoder.onnx_data"] if external else [])
        )
        outs[external] = onnx_utils.run_onnx(path, feeds)
    for name in outs[False]:
        np.testing.assert_array_equal(outs[False][name], outs[True][name])


def test_huge_export_keeps_one_sidecar_not_one_file_per_weight(tmp_path, monkeypatch):
    """Above 2 GiB (ViT-H) torch's exporter writes each initializer to its own file beside
    the graph; the export must leave only <stem>.onnx + <stem>.onnx_data."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = {f"w{i}": np.full((64, 64), i, np.float32) for i in range(3)}

    def fake_torch_export(module, args, f, **kwargs):
        nodes = [helper.make_node("Add", ["x", "w0"], ["a"])]
        nodes += [
            helper.make_node("Add", ["a", "w1"], ["b"]),
            helper.make_node("Add", ["b", "w2"], ["y"]),
        ]
        graph = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])],
            [numpy_helper.from_array(w, name) for name, w in weights.items()],
        )
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
        onnx.save_model(proto, f, save_as_external_data=True, all_tensors_to_one_file=False)

    monkeypatch.setattr(torch.onnx, "export", fake_torch_export)
    out = tmp_path / "onnx"
    path = onnx_utils.export_graph(
        torch.nn.Identity(),
        (torch.zeros(1),),
        out / "encoder.onnx",
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={},
        opset=17,
    )
    assert sorted(p.name for p in out.iterdir()) == ["encoder.onnx", "encoder.onnx_data"]
    y = onnx_utils.run_onnx(path, {"x": np.zeros((64, 64), np.float32)})["y"]
    np.testing.assert_array_equal(y, np.full((64, 64), 3.0, np.float32))


@slow
def test_random_checkpoint_is_a_plain_official_state_dict(sam1_vit_b_checkpoint):
    state = torch.load(sam1_vit_b_checkpoint, map_location="cpu", weights_only=True)
    assert isinstance(state, dict) and "model" not in state
    assert state["image_encoder.patch_embed.proj.weight"].shape == (768, 3, 16, 16)
    assert "mask_decoder.iou_token.weight" in state


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


@slow
def test_checkpoints_are_loaded_with_weights_only(tmp_path):
    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        pickle.dump({"image_encoder.pos_embed": _Evil()}, f)
    with pytest.raises(CheckpointError, match="cannot load"):
        export_model(SPEC, path, tmp_path / "out")


@slow
@pytest.mark.parametrize(
    "state, needle",
    [
        ({"not_a_key": torch.zeros(1)}, "missing keys"),
        ({"model": {"image_encoder.pos_embed": torch.zeros(1)}}, "plain state dict"),
    ],
)
def test_wrong_checkpoints_say_what_is_wrong(tmp_path, state, needle):
    path = tmp_path / "wrong.pth"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=needle):
        sam1_exporter.build_model(SPEC, path)


def test_unknown_upstream_config_is_a_config_error():
    import dataclasses

    with pytest.raises(ConfigError, match="vit_b"):
        sam1_exporter.build_model(dataclasses.replace(SPEC, upstream_config="vit_x"), None)
