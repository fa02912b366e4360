"""Static checks of docker-compose.yml (no Docker engine here, so this is the check).

The file is parsed with pyyaml and interpolated the way ``docker compose`` does
(``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?error}``, ``${VAR}``, ``$$``), with only
the required admin key set unless a test sets more, so the defaults are what is checked.
The command itself runs on the embedded server in
tests/integration/test_admin_lockdown.py (control APIs 403 without the key, an uploaded model
refused). The image's entrypoint (scripts/triton_entrypoint.sh) runs here with bash.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
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
LOCK = COMPOSE.parent / "requirements" / "lock.txt"
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


def test_dockerfile_pins_its_base_and_the_lock_versions_of_what_the_stubs_import():
    text = DOCKERFILE.read_text()
    assert f"ARG TRITON_BASE={BASE}\nFROM ${{TRITON_BASE}}" in text
    pins = dict(re.findall(r'"([a-z0-9_-]+)==([0-9.]+)"', text))
    # serving/ imports nothing else; the readers of serving/datasets/ (zarr with numcodecs,
    # tensorstore, tifffile with imagecodecs) only when the large model opens a dataset
    readers = {"zarr", "numcodecs", "tensorstore", "tifffile", "imagecodecs"}
    assert set(pins) == {"numpy", "pillow", "tokenizers"} | readers
    locked = dict(re.findall(r"^([a-z0-9_-]+)==([0-9.]+)", LOCK.read_text(), re.M))
    for package, version in pins.items():
        assert locked[package] == version, package
    assert "COPY scripts/health_check.sh /opt/triton-sam/health_check.sh" in text
    assert "COPY scripts/triton_entrypoint.sh /opt/triton-sam/entrypoint.sh" in text
    assert 'ENTRYPOINT ["/opt/triton-sam/entrypoint.sh"]' in text
    assert "COPY model_repository" not in text  # mounted read-only, never baked in


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
