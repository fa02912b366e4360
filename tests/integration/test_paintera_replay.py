"""Paintera's requests, replayed byte for byte against a `triton-sam setup paintera` repository.

Paintera encodes through saalfeldlab/sam-link (tag ``sam-link-1.0.0``, commit
56c8d5e067a133f2257715cff924cb0d9ac5aa0b) and decodes locally. What is replayed here
(``triton_sam.bench.paintera.SamLinkReplay``, raw protobufs on raw gRPC streams), from its
sources:

- ``src/main/kotlin/org/janelia/saalfeldlab/samlink/TritonClient.kt``: ``streamCount = 4``
  lanes, each its own ``ManagedChannel`` with one long-lived ``ModelStreamInfer`` stream,
  requests round-robin (``pickSlot``); ``maxInboundMessageSize(32 * BYTES_MB)``; the stubs
  ``withCompression("gzip")``; no stream deadline; ``usePlaintext()`` unless port 443; each
  request ``modelName``, ``id = UUID.randomUUID()``, ``parameters["priority"] =
  inferParameter { int64Param = 5 }``, one input in ``rawInputContents``, no requested
  outputs; ``isModelReady`` = ``ModelReady(name, "")`` on a separate control channel;
  answers matched by ``inferResponse.id``, an ``errorMessage`` failing only that call.
- ``encode/EncodeHelper.kt`` ``intRGBtoCHW``: ``u8 * ((hi - lo) / 255f) + lo`` in float32,
  CHW; ``encode/EncodeOptions.kt``: ``priority`` 5.
- ``encode/triton/Sam{1,2,3Tracker}TritonEncoder.kt`` and ``models/SamModels.kt``: inputs
  ``image`` [1,3,1024,1024] in [0, 1] (SAM1, SAM2) and ``pixel_values`` [1,3,1008,1008] in
  [-1, 1] (SAM3), outputs read by name as FP32 (``EncodeParameter.kt`` refuses FP16).
- Paintera ``src/main/kotlin/org/janelia/saalfeldlab/paintera/config/sam/Sam{1,2,3}Config.kt``
  (master): the default model names ``sam1_encoder``, ``sam2.1_large_encoder``,
  ``sam3_tracker_encoder_fp16``.

The repository is written once per module by the CLI (``triton-sam setup paintera``) with the
small variants under Paintera's names (SAM1 ViT-B, SAM2.1-tiny, the small SAM3 tracker of
``tests/conftest.py``) from the session's seeded checkpoints, so the official predictors can
load the same weights. Images are already square at the encoder's size (no resize, no
padding), so the official predictors see the same pixels.

Tolerance: the export's own gate, ``FP32_TOLERANCE`` (max error <= 512 float32 ulps of
max|reference|, rms <= 64 ulps of its rms). The entry model is our exported encoder behind
a normalisation done in upstream's operation order, so what it adds to the export's
onnxruntime-vs-torch rounding is a float32 rounding of the pixels (sam-link's
``u8 * (1/255f)`` instead of upstream's ``u8 / 255``: at most 1 ulp per pixel), which the
network's LayerNorms do not amplify past that gate. Measured (max abs error / max|reference|):
SAM1 ViT-B 5.5e-6 / 1.3e-6, SAM2.1-tiny image_embed 4.2e-6 / 1.3e-6 (high-res levels
1.2e-6 relative), small SAM3 tracker 1.1e-6 / 1.3e-6 at most: about 11 float32 ulps.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from servers import module_server

from triton_sam.bench.paintera import LANES, SamLinkReplay, samlink_pixels

# alone: its server holds three families (6 GB resident on the CPU twin)
pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.alone, pytest.mark.timeout(1500)]

ENTRIES = {  # model -> (input, edge, (lo, hi), outputs and their element counts)
    "sam1_encoder": ("image", 1024, (0.0, 1.0), {"image_embeddings": 256 * 64 * 64}),
    "sam2.1_large_encoder": (
        "image",
        1024,
        (0.0, 1.0),
        {
            "image_embed": 256 * 64 * 64,
            "high_res_feats_0": 32 * 256 * 256,
            "high_res_feats_1": 64 * 128 * 128,
        },
    ),
    "sam3_tracker_encoder_fp16": (
        "pixel_values",
        1008,
        (-1.0, 1.0),
        {
            "image_embeddings.0": 32 * 288 * 288,
            "image_embeddings.1": 64 * 144 * 144,
            "image_embeddings.2": 256 * 72 * 72,
        },
    ),
}


def outputs(response) -> dict[str, tuple[str, np.ndarray]]:
    """Output name -> (datatype, float32 values), as ``EncodeParameter.getFloatArray``."""
    ir = response.infer_response
    return {
        o.name: (o.datatype, np.frombuffer(raw, "<f4"))
        for o, raw in zip(ir.outputs, ir.raw_output_contents, strict=True)
    }


@pytest.fixture(scope="module")
def paintera_repository(
    tmp_path_factory, sam1_vit_b_checkpoint, sam2_tiny_checkpoint, sam3_small_checkpoint
) -> Path:
    """`triton-sam setup paintera` with the small variants (the production repository)."""
    from typer.testing import CliRunner

    from triton_sam.cli import app

    repo = tmp_path_factory.mktemp("paintera") / "model_repository"
    args = [
        "setup", "paintera", "--repository", str(repo),
        "--sam1", "sam1_vit_b", "--sam1-checkpoint", str(sam1_vit_b_checkpoint),
        "--sam2", "sam2.1_hiera_tiny", "--sam2-checkpoint", str(sam2_tiny_checkpoint),
        "--sam3-checkpoint", str(sam3_small_checkpoint),
        # The export's own onnxruntime-vs-torch check is skipped (CI time): the tests below
        # compare the served features with the official predictors', a stronger check.
        "export.verify=false",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return repo


@pytest.fixture(scope="module")
def server(paintera_repository):
    from triton_sam.repository.writer import embedded_repository

    yield from module_server(embedded_repository(paintera_repository))


@pytest.fixture(scope="module")
def samlink(server):
    client = SamLinkReplay(server.grpc_url.removeprefix("grpc://"))
    yield client
    client.close()


def square_image(edge: int, seed: int) -> np.ndarray:
    from triton_sam.tools.sample import sample_image

    return sample_image(edge, edge, seed=seed)


def reference_features(family: str, rgb: np.ndarray, checkpoints: dict) -> dict[str, np.ndarray]:
    """The official predictors' features for ``rgb`` (same weights)."""
    import torch

    from triton_sam.models import get_model

    with torch.inference_mode():
        if family == "sam1_encoder":
            from segment_anything import SamPredictor

            from triton_sam.export.sam1 import build_model

            spec = get_model("sam1_vit_b")
            predictor = SamPredictor(build_model(spec, checkpoints["sam1"]))
            predictor.set_image(rgb)
            return {"image_embeddings": predictor.features.numpy()}
        if family == "sam2.1_large_encoder":
            from sam2.sam2_image_predictor import SAM2ImagePredictor

            from triton_sam.export.sam2 import build_model

            spec = get_model("sam2.1_hiera_tiny")
            predictor = SAM2ImagePredictor(build_model(spec, checkpoints["sam2"]))
            predictor.set_image(rgb)
            features = predictor._features
            return {
                "image_embed": features["image_embed"].numpy(),
                "high_res_feats_0": features["high_res_feats"][0].numpy(),
                "high_res_feats_1": features["high_res_feats"][1].numpy(),
            }
        from transformers import Sam3TrackerModel, Sam3TrackerProcessor
        from transformers.models.sam3.image_processing_sam3 import Sam3ImageProcessor

        model = Sam3TrackerModel.from_pretrained(checkpoints["sam3"]).eval()
        processor = Sam3TrackerProcessor(image_processor=Sam3ImageProcessor())
        pixels = processor(images=rgb, return_tensors="pt")["pixel_values"]
        embeddings = model.get_image_embeddings(pixels)
        return {f"image_embeddings.{i}": e.numpy() for i, e in enumerate(embeddings)}


def test_paintera_health_check_sees_every_entry_model(samlink, paintera_repository):
    for model in ENTRIES:
        assert samlink.is_model_ready(model), model
    assert (paintera_repository / "sam1_encoder_normalized" / "config.pbtxt").is_file()


@pytest.mark.parametrize("model", list(ENTRIES))
def test_encode_answers_what_the_local_decoders_read(
    samlink, model, sam1_vit_b_checkpoint, sam2_tiny_checkpoint, sam3_small_checkpoint
):
    from triton_sam.export.onnx_utils import FP32_TOLERANCE

    name, edge, (lo, hi), expected = ENTRIES[model]
    rgb = square_image(edge, seed=3)
    response = samlink.infer(model, name, [1, 3, edge, edge], samlink_pixels(rgb, lo, hi))
    assert response.error_message == ""
    got = outputs(response)
    assert set(got) == set(expected)
    for out, count in expected.items():
        assert got[out][0] == "FP32", (out, got[out][0])
        assert got[out][1].size == count, out
    checkpoints = {
        "sam1": sam1_vit_b_checkpoint,
        "sam2": sam2_tiny_checkpoint,
        "sam3": sam3_small_checkpoint,
    }
    reference = reference_features(model, rgb, checkpoints)
    report = {}
    for out, ref in reference.items():
        ours = got[out][1].reshape(ref.shape)
        err = np.abs(ours.astype(np.float64) - ref)
        report[out] = (float(err.max()), float(err.max() / np.abs(ref).max()))
        problem = FP32_TOLERANCE.mismatch(ours, ref)
        assert problem is None, f"{model} {out}: {problem}"
    print(f"{model}: max abs / relative to max|ref|:", report)


def test_a_missing_model_fails_that_request_and_the_stream_goes_on(samlink):
    name, edge, (lo, hi), expected = ENTRIES["sam3_tracker_encoder_fp16"]
    raw = samlink_pixels(square_image(edge, seed=4), lo, hi)
    bad_id, lane = samlink.send("no_such_encoder", name, [1, 3, edge, edge], raw)
    bad = samlink.wait(bad_id)
    assert bad.infer_response.id == bad_id and bad.error_message
    assert "no_such_encoder" in bad.error_message
    # the next request on the same lane (round-robin comes back to it after 4) is answered
    ids = [
        samlink.send("sam3_tracker_encoder_fp16", name, [1, 3, edge, edge], raw) for _ in range(4)
    ]
    assert ids[-1][1] == lane
    for request_id, _ in ids:
        assert samlink.wait(request_id).error_message == ""


def test_an_abrupt_stream_cancel_leaves_the_server_ready(server, samlink):
    name, edge, (lo, hi), _ = ENTRIES["sam3_tracker_encoder_fp16"]
    raw = samlink_pixels(square_image(edge, seed=5), lo, hi)
    other = SamLinkReplay(server.grpc_url.removeprefix("grpc://"))
    for _ in range(LANES):
        other.send("sam3_tracker_encoder_fp16", name, [1, 3, edge, edge], raw)
    for _, _, stream, _ in other.lanes:
        stream.cancel()  # Paintera closed mid-request
    other.close()
    assert samlink.is_model_ready("sam3_tracker_encoder_fp16")
    response = samlink.infer("sam3_tracker_encoder_fp16", name, [1, 3, edge, edge], raw)
    assert response.error_message == ""


def test_our_client_on_the_paintera_repository_equals_the_official_predictor(
    server, sam1_vit_b_checkpoint
):
    """``sam1_encoder`` is Paintera's entry there: our client finds the ensemble and encodes
    with ``sam1_encoder_normalized``. One client covers both paths: ``set_image`` +
    ``predict_full`` go through ``sam1_session`` (whose encoder is
    ``sam1_encoder_normalized``), ``get_image_embedding`` through the stateless encoder;
    both equal ``SamPredictor`` on the same weights, within the SAM1 parity suite's
    tolerances (tests/parity/test_sam1_parity.py). Compared with the official predictor in
    this process, not with a second server: a second ViT-B server beside this three-family
    one outgrew the CI machine's memory."""
    from prompt_matrix import assert_same, predictor_predict
    from segment_anything import SamPredictor

    from triton_sam.client import SAM2TritonClient
    from triton_sam.export.sam1 import build_model
    from triton_sam.models import get_model
    from triton_sam.tools.sample import sample_image

    image = sample_image(480, 640)  # portrait, non-square: the padding is ours, not Paintera's
    prompt = dict(point_coords=[[200, 300]], point_labels=[1], multimask_output=True)
    with SAM2TritonClient(
        server.grpc_url, model_type="sam1", protocol="grpc", use_server_embeddings=True
    ) as client:
        client.set_image(image)
        ours = client.predict_full(**prompt)
        embedding = client.get_image_embedding()["image_embeddings"]
        assert client.encoder_model == "sam1_encoder_normalized"
    predictor = SamPredictor(build_model(get_model("sam1_vit_b"), sam1_vit_b_checkpoint))
    predictor.set_image(image)
    ref = predictor_predict(predictor, **prompt)
    # SAM1 parity suite's bounds: scores 1e-5, logits 5e-5, embedding 1e-4 absolute (values
    # of order 1: ~100-800 float32 ulps), masks IoU >= 0.99
    np.testing.assert_allclose(embedding, predictor.features.numpy(), atol=1e-4, rtol=0)
    assert_same(ours, *ref, hw=(640, 480), score_atol=1e-5, logit_atol=5e-5, min_iou=0.99)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_our_client_names_a_missing_encoder_as_before(server, protocol):
    """The encoder's metadata replaced its readiness check on start-up: a missing encoder
    is still reported as not ready, with what to run."""
    from triton_sam.client import SAM2TritonClient
    from triton_sam.errors import ServerUnavailableError

    url = server.grpc_url if protocol == "grpc" else server.http_url
    with pytest.raises(ServerUnavailableError, match="'no_such_encoder' is not ready.*setup"):
        SAM2TritonClient(url, model_type="sam1", protocol=protocol, encoder_model="no_such_encoder")
