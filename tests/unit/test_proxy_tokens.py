"""Bearer-token tenancy in the rendered proxy configuration (``scaleout.nginx``), without a
server: what each mode renders, the tokens file, and the admin routes the proxy refuses.

tests/integration/test_proxy_tenancy.py runs the same configuration in a real nginx.
"""

from __future__ import annotations

import re
import stat

import pytest

from triton_sam.errors import InputValidationError
from triton_sam.scaleout.nginx import (
    GRPC_ADMIN_METHODS,
    GRPC_HEALTH,
    HTTP_ADMIN_PATTERNS,
    HTTP_HEALTH,
    ProxyConfig,
    new_token,
    read_tokens_file,
    render_nginx_conf,
    tokens_text,
    write_tokens_file,
)
from triton_sam.serving.protocol.tenancy import TENANT_HEADER

BACKENDS = dict(http_backends=("a:8000", "b:8000"), grpc_backends=("a:8001", "b:8001"))


def locations(conf: str) -> list[str]:
    return re.findall(r"^\s*location (.*?) \{$", conf, re.M)


def test_tokens_off_by_default_and_a_client_sent_tenant_is_dropped():
    conf = render_nginx_conf(ProxyConfig(**BACKENDS))
    assert "map " not in conf and "return 401" not in conf and "Authorization" not in conf
    assert locations(conf) == ["/", "/"]
    assert f'proxy_set_header {TENANT_HEADER} "";' in conf
    assert f'grpc_set_header {TENANT_HEADER} "";' in conf


def test_tokens_on_every_passed_request_carries_the_tenant_of_its_token():
    conf = render_nginx_conf(ProxyConfig(**BACKENDS, tokens_file="/etc/nginx/tokens.map"))
    assert "include /etc/nginx/tokens.map;" in conf
    assert "map $http_authorization $sam_bearer_token" in conf
    passes = conf.count("proxy_pass ") + conf.count("grpc_pass ")
    assert passes == len(HTTP_HEALTH) + len(GRPC_HEALTH) + 2
    assert conf.count(f"_set_header {TENANT_HEADER} $sam_tenant;") == passes
    assert conf.count('_set_header Authorization "";') == passes  # the token stays here
    # the catch-all location refuses a request without a tenant, each protocol its way
    assert conf.count('if ($sam_tenant = "") {\n        return 401;') == 2
    assert 'return 401 \'{"error":"a valid bearer token is required"}\';' in conf
    assert "add_header grpc-status 16 always;" in conf
    assert "add_header grpc-status 7 always;" in conf
    assert [f"= {p}" for p in (*HTTP_HEALTH, *GRPC_HEALTH)] == [
        loc for loc in locations(conf) if loc.startswith("= ")
    ]


@pytest.mark.parametrize(
    "path",
    [
        "/v2/repository/index",
        "/v2/repository/models/x/load",
        "/v2/systemsharedmemory/status",
        "/v2/systemsharedmemory/region/r/register",
        "/v2/cudasharedmemory/status",
        "/v2/trace/setting",
        "/v2/models/m/trace/setting",
        "/v2/models/m/versions/1/trace/setting",
        "/v2/logging",
        "/V2/Repository/index",
    ],
)
def test_the_admin_routes_are_refused(path):
    assert any(re.search(p, path, re.I) for p in HTTP_ADMIN_PATTERNS)


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/sam2_session/infer",
        "/v2/models/trace_model/infer",  # a model named like a route is not one
        "/v2/models/m/config",
        "/v2/health/ready",
        "/v2",
        "/v2/models/stats",
    ],
)
def test_inference_and_metadata_routes_are_served(path):
    assert not any(re.search(p, path, re.I) for p in HTTP_ADMIN_PATTERNS)


def test_every_restricted_grpc_method_is_refused():
    """Triton's restricted-protocol categories (model-repository, shared-memory, trace,
    logging) by the methods of inference.GRPCInferenceService."""
    conf = render_nginx_conf(ProxyConfig(**BACKENDS, tokens_file="/t.map"))
    pattern = next(loc for loc in locations(conf) if loc.startswith("~* ") and "GRPC" in loc)
    regex = pattern.removeprefix("~* ").strip('"')
    for method in GRPC_ADMIN_METHODS:
        assert re.search(regex, f"/inference.GRPCInferenceService/{method}")
    for method in ("ModelInfer", "ModelReady", "ServerMetadata", "ModelMetadata"):
        assert not re.search(regex, f"/inference.GRPCInferenceService/{method}")


def test_the_tokens_file_is_owner_only_and_round_trips(tmp_path):
    tokens = {new_token(): "team-a", new_token(): "team.b_2"}
    path = write_tokens_file(tmp_path / "tokens.map", tokens)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_tokens_file(path) == tokens
    assert all(len(t) == 64 for t in tokens)


@pytest.mark.parametrize(
    "tokens",
    [
        {"short": "team"},
        {"A" * 64: "team"},  # nginx compares map keys ignoring case: hex is lowercase
        {"default" + "0" * 40: "team"},
        {new_token(): "bad name"},
        {new_token(): "team;"},
        {new_token(): ""},
        {new_token(): "x" * 65},
    ],
)
def test_a_bad_token_or_tenant_is_refused(tokens):
    with pytest.raises(InputValidationError):
        tokens_text(tokens)


@pytest.mark.parametrize("path", ["", "/a b", "/t;include /etc/passwd", "$x"])
def test_a_tokens_path_that_would_change_the_configuration_is_refused(path):
    with pytest.raises(InputValidationError, match="tokens_file"):
        ProxyConfig(**BACKENDS, tokens_file=path)


def test_the_cli_adds_a_token_per_tenant_and_prints_it_once(tmp_path):
    from typer.testing import CliRunner

    from triton_sam.cli import app

    path = tmp_path / "tokens.map"
    printed = []
    for tenant in ("team-a", "team-b"):
        result = CliRunner().invoke(app, ["proxy", "token", tenant, "--file", str(path)])
        assert result.exit_code == 0, result.output
        printed.append(result.output.strip())
    assert read_tokens_file(path) == dict(zip(printed, ["team-a", "team-b"], strict=True))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    result = CliRunner().invoke(app, ["proxy", "token", "bad name", "--file", str(path)])
    assert result.exit_code != 0 and len(read_tokens_file(path)) == 2
