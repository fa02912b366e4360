"""The admin key: generated per install, owner-only on disk, never a published default,
never printed; the restriction flags every server we start carries."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from triton_sam.cli import app
from triton_sam.errors import InputValidationError
from triton_sam.server import EmbeddedTriton
from triton_sam.server import admin_key as admin


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv(admin.ENV_VAR, raising=False)
    return tmp_path


def test_first_use_creates_an_owner_only_key_file_then_reuses_it(home):
    key = admin.load_or_create()
    path = home / "triton-sam" / "admin-key"
    assert key.source == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(key.value) >= 43  # 256 random bits
    assert admin.load_or_create().value == key.value
    assert key.value not in repr(key)


def test_keys_are_random_per_install(home, tmp_path):
    assert admin.load_or_create(tmp_path / "a").value != admin.load_or_create(tmp_path / "b").value


def test_a_key_file_others_can_read_is_refused(home):
    path = admin.write_key_file(home / "key", admin.generate_key())
    path.chmod(0o644)
    with pytest.raises(InputValidationError, match="chmod 600"):
        admin.load_or_create(path)


def test_the_environment_overrides_the_file_and_is_checked(home, monkeypatch):
    monkeypatch.setenv(admin.ENV_VAR, "e" * 40)
    assert admin.load_or_create() == admin.AdminKey("e" * 40, "$TRITON_ADMIN_KEY")
    assert not (home / "triton-sam").exists()
    monkeypatch.setenv(admin.ENV_VAR, "change-me")
    with pytest.raises(InputValidationError, match="published default"):
        admin.load_or_create()


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("change-me", "published default"),
        ("x" * 31, "31 characters"),
        ("x" * 31 + ":", "characters"),
        ("x" * 31 + "=", "characters"),
        ("x" * 31 + " ", "characters"),
    ],
)
def test_guessable_or_unparseable_keys_are_refused(value, reason):
    with pytest.raises(InputValidationError, match=reason) as refused:
        admin.check_key(value)
    assert value not in str(refused.value) or value == "change-me"
    assert "triton-sam admin-key" in str(refused.value)


def test_restriction_flags_cover_the_four_control_apis_on_both_protocols():
    key = "k" * 40
    value = f"model-repository,shared-memory,trace,logging:triton-admin-key={key}"
    assert admin.restriction_args(key) == [
        f"--http-restricted-api={value}",
        f"--grpc-restricted-protocol={value}",
    ]
    assert admin.GRPC_HEADER == "triton-grpc-protocol-triton-admin-key"


def test_every_embedded_server_is_restricted_and_forwards_the_tenant(tmp_path):
    from triton_sam.serving.protocol.tenancy import FORWARD_PATTERN

    (tmp_path / "m").mkdir()
    server = EmbeddedTriton(tmp_path)  # no key given: a fresh one
    args = server._args(tmp_path)
    assert set(admin.restriction_args(server.admin_key)) <= set(args)
    assert f"--http-header-forward-pattern={FORWARD_PATTERN}" in args
    assert f"--grpc-header-forward-pattern={FORWARD_PATTERN}" in args
    assert EmbeddedTriton(tmp_path).admin_key != server.admin_key
    assert server.admin_key not in repr(server)
    given = EmbeddedTriton(tmp_path, admin_key="g" * 40, model_control="poll")
    assert set(admin.restriction_args("g" * 40)) <= set(given._args(tmp_path))
    assert {"--model-control-mode=poll", "--repository-poll-secs=1"} <= set(given._args(tmp_path))
    with pytest.raises(InputValidationError, match="published default"):
        EmbeddedTriton(tmp_path, admin_key="change-me")
    with pytest.raises(InputValidationError, match="repository_poll_s"):  # no scans: no heal
        EmbeddedTriton(tmp_path, model_control="poll", repository_poll_s=0)
    with pytest.raises(InputValidationError, match="extra_args"):  # ours only: no open API
        EmbeddedTriton(tmp_path, extra_args=["--http-restricted-api=inference:k=v"])


def test_cli_admin_key_writes_the_env_file_for_compose_and_rotates(home, tmp_path):
    runner = CliRunner()
    env_file = tmp_path / ".env"
    env_file.write_text("TRITON_BIND=127.0.0.1\nTRITON_ADMIN_KEY=change-me\n")
    done = runner.invoke(app, ["admin-key", "--env-file", str(env_file)])
    assert done.exit_code == 0, done.output
    key = (home / "triton-sam" / "admin-key").read_text()
    assert key not in done.output and "admin-key" in done.output
    assert env_file.read_text() == f"TRITON_BIND=127.0.0.1\nTRITON_ADMIN_KEY={key}\n"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    done = runner.invoke(app, ["admin-key", "--rotate"])
    assert done.exit_code == 0, done.output
    assert (home / "triton-sam" / "admin-key").read_text() != key


def test_dotenv_files_are_not_committed():
    root = Path(__file__).resolve().parents[2]
    assert ".env" in (root / ".gitignore").read_text().splitlines()
    assert os.system(f"git -C {root} check-ignore -q deploy/compose/.env") == 0
