"""An export that dies midway leaves the previous model repository as it was.

The writer's own crash tests (test_writer.py) cover failures inside one model write; these
cover the whole pipeline failing after the export wrote part of its output, and a process
killed with SIGKILL while it copies a model into place.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from triton_sam.errors import ExportError
from triton_sam.models import get_model
from triton_sam.repository.config import RepositoryOptions, render_config
from triton_sam.repository.writer import list_models, write_model
from triton_sam.setup import pipeline

SPEC = get_model("sam2.1_hiera_tiny")


def _previous_repository(root: Path) -> Path:
    repo = root / "model_repository"
    for graph, name in (("encoder", "sam2_encoder"), ("decoder", "sam2_decoder")):
        onnx = root / f"{graph}_v1.onnx"
        onnx.write_bytes(f"{graph} v1".encode())
        text = render_config(SPEC.family, graph, RepositoryOptions(target="python"))
        write_model(repo, name, onnx, text, target="python")
    return repo


def _snapshot(repo: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(repo)): p.read_bytes() for p in sorted(repo.rglob("*")) if p.is_file()
    }


def _hidden(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def test_export_failing_midway_leaves_the_previous_models_and_no_scratch(tmp_path, monkeypatch):
    repo = _previous_repository(tmp_path)
    before = _snapshot(repo)

    def half_export(spec, checkpoint, out_dir, options=None, **kwargs):
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "encoder.onnx").write_bytes(b"half an encoder")  # then it dies
        raise ExportError("torch.onnx.export failed: out of memory")

    monkeypatch.setattr(pipeline, "export_model", half_export)
    checkpoint = tmp_path / "ckpt.pt"
    checkpoint.write_bytes(b"weights")
    with pytest.raises(ExportError, match="out of memory"):
        pipeline.build_repository(SPEC, repo, checkpoint=checkpoint)
    assert _snapshot(repo) == before
    assert _hidden(tmp_path) == [], "scratch or staging directories left behind"
    assert list_models(repo) == ["sam2_decoder", "sam2_encoder"]


def test_writer_killed_midway_leaves_the_previous_model_then_recovers(tmp_path):
    repo = _previous_repository(tmp_path)
    before = _snapshot(repo)
    big = tmp_path / "encoder_v2.onnx"
    big.write_bytes(b"v2" * (1 << 20))
    started = tmp_path / "copying"
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from triton_sam.repository import writer
        from triton_sam.repository.config import RepositoryOptions, render_config
        from triton_sam.models import get_model

        def slow_copy(source, dest):
            with open(source, "rb") as src, open(dest, "wb") as out:
                out.write(src.read(1000))
                out.flush()
                Path({str(started)!r}).touch()
                time.sleep(60)  # killed here, mid-copy

        writer._copy = slow_copy
        family = get_model("sam2.1_hiera_tiny").family
        text = render_config(family, "encoder", RepositoryOptions(target="python"))
        writer.write_model({str(repo)!r}, "sam2_encoder", {str(big)!r}, text, target="python")
        """
    )
    process = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert process.poll() is None, "the writer exited before copying"
            assert time.monotonic() < deadline, "the writer never started copying"
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert _snapshot(repo) == before, "the served model changed under a killed writer"
    assert list(repo.iterdir()) and not _hidden(repo)  # staging never inside the repository
    # the next write of that model cleans the killed one's staging directory
    new = tmp_path / "encoder_v3.onnx"
    new.write_bytes(b"v3")
    text = render_config(SPEC.family, "encoder", RepositoryOptions(target="python"))
    write_model(repo, "sam2_encoder", new, text, target="python")
    assert (repo / "sam2_encoder" / "1" / "model.onnx").read_bytes() == b"v3"
    assert _hidden(tmp_path) == []
