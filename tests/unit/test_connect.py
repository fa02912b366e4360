"""Client start-up (client/connect.py): readiness errors that say what to do, session choice."""

from __future__ import annotations

import pytest

from triton_sam.client.connect import connect
from triton_sam.client.transport import Endpoint
from triton_sam.errors import ServerUnavailableError
from triton_sam.models.registry import get_family


class FakeTransport:
    def __init__(self, address: str, protocol: str, *, server: bool = True, models=()) -> None:
        self.endpoint = Endpoint(address, protocol, False)  # type: ignore[arg-type]
        self.server, self.models = server, set(models)

    def is_server_ready(self) -> bool:
        return self.server

    def is_model_ready(self, name: str) -> bool:
        return name in self.models

    def model_metadata(self, name: str) -> dict:
        raise AssertionError("only asked for families with several layouts")


SAM2 = get_family("sam2")
PAIR = ("sam2_encoder", "sam2_decoder")


def _connect(transport: FakeTransport, wanted: bool | None = None):
    return connect(transport, SAM2, *PAIR, "sam2_session", wanted)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("address", "protocol", "hint"),
    [
        ("localhost:8000", "grpc", "8000 is Triton's HTTP port"),
        ("localhost:8001", "http", "8001 is Triton's gRPC port"),
        ("localhost:9999", "http", "start one with `triton-sam serve`"),
    ],
)
def test_no_server_names_the_url_and_the_likely_port_mix_up(address, protocol, hint):
    with pytest.raises(ServerUnavailableError, match="url: no ready Triton server") as info:
        _connect(FakeTransport(address, protocol, server=False))
    assert hint in str(info.value)


def test_a_model_not_ready_is_named_with_the_command_that_makes_it():
    not_ready = "'sam2_decoder' is not ready.*triton-sam setup"
    with pytest.raises(ServerUnavailableError, match=not_ready):
        _connect(FakeTransport("h:8000", "http", models={"sam2_encoder"}))


@pytest.mark.parametrize(
    ("models", "wanted", "expected"),
    [
        ({*PAIR, "sam2_session"}, None, True),
        (set(PAIR), None, False),
        ({*PAIR, "sam2_session"}, False, False),
    ],
)
def test_the_session_path_is_used_when_offered_unless_refused(models, wanted, expected):
    served = _connect(FakeTransport("h:8000", "http", models=models), wanted)
    assert served.uses_server_embeddings is expected
    assert served.family is SAM2 and served.session_model == "sam2_session"


def test_asking_for_server_embeddings_without_a_session_model_says_how_to_get_one():
    with pytest.raises(ServerUnavailableError, match="use_server_embeddings=False"):
        _connect(FakeTransport("h:8000", "http", models=set(PAIR)), True)
