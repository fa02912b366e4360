"""The served segment-everything model without a server: its config, the client's requests,
answers and errors (the live model: tests/integration/test_everything_serving.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from triton_sam.client import everything as client
from triton_sam.client.transport import Endpoint
from triton_sam.errors import (
    EmbeddingNotFoundError,
    ImageNotSetError,
    InputValidationError,
    InvalidRequestError,
    RequestCancelledError,
    ServerError,
    ServerOverloadedError,
    UnsupportedModelError,
)
from triton_sam.models.registry import get_family
from triton_sam.repository.config import parse_config
from triton_sam.repository.everything_job import (
    EverythingOptions,
    build_everything_config,
    everything_artifact,
    serves_everything,
)
from triton_sam.repository.writer import embedded_twin, written_by_triton_sam
from triton_sam.serving import masks
from triton_sam.serving import protocol as envelope
from triton_sam.serving.protocol import everything as protocol


@pytest.mark.parametrize("family", ["sam1", "sam2"])
def test_config_is_a_decoupled_one_job_per_request_model_over_the_session_model(family):
    spec = get_family(family)
    config = build_everything_config(spec)
    assert config.name == f"{family}_everything" and config.backend == "python"
    assert config.model_transaction_policy.decoupled  # progress, then the instances
    assert config.max_batch_size == 0  # one job per request, never batched
    assert all(t.optional for t in config.input)
    assert [t.name for t in config.input] == [
        protocol.IMAGE_BYTES,
        protocol.IMAGE_RGB,
        protocol.IMAGE_ID,
        protocol.PARAMS,
        protocol.HANDLE,  # a large image's block, read from the large model
        protocol.BLOCK,
        protocol.Z,
    ]
    assert [t.name for t in config.output] == [protocol.PROGRESS, protocol.INSTANCES]
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert set(params) == set(protocol.PARAM_KEYS)
    assert params[protocol.PARAM_KIND] == envelope.KIND_EVERYTHING
    assert params[protocol.PARAM_SESSION_MODEL] == spec.session_model
    assert params[protocol.PARAM_DECODER_MODEL] == f"{family}_everything_decoder"
    assert params[protocol.PARAM_EMBEDDING_NAMES] == ",".join(spec.embedding_names)
    assert params[protocol.PARAM_MAX_CONCURRENT_JOBS] == "1"
    assert params[protocol.PARAM_LARGE_MODEL] == f"{family}_large"


def test_only_the_families_with_an_official_generator_get_one():
    assert serves_everything(get_family("sam1")) and serves_everything(get_family("sam2"))
    assert not serves_everything(get_family("sam3"))


def test_admission_options_are_validated():
    with pytest.raises(InputValidationError, match="max_concurrent_jobs"):
        EverythingOptions(max_concurrent_jobs=0)
    with pytest.raises(InputValidationError, match="max_waiting_jobs"):
        EverythingOptions(max_waiting_jobs=-1)


def test_the_embedded_twin_keeps_it_decoupled_on_one_cpu_instance():
    artifact = everything_artifact(get_family("sam2"))
    assert written_by_triton_sam(artifact)
    assert {"model.py", "triton_sam_serving/everything/__init__.py"} <= set(artifact.files)
    twin = parse_config(embedded_twin(artifact, "onnxruntime").config_text)
    assert twin.model_transaction_policy.decoupled
    (group,) = twin.instance_group
    assert group.count == 1 and group.kind == group.KIND_CPU


# -- the client ----------------------------------------------------------------------------------
def test_params_are_checked_before_anything_is_sent_naming_the_field():
    assert json.loads(client.check_params("sam2", {"points_per_side": 8})) == {"points_per_side": 8}
    for bad, field in [
        ({"points_per_side": 0}, "params.points_per_side"),
        ({"points_per_side": 10000}, "params.points_per_side"),
        ({"pred_iou_thresh": float("nan")}, "params.pred_iou_thresh"),
        ({"crop_n_layers": 9}, "params.crop_n_layers"),
        ({"no_such_key": 1}, "params"),
    ]:
        with pytest.raises(InputValidationError, match=field):
            client.check_params("sam2", bad)


def test_sam3_has_no_everything_model():
    with pytest.raises(UnsupportedModelError, match="model_type"):
        client.job_model(get_family("sam3"), "sam3", "sam3_session")
    assert client.job_model(get_family("sam1"), "sam1", "sam1_session") == "sam1_everything"


def test_inputs_carry_a_file_s_bytes_pixels_or_an_id(tmp_path):
    rgb = np.zeros((6, 8, 3), np.uint8)
    path = tmp_path / "a.png"
    Image.fromarray(rgb).save(path)
    by_file = client.job_inputs(path, params_json="{}")
    assert bytes(by_file[protocol.IMAGE_BYTES][0]) == path.read_bytes()
    by_pixels = client.job_inputs(rgb)
    assert by_pixels[protocol.IMAGE_RGB].shape == (6, 8, 3)
    by_id = client.job_inputs(image_id="abc")
    assert set(by_id) == {protocol.PARAMS, protocol.IMAGE_ID}


def test_the_current_image_goes_by_id_with_its_pixels_as_the_fallback():
    class Cached:
        image_id, rgb = "id-1", np.zeros((4, 4, 3), np.uint8)

    first, fallback = client.job_requests(None, Cached(), "{}")
    assert bytes(first[protocol.IMAGE_ID][0]) == b"id-1"
    assert fallback is not None and protocol.IMAGE_RGB in fallback
    with pytest.raises(ImageNotSetError):
        client.job_requests(None, None, "{}")


def test_the_answer_is_parsed_and_its_masks_decode():
    mask = np.zeros((5, 7), bool)
    mask[1:3, 2:6] = True
    record = {
        "segmentation": {"size": [5, 7], "counts": masks.encode_rle(mask).decode()},
        "area": 8,
    }
    result = client.parse_answer(json.dumps({"image_size": [5, 7], "instances": [record]}))
    assert result.image_size == (5, 7) and len(result) == 1
    assert np.array_equal(result.masks()[0], mask)


def test_stream_errors_become_the_package_errors_by_their_code():
    cases = {
        envelope.ERR_INVALID_INPUT: InvalidRequestError,
        envelope.ERR_EMBEDDING_NOT_FOUND: EmbeddingNotFoundError,
        envelope.ERR_OVERLOADED: ServerOverloadedError,
        envelope.ERR_CANCELLED: RequestCancelledError,
        envelope.ERR_INTERNAL: ServerError,
    }
    for code, kind in cases.items():
        error = client.stream_error(envelope.error_message(code, "params.x: bad"))
        assert type(error) is kind and "params.x" in str(error)


def test_the_grpc_endpoint_beside_an_http_one():
    http = Endpoint("host:8000", "http", False)
    assert client.grpc_endpoint(http, None).address == "host:8001"
    assert client.grpc_endpoint(Endpoint("h:9001", "grpc", False), None).address == "h:9001"
    assert client.grpc_endpoint(http, "other:7001").address == "other:7001"
    with pytest.raises(InputValidationError, match="grpc_url"):
        client.grpc_endpoint(Endpoint("host:18000", "http", False), None)
