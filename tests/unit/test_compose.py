"""Static checks of docker-compose.yml (no Docker engine here, so this is the check).

The file is parsed with pyyaml and interpolated the way ``docker compose`` does
(``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?error}``, ``${VAR}``, ``$$``), with only
the required admin key set unless a test sets more, so the defaults are what is checked.
The command itself runs on the embedded server in
tests/integration/test_admin_lockdown.py (control APIs 403 without the key, an uploaded model
refused). The image's entrypoint (scripts/triton_entrypoint.sh) runs here with bash.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import stat
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_args import interpolate, walk

from triton_sam.server.admin_key import restriction_args

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
BASE = "nvcr.io/nvidia/tritonserver:24.10-py3"  # Triton 2.51, as the embedded server
IMAGE = "triton-sam-server:24.10"
DOCKERFILE = COMPOSE.with_name("Dockerfile")
LOCK = COMPOSE.parent / "requirements" / "lock-container.txt"
# The python-backend stubs run the base image's system Python: Ubuntu 22.04's 3.10 in every
# r24.xx image (NGC release notes), not the project venv's 3.11.
STUB_PYTHON = "3.10"
ENTRYPOINT = COMPOSE.parent / "scripts" / "triton_entrypoint.sh"
KEY = "a" * 32 + "-compose-test-key"
REQUIRED = {"TRITON_ADMIN_KEY": KEY}


def load(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``triton`` service, interpolated with ``env`` (default: only the admin key set)."""
    data = walk(yaml.safe_load(COMPOSE.read_text()), {**REQUIRED, **(env or {})})
    return data["services"]["triton"]


def _flags(service: dict[str, Any]) -> dict[str, list[str]]:
    """``--name=value`` arguments of the command, by name (a flag may repeat)."""
    command = service["command"]
    assert isinstance(command, list), "use the exec (list) form: no shell quoting issues"
    assert command[0] == "tritonserver"
    flags: dict[str, list[str]] = {}
    for arg in command[1:]:
        name, sep, value = arg.partition("=")
        assert arg.startswith("--") and sep, f"expected --flag=value, got {arg!r}"
        flags.setdefault(name, []).append(value)
    return flags


def _restricted(value: str) -> tuple[set[str], str, str]:
    """Split ``api1,api2:key=value`` into (apis, key, value)."""
    apis, _, header = value.partition(":")
    key, _, secret = header.partition("=")
    return set(apis.split(",")), key, secret


def test_image_and_name():
    service = load()
    assert service["image"] == IMAGE
    assert service["container_name"] == "sam-triton-server"
    assert load({"TRITON_IMAGE": "my/triton:dev"})["image"] == "my/triton:dev"


def test_the_image_is_built_from_the_pinned_dockerfile():
    build = load()["build"]
    assert build["context"] == "." and build["dockerfile"] == "Dockerfile"
    assert build["args"]["TRITON_BASE"] == BASE
    assert load({"TRITON_BASE": "my/base:1"})["build"]["args"]["TRITON_BASE"] == "my/base:1"


def test_dockerfile_pins_its_base_and_installs_the_container_lock():
    text = DOCKERFILE.read_text()
    assert f"ARG TRITON_BASE={BASE}\nFROM ${{TRITON_BASE}}" in text
    copied = re.findall(r"^COPY requirements/lock-container\.txt (\S+)$", text, re.M)
    assert len(copied) == 1, "the container lock is copied into the image once"
    logical = text.replace("\\\n", " ")  # continuation lines joined
    install = re.search(r"^RUN python3 -m pip install (.*)$", logical, re.M)
    assert install, "the stubs' packages are installed with the image's python3"
    args = install[1].split()
    # hashes checked, nothing resolved in the build: the lock holds every dependency
    assert {"--no-cache-dir", "--require-hashes", "--no-deps"} <= set(args)
    assert args[args.index("-r") + 1] == copied[0]
    assert not re.search(r"==\d", text), "no pins beside the lock's"
    assert "COPY scripts/health_check.sh /opt/triton-sam/health_check.sh" in text
    assert "COPY scripts/triton_entrypoint.sh /opt/triton-sam/entrypoint.sh" in text
    assert 'ENTRYPOINT ["/opt/triton-sam/entrypoint.sh"]' in text
    assert "COPY model_repository" not in text  # mounted read-only, never baked in


def _locked() -> dict[str, str]:
    """The container lock's pins, by normalised distribution name."""
    return {
        _dist(n): v for n, v in re.findall(r"^([A-Za-z0-9._-]+)==(\S+) ", LOCK.read_text(), re.M)
    }


def _dist(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_container_lock_is_compiled_for_the_stubs_python():
    header = LOCK.read_text().split("\n", 2)[1]
    assert header.startswith("#    uv pip compile requirements/container.in "), header
    flags = header.split()
    assert flags[flags.index("--python-version") + 1] == STUB_PYTHON
    assert flags[flags.index("--python-platform") + 1] == "x86_64-manylinux_2_35"
    assert "--generate-hashes" in flags and "--no-deps" not in flags  # every dependency
    (recipe,) = [
        line
        for line in (COMPOSE.parent / "Makefile").read_text().splitlines()
        if "requirements/container.in" in line
    ]
    assert STUB_PYTHON in recipe and recipe.endswith("-o requirements/lock-container.txt")
    # r24.10's python backend stub is built against numpy 1.x
    assert _locked()["numpy"].split(".")[0] == "1"


# Not on PyPI: the serving package itself (shipped beside each model.py) and the module the
# python backend's stub provides.
OURS = {"triton_sam", "triton_sam_serving", "triton_python_backend_utils"}


def _shipped_sources() -> set[Path]:
    """Every file a python model ships into the GPU container: each ``serving/*_model.py``
    (but the python target's onnxruntime runner: the container runs Triton's onnxruntime
    backend) with the serving modules it imports (repository.shipping), and
    ``serving/datasets/``, which the ``<family>_large`` model ships and imports lazily."""
    from triton_sam.repository.shipping import SERVING_DIR, shipped_files
    from triton_sam.repository.writer import RUNNER_SOURCE

    models = [p for p in SERVING_DIR.glob("*_model.py") if p != RUNNER_SOURCE]
    files = {*models, *(SERVING_DIR / "datasets").glob("*.py")}
    for model in models:
        files |= set(shipped_files(model).values())
    return files


def _third_party_imports(path: Path) -> set[str]:
    """Top-level names ``path`` imports, at module level or inside functions, that are
    neither the standard library nor ours."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - OURS


def test_the_container_lock_holds_every_package_the_shipped_serving_code_imports():
    imported = {}
    for path in _shipped_sources():
        for name in _third_party_imports(path):
            imported.setdefault(name, path.name)
    # the import name's distribution (PIL is pillow), as installed in this venv
    owners = importlib.metadata.packages_distributions()
    needed = {_dist(owners.get(name, [name])[0]): (name, where) for name, where in imported.items()}
    # PIL is imported inside functions only: seeing it shows the scan reaches such imports
    assert {"numpy", "pillow"} <= set(needed)
    missing = {d: f"import {n} ({w})" for d, (n, w) in needed.items() if d not in _locked()}
    assert not missing, f"add them to requirements/container.in and `make lock`: {missing}"


def test_all_variables_but_the_admin_key_have_defaults():
    assert "${" not in yaml.safe_dump(walk(yaml.safe_load(COMPOSE.read_text()), REQUIRED))


@pytest.mark.parametrize("path", [COMPOSE, COMPOSE.parent / "deploy/compose/docker-compose.yml"])
@pytest.mark.parametrize("value", [None, ""])
def test_compose_refuses_to_start_without_an_admin_key(path, value):
    """``${TRITON_ADMIN_KEY:?...}``: compose stops with the message saying how to make one."""
    env = {} if value is None else {"TRITON_ADMIN_KEY": value}
    with pytest.raises(ValueError, match="TRITON_ADMIN_KEY.*triton-sam admin-key --env-file"):
        walk(yaml.safe_load(path.read_text()), env)
    assert "change-me" not in path.read_text()


def test_command_serves_the_mounted_repository_without_model_control():
    flags = _flags(load())
    assert flags["--model-repository"] == ["/models"]
    assert flags["--model-control-mode"] == ["none"]
    assert flags["--strict-model-config"] == ["false"]


@pytest.mark.parametrize("flag", ["--http-restricted-api", "--grpc-restricted-protocol"])
def test_control_apis_are_restricted_and_inference_is_not(flag):
    flags = _flags(load())
    (value,) = flags[flag]
    apis, key, secret = _restricted(value)
    assert apis == {"model-repository", "shared-memory", "trace", "logging"}
    assert key == "triton-admin-key"
    assert secret == KEY
    assert f"{flag}={value}" in restriction_args(KEY)  # the same flags as `triton-sam serve`


def test_the_tenant_header_is_forwarded_to_the_models():
    from triton_sam.serving.protocol.tenancy import FORWARD_PATTERN

    flags = _flags(load())
    assert flags["--http-header-forward-pattern"] == [FORWARD_PATTERN]
    assert flags["--grpc-header-forward-pattern"] == [FORWARD_PATTERN]


def test_the_entrypoint_checks_the_key_before_tritonserver_starts():
    service = load()
    assert service["entrypoint"] == ["/opt/triton-sam/entrypoint.sh"]
    assert "environment" not in service  # the key is in the flags only; health needs none


def test_no_misspelled_restriction_flags():
    # tritonserver refuses to start on an unknown option; gRPC's is "-protocol", not "-api".
    assert "--grpc-restricted-api" not in _flags(load())


def test_repository_is_mounted_read_only_where_the_server_looks():
    service = load()
    (volume,) = [v for v in service["volumes"] if v.startswith("./model_repository:")]
    host, container, mode = volume.split(":")
    assert host == "./model_repository"
    assert container == _flags(service)["--model-repository"][0]
    assert mode == "ro"


def _ports(service: dict[str, Any]) -> dict[int, tuple[str, int]]:
    """container port -> (host ip, host port)."""
    out = {}
    for spec in service["ports"]:
        m = re.fullmatch(r"(?P<ip>.+):(?P<host>\d+):(?P<container>\d+)(?:/tcp)?", str(spec))
        assert m, f"port {spec!r} must name the host address"
        out[int(m["container"])] = (m["ip"], int(m["host"]))
    return out


def test_every_port_is_bound_to_localhost_by_default():
    ports = _ports(load())
    assert ports == {
        8000: ("127.0.0.1", 8000),
        8001: ("127.0.0.1", 8001),
        8002: ("127.0.0.1", 8002),
    }


def test_bind_address_and_host_ports_are_overridable():
    ports = _ports(load({"TRITON_BIND": "0.0.0.0", "TRITON_HTTP_PORT": "9000"}))
    assert {ip for ip, _ in ports.values()} == {"0.0.0.0"}
    assert ports[8000] == ("0.0.0.0", 9000)


def test_gpu_reservation():
    (device,) = load()["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert str(device["count"]) == "all"
    assert "gpu" in device["capabilities"]
    assert load({"TRITON_GPUS": "1"})["deploy"]["resources"]["reservations"]["devices"][0][
        "count"
    ] in ("1", 1)


def test_healthcheck_waits_for_readiness_and_live_stubs():
    check = load()["healthcheck"]
    test = check["test"]
    assert test == ["CMD", "/opt/triton-sam/health_check.sh", "--restart", "localhost:8000"]
    script = (COMPOSE.parent / "scripts" / "health_check.sh").read_text()
    # readiness first, failing on HTTP errors ("not ready" must not pass), then the probes
    assert 'curl -fsS -o /dev/null --max-time 5 "$url/v2/health/ready"' in script
    assert "triton-sam-liveness" in script and "kill -TERM 1" in script
    assert '"$url/v2/models/stats"' in script  # lists the models without the admin key
    for key in ("interval", "timeout", "retries", "start_period"):
        assert key in check


def _bytes(size: str) -> int:
    m = re.fullmatch(r"(\d+)([kmg]?)b?", str(size).lower())
    assert m, size
    return int(m[1]) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m[2]]


def test_shared_memory_limits_and_restart_policy():
    service = load()
    assert _bytes(service["shm_size"]) >= 1 << 30
    assert service["ulimits"]["memlock"] == -1
    assert service["ulimits"]["stack"] == 67108864
    assert service["restart"] == "unless-stopped"


# -- the entrypoint (bash, here) ------------------------------------------------------------
def entrypoint(*args: str) -> subprocess.CompletedProcess:
    """Run the entrypoint on a command that prints its arguments instead of tritonserver."""
    return subprocess.run(
        ["bash", str(ENTRYPOINT), "printf", "%s\\n", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def _restriction(key: str, apis: str = "model-repository,shared-memory,trace,logging"):
    value = f"{apis}:triton-admin-key={key}"
    return [f"--http-restricted-api={value}", f"--grpc-restricted-protocol={value}"]


def test_entrypoint_runs_the_command_with_a_good_key():
    args = [*_restriction(KEY), "--model-control-mode=none"]
    done = entrypoint(*args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == args
    assert os.access(ENTRYPOINT, os.X_OK) and ENTRYPOINT.stat().st_mode & stat.S_IXOTH


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (_restriction("change-me"), "published default"),
        (_restriction("short-key-1234"), "14 characters"),
        (_restriction("$(TRITON_ADMIN_KEY)" + "x" * 20), "characters outside"),
        (_restriction(""), "0 characters"),
        (_restriction(KEY)[:1], "no --grpc-restricted-protocol"),
        (_restriction(KEY)[1:], "no --http-restricted-api"),
        ([], "no --http-restricted-api"),
        (_restriction(KEY, "model-repository,shared-memory"), "does not restrict trace"),
        (
            [_restriction(KEY)[0].replace("triton-admin-key", "x-key"), _restriction(KEY)[1]],
            "header triton-admin-key",
        ),
    ],
)
def test_entrypoint_refuses_an_open_or_guessable_server(args, reason):
    done = entrypoint(*args, "--model-control-mode=none")
    assert done.returncode == 64 and reason in done.stderr, done.stderr
    assert done.stdout == ""  # the command never ran
    assert KEY not in done.stderr


def test_interpolation_helper():
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET:-d}/${EMPTY:-d}/${UNSET:-d}", env) == "x/d/d"
    assert interpolate("${EMPTY-d}/${UNSET-d}/$SET/$$", env) == "/d/x/$"
    with pytest.raises(ValueError, match="UNSET"):
        interpolate("${UNSET:?needed}", env)


def test_tensorrt_engine_cache_survives_restarts():
    from triton_sam.repository.config import RepositoryOptions

    compose = yaml.safe_load(COMPOSE.read_text())
    mounts = load()["volumes"]
    cache = RepositoryOptions().trt_engine_cache_path
    assert f"trt-engine-cache:{cache}" in mounts
    assert "trt-engine-cache" in compose["volumes"]
