"""The Makefile's preflights: refuse a disk too small for the venv, or an interpreter the lock
is not for, with what to do next."""

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
    recipe = makefile.split("$(STAMP):", 1)[1]
    assert recipe.index("check_disk.sh") < recipe.index("-m venv")


# -- the interpreter preflight (the lock pins wheels for one Python) ---------------------------
PYTHON_CHECK = SCRIPT.with_name("check_python.sh")


def _check_python(python: str, want: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(PYTHON_CHECK), python, want], capture_output=True, text=True, timeout=30
    )


def test_the_lock_interpreter_passes_and_another_is_refused_with_a_way_out() -> None:
    import platform
    import sys

    have = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if platform.machine() == "x86_64":
        assert _check_python(sys.executable, have).returncode == 0
    refused = _check_python(sys.executable, "2.7")
    assert refused.returncode == 1
    assert f"is {have} on {platform.machine()}" in refused.stderr
    assert "make PYTHON=python2.7" in refused.stderr
    missing = _check_python("/nonexistent/python", "3.11")
    assert missing.returncode == 1 and "not a working Python" in missing.stderr


def test_the_makefile_checks_the_interpreter_before_the_venv() -> None:
    makefile = (SCRIPT.parents[1] / "Makefile").read_text()
    recipe = makefile.split("$(STAMP):", 1)[1]
    assert recipe.index("check_python.sh") < recipe.index("-m venv")
