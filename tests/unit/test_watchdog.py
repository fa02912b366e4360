"""The self-heal watchdog's probes and reloads, against stand-ins for Triton's clients.

The everything job model is decoupled: probed over a gRPC stream (a job without an image,
refused at once by a live stub), reloaded like the others. tests/integration/
test_self_healing.py kills real stubs.
"""

from __future__ import annotations

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_sam.server import health
from triton_sam.server.health import Watchdog, probe_stream, watched_models
from triton_sam.serving import protocol as envelope

EVERYTHING = "sam2_everything"
SESSION = "sam2_session"
REFUSED = envelope.error_message(envelope.ERR_INVALID_INPUT, "image_bytes: got 'no image'")
DEAD = f"Stub process '{EVERYTHING}_0_0' is not healthy."


class StreamStandIn:
    """tritonclient.grpc's stream calls; answers each job with ``answers[model]`` (an error
    message; None: no answer at all, as a stub whose job slots are taken)."""

    def __init__(self, answers: dict[str, str | None]) -> None:
        self.answers = answers
        self.sent: list[tuple[str, list]] = []
        self.cancelled: list[bool] = []
        self.closed = False

    def start_stream(self, callback, **_):
        self._callback = callback

    def async_stream_infer(self, model, inputs):
        self.sent.append((model, inputs))
        if self.answers.get(model) is not None:
            self._callback(None, InferenceServerException(self.answers[model]))

    def stop_stream(self, cancel_requests=False):
        self.cancelled.append(cancel_requests)

    def close(self):
        self.closed = True


class HttpStandIn:
    """tritonclient.http's calls the watchdog makes: every session probe misses (alive)."""

    def __init__(self, stream: StreamStandIn) -> None:
        self.stream, self.calls = stream, []

    def infer(self, model, inputs):
        raise InferenceServerException(envelope.error_message("EmbeddingNotFound", "miss"))

    def unload_model(self, model, headers=None):
        self.calls.append(("unload", model))

    def load_model(self, model, headers=None):
        self.calls.append(("load", model))
        self.stream.answers[model] = REFUSED  # a fresh stub

    def close(self):
        pass


def test_a_live_stub_refuses_the_imageless_probe_job_at_once():
    stream = StreamStandIn({EVERYTHING: REFUSED})
    assert probe_stream(stream, EVERYTHING) == "alive"
    ((model, inputs),) = stream.sent
    assert model == EVERYTHING and [i.name() for i in inputs] == ["params"]  # no image
    assert (inputs[0].datatype(), inputs[0].shape()) == ("BYTES", [1])
    assert stream.cancelled == [True]


def test_a_dead_stub_is_told_apart_and_other_errors_are_raised():
    assert probe_stream(StreamStandIn({EVERYTHING: DEAD}), EVERYTHING) == "dead"
    with pytest.raises(InferenceServerException, match="unknown model"):
        probe_stream(StreamStandIn({EVERYTHING: "Request for unknown model"}), EVERYTHING)


def test_a_stub_busy_with_jobs_is_not_dead_and_the_probe_is_cancelled():
    stream = StreamStandIn({EVERYTHING: None})
    assert probe_stream(stream, EVERYTHING, timeout_s=0.05) == "busy"
    assert stream.cancelled == [True]


def test_the_everything_model_is_watched(tmp_path):
    for name, kind in ((SESSION, envelope.KIND_EMBEDDING_CACHE), (EVERYTHING, "everything")):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nparameters {{ key: "{envelope.KIND_PARAM}" '
            f'value {{ string_value: "{kind}" }} }}\n'
        )
    assert watched_models(tmp_path) == {SESSION: "embedding_cache", EVERYTHING: "everything"}


def test_without_a_grpc_address_it_is_left_out_with_a_warning(tmp_path):
    models = {EVERYTHING: "everything", SESSION: "embedding_cache"}
    with pytest.warns(UserWarning, match=f"{EVERYTHING} not watched.*grpc_address"):
        dog = Watchdog("h:1", models, repository=tmp_path)
    assert dog.models == (SESSION,)
    dog = Watchdog("h:1", models, repository=tmp_path, grpc_address="h:2")
    assert dog.models == (SESSION, EVERYTHING)  # the stream last: a busy one waits longest


@pytest.fixture
def clients(monkeypatch):
    stream = StreamStandIn({EVERYTHING: DEAD})
    http = HttpStandIn(stream)
    addresses = []
    monkeypatch.setattr(
        grpcclient, "InferenceServerClient", lambda a: addresses.append(a) or stream
    )
    monkeypatch.setattr(httpclient, "InferenceServerClient", lambda a: http)
    return stream, http, addresses


def test_a_dead_everything_stub_is_reloaded_explicitly(clients):
    stream, http, addresses = clients
    models = {SESSION: "embedding_cache", EVERYTHING: "everything"}
    dog = Watchdog("h:1", models, admin_key="k" * 40, grpc_address="h:2")
    assert dog.check_once() == {SESSION: "alive", EVERYTHING: "dead"}
    assert http.calls == [("unload", EVERYTHING), ("load", EVERYTHING)]
    assert [m for m, _ in dog.reloads] == [EVERYTHING] and addresses == ["h:2"]
    assert dog.check_once() == {SESSION: "alive", EVERYTHING: "alive"} and stream.closed


def test_a_dead_everything_stub_is_reloaded_by_touch(clients, tmp_path, monkeypatch):
    stream, _, _ = clients
    (tmp_path / EVERYTHING / "1").mkdir(parents=True)
    touched = []

    def touch(repository, model):
        touched.append(model)
        stream.answers[model] = REFUSED  # Triton's next scan starts a fresh stub

    monkeypatch.setattr(health, "touch", touch)
    dog = Watchdog("h:1", {EVERYTHING: "everything"}, repository=tmp_path, grpc_address="h:2")
    assert dog.check_once() == {EVERYTHING: "dead"}
    assert touched == [EVERYTHING] and [m for m, _ in dog.reloads] == [EVERYTHING]
