"""A repository of the user's own models next to ours, served by the embedded server.

The SAM2.1-tiny models (production configs, as ``triton-sam setup`` writes them) share a
repository with a python model of the user's own, named ``sam2`` like the Lambda seed's (a
``KIND_GPU`` instance group, a file beside its ``model.py`` that it reads at load) and an
ONNX model of the user's own (``KIND_GPU`` too). The CPU twin serves all of them, in poll
mode as ``triton-sam serve`` runs it: each model loads once (nothing reloads by itself), the
user's models answer raw requests correctly, and a click on ours still works. A model of
ours that is stale (written before model kinds) is refused before any server starts.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from triton_sam.client import SAM2TritonClient
from triton_sam.errors import RepositoryError
from triton_sam.repository.config import config_to_text, model_config_pb2, parse_config
from triton_sam.repository.writer import embedded_repository, list_models
from triton_sam.serving.protocol import KIND_PARAM

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(900)]

SCALE = 2.5  # what the user's model reads from the file beside its model.py
USER_MODEL_PY = """
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.scale = float(Path(__file__).with_name("scale.txt").read_text())

    def execute(self, requests):
        answers = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = pb_utils.Tensor("y", (x * self.scale).astype(np.float32))
            answers.append(pb_utils.InferenceResponse([y]))
        return answers
"""
USER_PYTHON_CONFIG = """
name: "sam2"
backend: "python"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
instance_group [ { count: 1 kind: KIND_GPU } ]
"""
USER_ONNX_CONFIG = """
name: "plus_one"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
instance_group [ { count: 1 kind: KIND_GPU } ]
"""


def _plus_one_onnx(path: Path) -> Path:
    """ONNX graph: x [b, 3] -> y = x + 1."""
    import onnx
    from onnx import TensorProto, helper

    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"])],
        "plus_one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3])],
        [one],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))
    return path


def _user_models(repo: Path) -> None:
    python = repo / "sam2"
    (python / "1").mkdir(parents=True)
    (python / "config.pbtxt").write_text(USER_PYTHON_CONFIG)
    (python / "1" / "model.py").write_text(USER_MODEL_PY)
    (python / "1" / "scale.txt").write_text(str(SCALE))
    onnx_model = repo / "plus_one"
    (onnx_model / "1").mkdir(parents=True)
    (onnx_model / "config.pbtxt").write_text(USER_ONNX_CONFIG)
    _plus_one_onnx(onnx_model / "1" / "model.onnx")


@pytest.fixture(scope="module")
def mixed_repository(sam2_tiny_export, tmp_path_factory) -> Path:
    """Our SAM2.1-tiny models (linked, not copied) and the user's two models."""
    repo = tmp_path_factory.mktemp("mixed") / "model_repository"
    repo.mkdir()
    for name in list_models(sam2_tiny_export):
        if name != "sam2":  # the user's own sam2 takes the name (setup keeps it so)
            (repo / name).symlink_to(sam2_tiny_export / name, target_is_directory=True)
    _user_models(repo)
    return repo


def _infer(url: str, model: str, x: list[list[float]]) -> np.ndarray:
    """A raw KServe v2 JSON request (no client of ours)."""
    body = {"inputs": [{"name": "x", "shape": [len(x), 3], "datatype": "FP32", "data": x}]}
    request = urllib.request.Request(
        f"{url}/v2/models/{model}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        answer = json.load(r)
    (y,) = answer["outputs"]
    return np.asarray(y["data"], dtype=np.float32).reshape(y["shape"])


def _ready(url: str, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v2/models/{model}/ready", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def test_the_users_models_are_served_next_to_ours_in_poll_mode(mixed_repository, embedded_triton):
    twin = embedded_repository(mixed_repository)
    served = list_models(twin)
    assert {"sam2", "plus_one", "sam2_encoder", "sam2_decoder", "sam2_session"} <= set(served)
    cpu = model_config_pb2.ModelInstanceGroup.KIND_CPU
    for name in ("sam2", "plus_one"):
        assert parse_config(twin / name / "config.pbtxt").instance_group[0].kind == cpu
    server = embedded_triton(twin, model_control="poll", repository_poll_s=1)
    assert [m for m in served if not _ready(server.http_url, m)] == []

    x = [[1.0, 2.0, 3.0], [-1.0, 0.0, 0.5]]
    np.testing.assert_array_equal(_infer(server.http_url, "sam2", x), np.float32(x) * SCALE)
    np.testing.assert_array_equal(_infer(server.http_url, "plus_one", x), np.float32(x) + 1)
    with SAM2TritonClient(server.http_url) as ours:  # our models, in the same server
        image = np.random.default_rng(0).integers(0, 256, (64, 96, 3), dtype=np.uint8)
        ours.set_image(image)
        masks, iou = ours.predict(point_coords=[[40, 30]], point_labels=[1])
    assert masks.shape == (1, 1, 64, 96) and iou.shape == (1, 1)

    # Poll mode reloads a model whose files change: the user's folder is precompiled like
    # ours, so nothing changes by itself and every model loaded exactly once.
    time.sleep(4.0)  # several scans of the repository (every 1 s)
    loaded = re.findall(r"successfully loaded '([^']+)'", server.log_path.read_text())
    assert sorted(loaded) == sorted(served), loaded


def test_a_stale_model_of_ours_is_refused_with_what_to_do(sam2_tiny_export, tmp_path):
    """Our session model as a triton-sam from before model kinds wrote it, beside a user's."""
    repo = tmp_path / "model_repository"
    repo.mkdir()
    for name in list_models(sam2_tiny_export):
        if name != "sam2":  # the user's own sam2 takes the name (setup keeps it so)
            (repo / name).symlink_to(sam2_tiny_export / name, target_is_directory=True)
    (repo / "sam2_session").unlink()  # a copy: its config changes below
    shutil.copytree(sam2_tiny_export / "sam2_session", repo / "sam2_session")
    _user_models(repo)
    config = parse_config(repo / "sam2_session" / "config.pbtxt")
    del config.parameters[KIND_PARAM]
    (repo / "sam2_session" / "config.pbtxt").write_text(config_to_text(config))
    with pytest.raises(RepositoryError) as info:
        embedded_repository(repo)
    message = str(info.value)
    assert "'sam2_session'" in message and "older triton-sam" in message
    assert "triton-sam setup" in message
    assert "'sam2'" not in message and "plus_one" not in message  # the user's are fine
    assert not (tmp_path / "model_repository_embedded").exists()
