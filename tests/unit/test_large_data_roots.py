"""The operator's data roots at serve time: `--data-root NAME=PATH`, serve.data_roots, and
the environment the embedded server hands its stubs (triton_sam/server/data_roots.py)."""

from __future__ import annotations

import json

import pytest

from triton_sam.errors import InputValidationError
from triton_sam.server import data_roots
from triton_sam.serving.protocol.large import DATA_ROOTS_ENV


def test_options_and_mappings_become_the_models_json(tmp_path):
    (tmp_path / "em").mkdir()
    roots = data_roots.parse_options([f"em={tmp_path / 'em'}"])
    roots["lm"] = {"path": str(tmp_path), "tenants": ["a"]}
    env = data_roots.environment(roots)
    assert json.loads(env[DATA_ROOTS_ENV]) == {
        "em": {"path": str(tmp_path / "em")},
        "lm": {"path": str(tmp_path), "tenants": ["a"]},
    }
    assert data_roots.environment({}) == {} and data_roots.environment(None) == {}


@pytest.mark.parametrize(
    ("options", "field"),
    [(["em"], "--data-root"), (["=x"], "--data-root"), (["a=/x", "a=/y"], "--data-root")],
)
def test_malformed_options_are_refused(options, field):
    with pytest.raises(InputValidationError, match=field):
        data_roots.parse_options(options)


def test_roots_must_be_existing_directories_under_plain_names(tmp_path):
    for roots, field in (
        ({"../x": str(tmp_path)}, "data_roots.../x"),
        ({"em": str(tmp_path / "missing")}, "data_roots.em"),
        ({"em": {"path": str(tmp_path), "tenants": "a"}}, "data_roots.em.tenants"),
        ({"em": {"path": str(tmp_path), "owner": "a"}}, "data_roots.em"),
    ):
        with pytest.raises(InputValidationError, match=field):
            data_roots.roots_json(roots)


def test_the_embedded_server_passes_them_in_its_environment(tmp_path):
    from triton_sam.server import EmbeddedTriton

    server = EmbeddedTriton(tmp_path, data_roots={"em": str(tmp_path)})
    assert json.loads(server.environment[DATA_ROOTS_ENV]) == {"em": {"path": str(tmp_path)}}
    assert EmbeddedTriton(tmp_path).environment == {}
    with pytest.raises(InputValidationError, match="data_roots.em"):
        EmbeddedTriton(tmp_path, data_roots={"em": str(tmp_path / "nope")})


def test_serve_adds_its_options_to_the_configured_roots(tmp_path, serve_arguments):
    seen = serve_arguments(repository=tmp_path, data_root=[f"em={tmp_path}"], target="onnxruntime")
    assert seen["data_roots"] == {"em": str(tmp_path)}
