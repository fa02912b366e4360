"""Static checks of the Label Studio backend's compose service (no Docker engine here), and of
what ``gateway --label-studio`` refuses at start.

The service runs the gateway image with ``--label-studio``; the image's entrypoint adds
``--host 0.0.0.0 --port 8080`` (deploy/gateway/Dockerfile), so the command must pass the CLI's
own parser with those, and, listening beyond localhost, must require tokens.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import typer
import yaml
from deploy_args import walk

from triton_sam.cli import app
from triton_sam.cli.label_studio import backend_routes, is_loopback, read_api_key
from triton_sam.errors import InputValidationError

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict:
    text = (ROOT / "docker-compose.yml").read_text()
    return walk(yaml.safe_load(text), {"TRITON_ADMIN_KEY": "k"})


def _entrypoint() -> list[str]:
    dockerfile = (ROOT / "deploy/gateway/Dockerfile").read_text()
    line = next(x for x in dockerfile.splitlines() if x.startswith("ENTRYPOINT"))
    return yaml.safe_load(line.removeprefix("ENTRYPOINT"))


def test_the_service_is_opt_in_local_and_waits_for_a_healthy_triton():
    data = _compose()
    service = data["services"]["label-studio"]
    assert service["profiles"] == ["label-studio"]  # `docker compose up` alone is unchanged
    assert service["ports"] == ["127.0.0.1:9090:8080"]
    assert service["depends_on"] == {"triton": {"condition": "service_healthy"}}
    assert service["build"]["dockerfile"] == "deploy/gateway/Dockerfile"
    assert "http://localhost:8080/label-studio/health" in " ".join(service["healthcheck"]["test"])
    assert service["user"] == "65534"  # as the image: no root
    # the secrets are files, owner-only on the host, git-ignored where the defaults put them
    assert set(service["secrets"]) == {"label-studio-tokens", "label-studio-api-key"}
    for name in service["secrets"]:
        path = data["secrets"][name]["file"]
        assert path.startswith("./deploy/compose/tokens/"), path
    assert "*" in (ROOT / "deploy/compose/tokens/.gitignore").read_text().splitlines()


def test_the_command_parses_requires_tokens_and_never_carries_the_key():
    service = _compose()["services"]["label-studio"]
    args = [*_entrypoint()[1:], *service["command"]]
    assert args[:5] == ["gateway", "--host", "0.0.0.0", "--port", "8080"]
    command = typer.main.get_command(app)
    gateway = command.get_command(command.make_context("triton-sam", list(args)), "gateway")
    params = gateway.make_context("gateway", args[1:]).params
    assert params["label_studio"] and params["triton_url"] == "triton:8001"
    assert str(params["label_studio_tokens_file"]) == "/run/secrets/label-studio-tokens"
    assert str(params["label_studio_api_key_file"]) == "/run/secrets/label-studio-api-key"
    assert "LABEL_STUDIO_API_KEY" not in shlex.join(args) and "environment" in service
    assert set(service["environment"]) == {"LABEL_STUDIO_URL"}


def _routes(tmp_path, **overrides):
    options = dict(
        triton_url="localhost:8001",
        protocol="grpc",
        host="127.0.0.1",
        port=9090,
        url="http://localhost:8080",
        model_type="sam2",
        api_key_file=None,
        allow_origins=None,
        tokens_file=None,
    )
    return backend_routes(**{**options, **overrides})


def test_without_tokens_it_stays_on_localhost_and_says_so(tmp_path, capsys):
    routes, _ = _routes(tmp_path)
    assert len(routes) == 1
    out = capsys.readouterr().out
    assert "no tokens: open to this machine only" in out
    assert "backend at http://127.0.0.1:9090/label-studio" in out
    with pytest.raises(InputValidationError, match="^host: '0.0.0.0' without"):
        _routes(tmp_path, host="0.0.0.0")
    assert is_loopback("::1") and is_loopback("127.0.0.2") and not is_loopback("10.0.0.1")


def test_with_tokens_it_may_listen_anywhere_and_needs_a_label_studio_url(tmp_path, capsys):
    tokens = tmp_path / "tokens.map"
    tokens.write_text(f"{'d' * 64} annotators;\n")
    _routes(tmp_path, host="0.0.0.0", tokens_file=tokens)
    out = capsys.readouterr().out
    assert "1 token(s)" in out and "d" * 64 not in out
    with pytest.raises(InputValidationError, match="^label_studio_url: missing"):
        _routes(tmp_path, url=None)


def test_the_api_key_comes_from_a_file_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("LABEL_STUDIO_API_KEY", raising=False)
    assert read_api_key(None) is None
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", "from-env")
    assert read_api_key(None) == "from-env"
    key = tmp_path / "key"
    key.write_text("from-file\n")
    assert read_api_key(key) == "from-file"
    key.write_text("\n")
    with pytest.raises(InputValidationError, match="is empty"):
        read_api_key(key)
