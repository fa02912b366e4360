"""The tokens file in a folder that does not exist yet: created owner-only, by the function and
by ``triton-sam proxy token`` (which once ended in a FileNotFoundError traceback)."""

from __future__ import annotations

import stat

import pytest

from triton_sam.errors import InputValidationError
from triton_sam.scaleout.access import new_token, read_tokens_file, write_tokens_file


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_missing_folder_is_created_owner_only(tmp_path):
    tokens = {new_token(): "team-a"}
    path = write_tokens_file(tmp_path / "deploy" / "tokens" / "tokens.map", tokens)
    assert mode(path.parent) == 0o700 and mode(path) == 0o600
    assert read_tokens_file(path) == tokens


def test_an_existing_folder_is_left_as_it_is(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    path = write_tokens_file(folder / "tokens.map", {new_token(): "team-a"})
    assert mode(folder) == 0o755 and mode(path) == 0o600


def test_a_file_where_the_folder_should_be_is_named(tmp_path):
    (tmp_path / "tokens").write_text("not a folder")
    with pytest.raises(InputValidationError, match="is a file, expected the folder"):
        write_tokens_file(tmp_path / "tokens" / "tokens.map", {new_token(): "team-a"})


def test_bad_tokens_create_no_folder(tmp_path):
    with pytest.raises(InputValidationError):
        write_tokens_file(tmp_path / "new" / "tokens.map", {"short": "team-a"})
    assert not (tmp_path / "new").exists()


def test_the_cli_creates_the_folder_of_a_new_tokens_file(tmp_path):
    from typer.testing import CliRunner

    from triton_sam.cli import app

    path = tmp_path / "dir" / "tokens.map"
    result = CliRunner().invoke(app, ["proxy", "token", "team-a", "--file", str(path)])
    assert result.exit_code == 0, result.output
    assert mode(path.parent) == 0o700 and mode(path) == 0o600
    assert read_tokens_file(path) == {result.output.strip(): "team-a"}
