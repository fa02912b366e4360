"""EmbeddedTriton refuses, before anything starts, the arguments Triton would refuse or misread,
naming the argument."""

from __future__ import annotations

import pytest

from triton_sam.errors import InputValidationError, RepositoryError
from triton_sam.server import EmbeddedTriton


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("model_control", {"model_control": "auto"}),
        ("http_port", {"http_port": 70000}),
        ("grpc_port", {"grpc_port": True}),
        ("metrics_port", {"metrics_port": -1}),
        ("startup_timeout_s", {"startup_timeout_s": 0}),
        ("log_verbose", {"log_verbose": 1.5}),
        ("exit_timeout_s", {"exit_timeout_s": -1}),
        ("repository_poll_s", {"repository_poll_s": 0}),
    ],
)
def test_a_bad_argument_is_refused_by_name(tmp_path, field, kwargs):
    with pytest.raises(InputValidationError, match=field):
        EmbeddedTriton(tmp_path, **kwargs)


def test_a_missing_repository_is_refused(tmp_path):
    with pytest.raises(RepositoryError, match="model repository not found"):
        EmbeddedTriton(tmp_path / "missing")


def test_free_ports_are_asked_for_with_zero(tmp_path):
    server = EmbeddedTriton(tmp_path, http_port=0, grpc_port=0, metrics_port=0)
    assert server.pid is None and not server.is_running() and server.log_path is None
