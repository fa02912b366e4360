"""The walk of an image from ``SAM2TritonClient.set_image`` (scripts/client_walk.py): each
client file entered once, from above, and the image file read once."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "client_walk.py"
# API -> image-session core -> flows -> readers and request builders -> the wire's modules.
LAYERS = ["sync.py", "image_session.py", "flow.py", "image_io.py", "embedding_path.py"]
WIRE = {"transport.py", "wire.py", "routing.py", "retry.py", "wire_errors.py"}
MOST_STOPS = 10  # as measured: a new stop (a new back-and-forth) fails here


def _script():
    spec = importlib.util.spec_from_file_location("client_walk", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["client_walk"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode", ["array", "path"])
def test_set_image_reads_one_way(mode):
    walk = _script().walk(mode)
    assert walk.files[: len(LAYERS)] == LAYERS, walk.stops
    assert set(walk.files[len(LAYERS) :]) <= WIRE, walk.stops
    assert walk.returns == [], walk.returns  # no hook or helper calls an upper file back
    assert walk.layers == ["api", "core", "flows", "requests", "wire"], walk.stops
    assert len(walk.stops) <= MOST_STOPS and walk.hops == len(walk.stops) - 1, walk.stops
    if mode == "path":
        assert walk.opens == 1


def test_the_script_prints_its_counts():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--mode", "path"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # this tree's package, not another's
    ).stdout
    assert "sync.py:set_image" in out
    assert "returns 0, file opened 1x" in out
