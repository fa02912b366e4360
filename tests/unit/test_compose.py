"""Static checks of docker-compose.yml (no Docker engine here, so this is the check).

The file is parsed with pyyaml and interpolated the way ``docker compose`` does
(``${VAR:-default}``, ``${VAR-default}``, ``${VAR}``, ``$$``), with an empty environment
unless a test sets variables, so the defaults are what is checked.

Verified once by hand against the real server flags (bundled tritonserver 2.51): with the
command below, ``POST /v2/repository/index`` and ``/v2/systemsharedmemory/status`` answer 403
without the ``triton-admin-key`` header and 200 with it; gRPC answers UNAVAILABLE without
``triton-grpc-protocol-triton-admin-key``; ``/v2/health/ready`` stays open.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
BASE = "nvcr.io/nvidia/tritonserver:24.10-py3"  # Triton 2.51, as the embedded server
IMAGE = "triton-sam-server:24.10"
DOCKERFILE = COMPOSE.with_name("Dockerfile")
LOCK = COMPOSE.parent / "requirements" / "lock.txt"
_VAR = re.compile(r"\$(?:\$|\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|(?P<bare>\w+))")


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Substitute variables in one string as docker compose does."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("name") or m.group("bare")
        op, arg = m.group("op"), m.group("arg") or ""
        current = env.get(name)
        missing = current is None or (op is not None and op.startswith(":") and current == "")
        if op in (":-", "-") and missing:
            return arg
        if op in (":?", "?") and missing:
            raise ValueError(f"required variable {name}: {arg}")
        return current or ""

    return _VAR.sub(sub, value)


def _walk(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_walk(v, env) for v in node]
    if isinstance(node, dict):
        return {k: _walk(v, env) for k, v in node.items()}
    return node


def load(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``triton`` service, interpolated with ``env`` (default: nothing set)."""
    data = _walk(yaml.safe_load(COMPOSE.read_text()), env or {})
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


def test_dockerfile_pins_its_base_and_the_lock_versions_of_what_the_stubs_import():
    text = DOCKERFILE.read_text()
    assert f"ARG TRITON_BASE={BASE}\nFROM ${{TRITON_BASE}}" in text
    pins = dict(re.findall(r'"([a-z0-9_-]+)==([0-9.]+)"', text))
    assert set(pins) == {"numpy", "pillow", "tokenizers"}  # serving/ imports nothing else
    locked = dict(re.findall(r"^([a-z0-9_-]+)==([0-9.]+)", LOCK.read_text(), re.M))
    for package, version in pins.items():
        assert locked[package] == version, package
    assert "COPY scripts/health_check.sh /opt/triton-sam/health_check.sh" in text
    assert "COPY model_repository" not in text  # mounted read-only, never baked in


def test_all_variables_have_defaults():
    assert "${" not in yaml.safe_dump(_walk(yaml.safe_load(COMPOSE.read_text()), {}))


def test_command_serves_the_mounted_repository_without_model_control():
    flags = _flags(load())
    assert flags["--model-repository"] == ["/models"]
    assert flags["--model-control-mode"] == ["none"]
    assert flags["--strict-model-config"] == ["false"]


@pytest.mark.parametrize("flag", ["--http-restricted-api", "--grpc-restricted-protocol"])
def test_control_apis_are_restricted_and_inference_is_not(flag):
    flags = _flags(load({"TRITON_ADMIN_KEY": "s3cret"}))
    (value,) = flags[flag]
    apis, key, secret = _restricted(value)
    assert {"model-repository", "shared-memory"} <= apis
    assert not apis & {"inference", "health", "metadata"}
    assert key == "triton-admin-key"
    assert secret == "s3cret"
    assert _restricted(_flags(load())[flag][0])[2], "a default key must be set"


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
    assert load()["environment"]["TRITON_ADMIN_KEY"] == "change-me"
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
