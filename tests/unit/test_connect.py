"""Client start-up (client/startup.py): readiness errors that say what to do, session choice."""

from __future__ import annotations

import pytest

from triton_sam.client import flow, startup
from triton_sam.client.transport import Endpoint
from triton_sam.errors import ModelNotReadyError, ServerUnavailableError
from triton_sam.models.registry import get_family


class FakeTransport:
    def __init__(
        self, address: str, protocol: str, *, server: bool = True, models=(), ensembles=()
    ) -> None:
        self.endpoint = Endpoint(address, protocol, False)  # type: ignore[arg-type]
        self.server, self.models, self.ensembles = server, set(models), set(ensembles)
        self.calls: list[str] = []

    def __getattribute__(self, name: str):
        if name in ("is_server_ready", "is_model_ready", "model_metadata"):
            object.__getattribute__(self, "calls").append(name)
        return object.__getattribute__(self, name)

    def is_server_ready(self) -> bool:
        return self.server

    def is_model_ready(self, name: str) -> bool:
        return name in self.models

    def model_metadata(self, name: str) -> dict:
        if name not in self.models:
            raise ModelNotReadyError(name, f"unknown model {name!r}")
        return {
            "name": name,
            "platform": "ensemble" if name in self.ensembles else "onnxruntime_onnx",
        }


SAM2 = get_family("sam2")
PAIR = ("sam2_encoder", "sam2_decoder")


def _connect(transport: FakeTransport, wanted: bool | None = None):
    steps = startup.connect(transport.endpoint, SAM2, *PAIR, "sam2_session", wanted)
    return flow.run(steps, flow.sender(transport))


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


def test_a_missing_encoder_is_named_as_before():
    with pytest.raises(
        ServerUnavailableError, match="'sam2_encoder' is not ready.*triton-sam setup"
    ):
        _connect(FakeTransport("h:8000", "http", models={"sam2_decoder"}))


def test_start_up_costs_as_many_round_trips_as_a_readiness_check_per_model():
    transport = FakeTransport("h:8000", "http", models={*PAIR, "sam2_session"})
    served = _connect(transport)
    assert served.encoder_model == "sam2_encoder"
    # server ready, the encoder's metadata (in place of its readiness), decoder, session
    assert transport.calls == [
        "is_server_ready", "model_metadata", "is_model_ready", "is_model_ready"
    ]  # fmt: skip


def test_an_entry_ensemble_under_the_encoders_name_sends_own_encodes_to_the_normalized_one():
    models = {*PAIR, "sam2_encoder_normalized"}
    transport = FakeTransport("h:8000", "http", models=models, ensembles={"sam2_encoder"})
    assert _connect(transport, False).encoder_model == "sam2_encoder_normalized"


def test_an_entry_ensemble_without_its_normalized_encoder_says_what_to_do():
    transport = FakeTransport("h:8000", "http", models=set(PAIR), ensembles={"sam2_encoder"})
    with pytest.raises(ServerUnavailableError, match="sam2_encoder_normalized.*setup paintera"):
        _connect(transport, False)


def test_the_speculative_clients_token_and_headers_go_on_both_of_its_transports(monkeypatch):
    """Blocking calls (set_image, predict_sync) and asyncio calls carry the same headers: a
    proxy's bearer token, a gateway's tenant; before, the blocking transport sent none."""
    import asyncio

    from triton_sam import SpeculativeSAM2Client
    from triton_sam.client import flow

    monkeypatch.setattr(flow, "run", lambda *a, **k: None)  # no server: skip the check
    client = SpeculativeSAM2Client(
        "localhost:1", token="abc123", headers={"triton-sam-tenant": "lab-a"}
    )
    expected = {"authorization": "Bearer abc123", "triton-sam-tenant": "lab-a"}
    assert client._conn._blocking().headers == expected

    async def asyncio_headers() -> dict:
        transport = client._conn.transport()
        try:
            return dict(transport.headers)
        finally:
            await client.aclose()

    assert asyncio.run(asyncio_headers()) == expected
