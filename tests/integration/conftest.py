"""Integration fixtures: a live embedded tritonserver over a tiny ONNX repository.

``embedded_triton`` starts servers on free ports (tests may run in parallel) and stops every
one at the end of its test module. The tiny models are built here with ``onnx.helper`` so the
suite needs no export and runs in seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from triton_sam.errors import ServerStartError
from triton_sam.models.spec import FamilySpec, Preprocessing, TensorSpec
from triton_sam.repository.config import RepositoryOptions, render_config
from triton_sam.repository.writer import write_model, write_pair
from triton_sam.server import EmbeddedTriton, find_tritonserver

# encoder: y = 2x + 1 and s = sum(x); decoder: t = sum(p) + sum(x), with a variable
# number of points like SAM's point_coords.
TINY_FAMILY = FamilySpec(
    family="tiny",
    preprocessing=Preprocessing(
        image_size=4,
        resize="square",
        pixel_mean=(0.0, 0.0, 0.0),
        pixel_std=(1.0, 1.0, 1.0),
        pixel_scale=1.0,
        mask_size=1,
    ),
    encoder_inputs=(TensorSpec("x", "float32", (4,)),),
    encoder_outputs=(TensorSpec("y", "float32", (4,)), TensorSpec("s", "float32", (1,))),
    decoder_inputs=(TensorSpec("x", "float32", (4,)), TensorSpec("p", "float32", (-1, 2))),
    decoder_outputs=(TensorSpec("t", "float32", (1,)),),
    exporter="none",
    encoder_model="tiny_encoder",
    decoder_model="tiny_decoder",
)
# Same config as tiny_decoder, but its graph only takes exactly 3 points: Triton accepts
# other counts (the config says -1), onnxruntime then fails inside the runner.
FIXED_DECODER = "tiny_decoder_fixed3"
# Long enough that concurrent requests meet in the queue, short enough not to slow the suite.
QUEUE_DELAY_US = 20_000


def build_tiny_encoder(path: Path) -> Path:
    """ONNX graph: x [b, 4] -> y = 2x + 1 [b, 4], s = sum(x) [b, 1]."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Mul", ["x", "two"], ["x2"]),
        helper.make_node("Add", ["x2", "one"], ["y"]),
        helper.make_node("ReduceSum", ["x", "axis1"], ["s"], keepdims=1),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])]
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4]),
        helper.make_tensor_value_info("s", TensorProto.FLOAT, ["b", 1]),
    ]
    return _save(path, nodes, inputs, outputs)


def build_tiny_decoder(path: Path, points: int | str = "n") -> Path:
    """ONNX graph: x [b, 4], p [b, points, 2] -> t = sum(p) + sum(x) [b, 1]."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("ReduceSum", ["p", "axis2"], ["p1"], keepdims=0),
        helper.make_node("ReduceSum", ["p1", "axis1"], ["ps"], keepdims=1),
        helper.make_node("ReduceSum", ["x", "axis1"], ["xs"], keepdims=1),
        helper.make_node("Add", ["ps", "xs"], ["t"]),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4]),
        helper.make_tensor_value_info("p", TensorProto.FLOAT, ["b", points, 2]),
    ]
    outputs = [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["b", 1])]
    return _save(path, nodes, inputs, outputs)


def _save(path: Path, nodes: list, inputs: list, outputs: list) -> Path:
    import onnx
    from onnx import TensorProto, helper

    consts = [
        helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
        helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
        helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
        helper.make_tensor("axis2", TensorProto.INT64, [1], [2]),
    ]
    used = {name for node in nodes for name in node.input}
    graph = helper.make_graph(
        nodes, path.stem, inputs, outputs, [c for c in consts if c.name in used]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by older onnxruntime builds too
    onnx.checker.check_model(model)
    onnx.save_model(model, str(path))
    return path


@pytest.fixture(scope="session")
def tiny_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A python-target repository: tiny_encoder, tiny_decoder and tiny_decoder_fixed3."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    work = tmp_path_factory.mktemp("tiny")
    repo = work / "model_repository"
    options = RepositoryOptions(target="python", max_queue_delay_us=QUEUE_DELAY_US)
    encoder = build_tiny_encoder(work / "encoder.onnx")
    decoder = build_tiny_decoder(work / "decoder.onnx")
    write_pair(repo, TINY_FAMILY, encoder_onnx=encoder, decoder_onnx=decoder, options=options)
    fixed = build_tiny_decoder(work / "decoder_fixed3.onnx", points=3)
    text = render_config(TINY_FAMILY, "decoder", options, name=FIXED_DECODER)
    write_model(repo, FIXED_DECODER, fixed, text, target="python")
    return repo


@pytest.fixture(scope="module")
def embedded_triton(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., EmbeddedTriton]]:
    """A function ``start(repository, **kwargs) -> EmbeddedTriton`` (ready, on free ports).

    Every server it started is stopped when the test module ends (a test may stop one
    earlier): module scope, not session, so servers do not pile up in memory over the suite.
    Skips when the nvidia-pytriton wheel (the tritonserver binary) is not installed.
    """
    try:
        find_tritonserver()
    except ServerStartError as e:
        pytest.skip(str(e))
    servers: list[EmbeddedTriton] = []

    def start(repository: Path, **kwargs: object) -> EmbeddedTriton:
        kwargs.setdefault("log_path", tmp_path_factory.mktemp("triton") / "tritonserver.log")
        kwargs.setdefault("startup_timeout_s", 60.0)
        server = EmbeddedTriton(repository, http_port=0, grpc_port=0, metrics_port=0, **kwargs)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()
