"""Retries with exponential backoff: idempotent calls only, connection errors only."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from triton_sam.client import retry as retry_module
from triton_sam.client.async_transport import AsyncTransport
from triton_sam.client.endpoint import Endpoint
from triton_sam.client.retry import NO_RETRY, Backoff, RetryPolicy, is_retryable
from triton_sam.client.transport import Transport, resolve_endpoint
from triton_sam.errors import (
    InferenceTimeoutError,
    InputValidationError,
    InvalidRequestError,
    ModelNotReadyError,
    RequestCancelledError,
    ServerError,
    ServerOverloadedError,
    ServerUnavailableError,
)

POLICY = RetryPolicy(
    max_attempts=4, initial_backoff_s=0.1, multiplier=2, max_backoff_s=0.25, jitter=0
)


def _waits(backoff: Backoff, *errors: Exception) -> list[tuple[float | None, bool]]:
    """What ``backoff`` says after each error: (wait or None, reconnect first)."""
    return [(backoff.after(e), backoff.reconnect) for e in errors]


def test_backoff_is_exponential_and_capped():
    assert [POLICY.backoff_s(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.25, 0.25]


def test_connection_errors_are_retried_with_backoff_and_a_reconnect():
    said = _waits(Backoff(POLICY), ServerUnavailableError("down"), ServerOverloadedError("full"))
    # a fresh connection after the connection error; not after the overloaded answer
    assert said == [(0.1, True), (0.2, False)]


def test_attempts_are_bounded():
    down = ServerUnavailableError("down")
    assert [wait for wait, _ in _waits(Backoff(POLICY), *[down] * 4)] == [0.1, 0.2, 0.25, None]


@pytest.mark.parametrize(
    "error",
    [
        InputValidationError("point_coords", "bad"),
        InvalidRequestError("unexpected shape for input 'point_coords'"),
        InferenceTimeoutError("timed out"),
        RequestCancelledError("cancelled"),
        ModelNotReadyError("sam2_decoder", "not loaded"),
        ServerError("model failed"),
        ValueError("a bug"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_other_errors_are_never_retried(error):
    assert Backoff(POLICY).after(error) is None
    assert not is_retryable(error)


def test_no_retry_policy_tries_once():
    assert Backoff(NO_RETRY).after(ServerUnavailableError("down")) is None


def test_no_retry_starts_past_the_deadline():
    clock = iter([0.0, 0.05, 10.0])  # start, first failure, second failure
    backoff = Backoff(POLICY, deadline_s=1.0, clock=lambda: next(clock))
    down = ServerUnavailableError("down")
    assert [wait for wait, _ in _waits(backoff, down, down)] == [0.1, None]


@pytest.mark.parametrize(
    "field, value",
    [("max_attempts", 0), ("initial_backoff_s", -1), ("multiplier", 0.5), ("jitter", -0.1)],
)
def test_bad_policies_are_refused(field, value):
    with pytest.raises(InputValidationError) as info:
        RetryPolicy(**{field: value})
    assert info.value.field == field


# -- the transport: which calls are retried ----------------------------------------------------
class FakeClient:
    """tritonclient stand-in whose calls fail with ``errors`` first."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = errors
        self.calls: list[str] = []

    def _maybe_fail(self, name: str) -> None:
        self.calls.append(name)
        if self.errors:
            raise self.errors.pop(0)

    def infer(self, model, inputs, outputs=None, **kwargs):
        self._maybe_fail("infer")
        return FakeResult()

    def is_model_ready(self, model):
        self._maybe_fail("is_model_ready")
        return True

    def close(self) -> None:
        pass


class FakeResult:
    def as_numpy(self, name: str) -> np.ndarray:
        return np.zeros(1, np.float32)


def _transport(monkeypatch, errors: list[Exception]) -> tuple[Transport, FakeClient, list]:

    client = FakeClient(errors)
    connects: list[int] = []

    def connect(self):
        connects.append(1)
        return client

    monkeypatch.setattr(Transport, "_connect", connect)
    monkeypatch.setattr(retry_module.time, "sleep", lambda s: None)
    transport = Transport(resolve_endpoint("localhost:1", "http"), retry=POLICY)
    return transport, client, connects


def _refused() -> Exception:
    return ConnectionRefusedError(111, "Connection refused")


def _overloaded() -> Exception:
    from tritonclient.utils import InferenceServerException

    return InferenceServerException("request exceeds maximum queue size", status="503")


def test_idempotent_infer_is_retried_after_reconnecting(monkeypatch):
    transport, client, connects = _transport(monkeypatch, [_refused(), _refused()])
    out = transport.infer("m", {"x": np.zeros((1, 4), np.float32)}, ["t"], idempotent=True)
    assert set(out) == {"t"}
    assert client.calls == ["infer"] * 3
    assert len(connects) == 3  # the first connection and one per retry


def test_non_idempotent_infer_is_never_retried(monkeypatch):
    transport, client, connects = _transport(monkeypatch, [_refused()])
    with pytest.raises(ServerUnavailableError):
        transport.infer("m", {"x": np.zeros((1, 4), np.float32)}, ["t"])
    assert client.calls == ["infer"] and len(connects) == 1


def test_health_and_metadata_calls_are_retried(monkeypatch):
    transport, client, _ = _transport(monkeypatch, [_refused()])
    assert transport.is_model_ready("m") is True
    assert client.calls == ["is_model_ready"] * 2


def test_server_rejections_are_not_retried(monkeypatch):
    from tritonclient.utils import InferenceServerException

    bad = InferenceServerException("unexpected shape for input 'p' for model 'm'", status="400")
    transport, client, _ = _transport(monkeypatch, [bad])
    with pytest.raises(InvalidRequestError, match="unexpected shape"):
        transport.infer("m", {"x": np.zeros((1, 4), np.float32)}, ["t"], idempotent=True)
    assert client.calls == ["infer"]


def test_an_overloaded_answer_is_retried_on_the_same_connection(monkeypatch):
    """Reconnecting closes the shared channel, which cancels every other request in flight
    on it: a stress run with four sessions lost all of them to one session's overload."""
    transport, client, connects = _transport(monkeypatch, [_overloaded(), _refused()])
    assert transport.is_model_ready("m") is True
    assert client.calls == ["is_model_ready"] * 3
    assert len(connects) == 2  # the first connection, and one after the connection error


class FakeAsyncClient:
    """tritonclient.grpc.aio stand-in whose calls fail with ``errors`` first."""

    def __init__(self, errors: list[BaseException]) -> None:
        self.errors = errors
        self.calls = 0

    async def is_model_ready(self, model: str) -> bool:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return True

    async def close(self) -> None:
        pass


def _async_transport(monkeypatch, errors: list[BaseException]):
    client = FakeAsyncClient(errors)
    connects: list[int] = []

    def connect(self):
        connects.append(1)
        return client, None

    monkeypatch.setattr(AsyncTransport, "_connect", connect)
    transport = AsyncTransport(Endpoint("localhost:1", "grpc", False), retry=POLICY)
    return transport, client, connects


def test_the_async_transport_retries_the_same_way_and_lets_cancellation_through(monkeypatch):
    async def main() -> None:
        errors = [_overloaded(), _refused()]
        transport, client, connects = _async_transport(monkeypatch, errors)
        assert await transport.is_model_ready("m") is True
        assert client.calls == 3 and len(connects) == 2  # no reconnect after "full"

        transport, client, _ = _async_transport(monkeypatch, [asyncio.CancelledError()])
        with pytest.raises(asyncio.CancelledError):
            await transport.is_model_ready("m")
        assert client.calls == 1

    asyncio.run(main())
