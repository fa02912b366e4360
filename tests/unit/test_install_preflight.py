"""The Makefile's disk preflight: refuse a disk too small for the venv, with what to do next."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_disk.sh"


def _run(directory: Path, need_gb: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), str(directory), str(need_gb)],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_enough_space_passes_silently(tmp_path: Path) -> None:
    result = _run(tmp_path, 0)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_too_little_space_is_refused_with_a_way_out(tmp_path: Path) -> None:
    result = _run(tmp_path, 10**9)  # an exabyte: no disk has it
    assert result.returncode == 1
    assert "needs about 1000000000 GB free" in result.stderr
    assert "make VENV=" in result.stderr


def test_a_venv_parent_that_does_not_exist_yet_is_measured_on_its_ancestor(
    tmp_path: Path,
) -> None:
    assert _run(tmp_path / "not" / "yet", 0).returncode == 0
    assert _run(tmp_path / "not" / "yet", 10**9).returncode == 1


def test_the_makefile_runs_the_preflight_before_pip() -> None:
    makefile = (SCRIPT.parents[1] / "Makefile").read_text()
    recipe = makefile.split("$(STAMP): pyproject.toml Makefile", 1)[1]
    assert recipe.index("check_disk.sh") < recipe.index("-m venv")
