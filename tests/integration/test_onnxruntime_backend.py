"""Every family's export loads in Triton's own onnxruntime backend and computes there what
onnxruntime computes in-process; the committed model_repository/ configs load as they are.

The embedded server loads configs strictly (no auto-completion) on the onnxruntime backend
found by ``triton_sam.server.find_onnxruntime_backend`` (``../shared/...`` on CI machines):

- SAM1 ViT-B with its weights in ``.onnx_data`` sidecars, SAM2.1-tiny, the SAM3 tracker (our
  export, and the onnx-community pair exported from the same random weights and imported as
  is): the session fixtures' servers, which the parity tests also use;
- SAM2.1-tiny exported with ``--fp16`` (fp16 weights and compute, fp32 I/O): its own server;
- the committed ``model_repository/`` configs (base_plus's, the same SAM2 tensor contract)
  with the tiny graphs in their version folders: only the mechanical CPU changes applied.

Tolerance: the backend runs the same graph with the same onnxruntime library (the wheel's)
on the same inputs, so outputs are compared exactly (measured: bit-identical), except where
the dynamic batcher may batch; every request here runs alone.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from triton_sam.client import SAM2TritonClient
from triton_sam.client.prompts import build_decoder_prompts
from triton_sam.client.transport import Transport, resolve_endpoint
from triton_sam.models import get_family
from triton_sam.repository.config import (
    background_cpu_encoder,
    bounded_cpu_encoder,
    parse_config,
    size_cpu_decoder,
    to_cpu_twin,
    unbatched_cpu_decoder,
    with_warmup,
)
from triton_sam.repository.writer import embedded_repository
from triton_sam.tools.sample import sample_image

pytestmark = [
    pytest.mark.slow,
    pytest.mark.triton,
    pytest.mark.timeout(900),
    pytest.mark.uses_servers("sam1_vit_b_server", "sam2_tiny_server", "sam3_server"),
]

COMMITTED = Path(__file__).resolve().parents[2] / "model_repository"
# (server fixture, family, encoder model, decoder model)
SERVED = {
    "sam1_vit_b_external_data": ("sam1_vit_b_server", "sam1", "sam1_encoder", "sam1_decoder"),
    "sam2.1_tiny": ("sam2_tiny_server", "sam2", "sam2_encoder", "sam2_decoder"),
    "sam2.1_tiny_fp16": ("sam2_fp16_server", "sam2", "sam2_encoder", "sam2_decoder"),
    "sam3_tracker": ("sam3_server", "sam3", "sam3_encoder", "sam3_decoder"),
    "sam3_onnx_community": (
        "sam3_server", "sam3_onnx_community", "sam3c_encoder", "sam3c_decoder",
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def sam2_fp16_server(sam2_tiny_spec, sam2_tiny_checkpoint, embedded_triton, tmp_path_factory):
    from triton_sam.export import ExportOptions
    from triton_sam.setup.pipeline import build_repository

    repo = tmp_path_factory.mktemp("sam2_fp16") / "model_repository"
    build_repository(
        sam2_tiny_spec,
        repo,
        checkpoint=sam2_tiny_checkpoint,
        export_options=ExportOptions(fp16=True),
    )
    server = embedded_triton(embedded_repository(repo))
    yield server
    server.stop()


def _served_config(server, model: str) -> dict:
    with urllib.request.urlopen(f"{server.http_url}/v2/models/{model}/config", timeout=10) as r:
        return json.load(r)


def _repository_dir(server, model: str) -> Path:
    return server.repository / model / "1"


@pytest.mark.parametrize("case", list(SERVED))
def test_export_loads_in_the_onnxruntime_backend_and_matches_in_process_onnxruntime(request, case):
    import onnxruntime as ort

    fixture, family_name, encoder, decoder = SERVED[case]
    server = request.getfixturevalue(fixture)
    family = get_family(family_name)
    for model in (encoder, decoder):
        served = _served_config(server, model)
        # The real backend, not the runner, and only the CPU changes to the production config.
        assert (served["platform"], served["backend"]) == ("onnxruntime_onnx", "onnxruntime")
        assert [g["kind"] for g in served["instance_group"]] == ["KIND_CPU"]
        assert served["dynamic_batching"] and served["max_batch_size"] > 0
    size = family.preprocessing.image_size
    image = np.random.default_rng(5).standard_normal((1, 3, size, size)).astype(np.float32)
    feeds = {family.encoder_inputs[0].name: image}
    prompts = build_decoder_prompts(
        point_coords=[[0.3 * size, 0.6 * size], [0.5 * size, 0.2 * size]],
        point_labels=[1, 0],
        box=[0.1 * size, 0.1 * size, 0.7 * size, 0.8 * size],
        mask_input=None,
        orig_hw=(size, size),
        family=family,
    )
    local = {
        m: ort.InferenceSession(
            str(_repository_dir(server, m) / "model.onnx"), providers=["CPUExecutionProvider"]
        )
        for m in (encoder, decoder)
    }
    transport = Transport(resolve_endpoint(server.grpc_url, "grpc"))
    try:
        names = list(family.embedding_names)
        served_embeddings = transport.infer(encoder, feeds, names)
        expected = dict(zip(names, local[encoder].run(names, feeds), strict=True))
        for name in names:
            np.testing.assert_array_equal(served_embeddings[name], expected[name], err_msg=name)
        dec_feeds = {**expected, **prompts}
        outputs = [t.name for t in family.decoder_outputs]
        served_out = transport.infer(decoder, dec_feeds, outputs)
        expected_out = dict(zip(outputs, local[decoder].run(outputs, dec_feeds), strict=True))
    finally:
        transport.close()
    for name in outputs:
        np.testing.assert_array_equal(served_out[name], expected_out[name], err_msg=name)
        assert np.isfinite(served_out[name]).all()


def test_fp16_graphs_keep_fp32_io_and_fixed_output_dims(sam2_fp16_server):
    import onnx

    repo = sam2_fp16_server.repository
    graph = onnx.load(str(repo / "sam2_encoder/1/model.onnx"), load_external_data=False)
    types = {o.type.tensor_type.elem_type for o in graph.graph.output}
    assert types == {onnx.TensorProto.FLOAT}
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.graph.initializer)
    dims = [d.dim_value for d in graph.graph.output[0].type.tensor_type.shape.dim[1:]]
    assert dims == [256, 64, 64]


@pytest.fixture(scope="module")
def committed_repository(sam2_tiny_export, tmp_path_factory) -> Path:
    """The committed configs as they are, with the tiny export's graphs in ``1/``."""
    repo = tmp_path_factory.mktemp("committed") / "model_repository"
    shutil.copytree(COMMITTED, repo)
    for model in ("sam2_encoder", "sam2_decoder", "sam2_session"):
        shutil.copytree(sam2_tiny_export / model / "1", repo / model / "1", symlinks=True)
    return repo


def test_committed_configs_load_with_only_the_mechanical_cpu_changes(
    committed_repository, embedded_triton
):
    twin_dir = embedded_repository(committed_repository)
    cores = len(os.sched_getaffinity(0))
    for model in ("sam2_encoder", "sam2_decoder"):
        expected = to_cpu_twin(parse_config(COMMITTED / model / "config.pbtxt"))
        if model == "sam2_decoder":  # the session model's decoder: sized for this host
            expected = with_warmup(size_cpu_decoder(expected, cores))
        else:  # its encoder: batch 1, so onnxruntime's CPU arena stays at one image's size
            expected = bounded_cpu_encoder(expected)
        assert parse_config(twin_dir / model / "config.pbtxt") == expected
    # The session model's clicks run on an unbatched copy of its decoder, its embeds on a
    # background copy of its encoder (the python runner at a lower CPU priority).
    unbatched = unbatched_cpu_decoder(parse_config(twin_dir / "sam2_decoder" / "config.pbtxt"))
    assert parse_config(twin_dir / unbatched.name / "config.pbtxt") == unbatched
    encoder = parse_config(twin_dir / "sam2_encoder" / "config.pbtxt")
    background = background_cpu_encoder(encoder, cores)
    assert parse_config(twin_dir / background.name / "config.pbtxt") == background
    session = parse_config(twin_dir / "sam2_session" / "config.pbtxt")
    assert session.parameters["encoder_model"].string_value == background.name
    served = ["sam2_encoder", "sam2_decoder", "sam2_session", unbatched.name, background.name]
    server = embedded_triton(twin_dir)
    for model in served:
        assert _served_config(server, model)["instance_group"][0]["kind"] == "KIND_CPU"
    with SAM2TritonClient(server.grpc_url, protocol="grpc") as client:
        assert client.uses_server_embeddings  # the session model's BLS on the real backend
        client.set_image(sample_image(160, 120))
        masks, iou = client.predict(point_coords=[[80, 60]], point_labels=[1])
    assert masks.shape == (1, 1, 120, 160) and np.isfinite(masks).all()
    assert iou.shape == (1, 1)
    server.stop()
