"""scripts/build_onnxruntime_backend.sh (`make onnxruntime-backend`): what can be checked
offline. The build itself clones Triton's sources from GitHub; it was run on this machine's
kind with SOURCES_DIR (the four repositories at r24.10) and its output served the tests.

``--check`` runs every precondition and prints what would be built from what. The RapidJSON
headers are faked through CPLUS_INCLUDE_PATH (the check only compiles an #include of them).
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from triton_sam.server import backends

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build_onnxruntime_backend.sh"


def _run(*args: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    include = tmp_path / "include"
    (include / "rapidjson").mkdir(parents=True, exist_ok=True)
    (include / "rapidjson" / "document.h").write_text("// stand-in for the check\n")
    full_env = {**os.environ, "PYTHON": sys.executable, "CPLUS_INCLUDE_PATH": str(include)}
    full_env.update(env)
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full_env, timeout=60
    )


def test_usage_without_an_output_folder(tmp_path):
    result = _run(tmp_path=tmp_path)
    assert result.returncode == 2
    assert "Usage: scripts/build_onnxruntime_backend.sh [--check] OUT_DIR" in result.stderr


def test_check_uses_the_installed_onnxruntime_wheel_and_the_servers_branch(tmp_path):
    import onnxruntime

    result = _run("--check", str(tmp_path / "out"), tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    capi = Path(onnxruntime.__file__).parent / "capi"
    (library,) = glob.glob(str(capi / "libonnxruntime.so.*"))
    assert f"onnxruntime:      {library} ({onnxruntime.__version__}, soname" in result.stdout
    assert metadata.version("nvidia-pytriton").startswith("0.7.")  # tritonserver 2.51
    assert "triton branch:    r24.10" in result.stdout
    assert "github.com/triton-inference-server/{onnxruntime_backend,backend,core,common}" in (
        result.stdout
    )
    assert not (tmp_path / "out").exists()  # --check builds nothing


def test_a_header_newer_than_the_library_is_refused(tmp_path):
    result = _run("--check", str(tmp_path / "out"), tmp_path=tmp_path, ORT_HEADER_VERSION="1.999.0")
    assert result.returncode == 1
    assert "header version 999 is newer than the library" in result.stderr


def test_offline_sources_must_hold_the_four_repositories(tmp_path):
    sources = tmp_path / "src"
    (sources / "onnxruntime_backend").mkdir(parents=True)
    (sources / "onnxruntime_backend" / "CMakeLists.txt").write_text("")
    result = _run("--check", str(tmp_path / "out"), tmp_path=tmp_path, SOURCES_DIR=str(sources))
    assert result.returncode == 1
    assert "has no backend/CMakeLists.txt" in result.stderr


def test_missing_rapidjson_says_which_package(tmp_path):
    env = {"CPLUS_INCLUDE_PATH": str(tmp_path / "empty")}
    if Path("/usr/include/rapidjson/document.h").exists():
        pytest.skip("rapidjson-dev is installed system-wide here")
    result = _run("--check", str(tmp_path / "out"), tmp_path=tmp_path, **env)
    assert result.returncode == 1 and "apt-get install rapidjson-dev" in result.stderr


def test_make_builds_where_the_server_looks_first():
    makefile = (ROOT / "Makefile").read_text()
    match = re.search(r"^ORT_BACKEND := \$\(VENV\)/(\S+)$", makefile, re.MULTILINE)
    assert match and Path(match[1]) == backends.BUILT_ORT_BACKEND
    assert backends.onnxruntime_backend_candidates()[0] == Path(sys.prefix) / match[1]
    recipe = makefile.split("$(ORT_BACKEND)/libtriton_onnxruntime.so:", 1)[1].split("\n\n")[0]
    assert "scripts/build_onnxruntime_backend.sh $(ORT_BACKEND)" in recipe
