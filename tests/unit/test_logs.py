"""Command-line logs: ours at INFO; other libraries' INFO logs and warnings only with --verbose.

onnxruntime's transformers optimizer logs each fusion at INFO (``fusion_utils: Removed 1
Identity nodes``); printed between the demo's progress bars it broke them mid-line. The
check runs the optimizer's own code on a one-node graph, in a fresh interpreter (logging is
process-wide state), after the set-up the CLI does.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from triton_sam.cli import app, logs

SCRIPT = textwrap.dedent(
    """
    import logging, sys, warnings

    import onnx
    from onnx import TensorProto, helper
    from onnxruntime.transformers.fusion_utils import FusionUtils
    from onnxruntime.transformers.onnx_model import OnnxModel

    from triton_sam.cli.logs import setup_logging

    setup_logging(verbose=sys.argv[1] == "verbose")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
    )
    FusionUtils(OnnxModel(helper.make_model(graph))).remove_identity_nodes()
    logging.getLogger("triton_sam.setup.pipeline").info("exporting the encoder")
    warnings.warn("torch.onnx: a tracer warning", UserWarning)
    logging.getLogger("onnxruntime.transformers.optimizer").warning("a real problem")
    """
)


def _stderr(mode: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
        check=True,
    )
    return done.stderr


@pytest.mark.parametrize("mode", ["quiet", "verbose"])
def test_other_libraries_info_logs_and_warnings_only_when_verbose(mode: str) -> None:
    err = _stderr(mode)
    assert "INFO triton_sam.setup.pipeline: exporting the encoder" in err  # ours, always
    assert "WARNING onnxruntime.transformers.optimizer: a real problem" in err  # always
    third_party = ["Removed 1 Identity nodes", "a tracer warning"]
    if mode == "verbose":
        assert all(line in err for line in third_party), err
    else:
        assert not any(line in err for line in third_party), err
        assert [x for x in err.splitlines() if x.startswith("INFO ")] == [
            "INFO triton_sam.setup.pipeline: exporting the encoder"
        ]


@pytest.mark.parametrize(("args", "verbose"), [([], False), (["--verbose"], True), (["-v"], True)])
def test_the_cli_sets_up_logging_once_before_the_command(
    monkeypatch: pytest.MonkeyPatch, args: list[str], verbose: bool
) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(logs, "setup_logging", lambda *, verbose: calls.append(verbose))
    result = CliRunner().invoke(app, [*args, "models"])
    assert result.exit_code == 0, result.output
    assert calls == [verbose]
