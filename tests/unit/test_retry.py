"""Retries with exponential backoff: idempotent calls only, connection errors only."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from triton_sam.client import retry as retry_module
from triton_sam.client.retry import (
    NO_RETRY,
    RetryPolicy,
    acall_with_retry,
    call_with_retry,
    is_retryable,
)
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


class Flaky:
    """Fails with ``errors`` in order, then answers ``"ok"``."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def test_backoff_is_exponential_and_capped():
    assert [POLICY.backoff_s(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.25, 0.25]


def test_connection_errors_are_retried_with_backoff_then_succeed():
    sleeps: list[float] = []
    reconnects = []
    fn = Flaky(ServerUnavailableError("down"), ServerOverloadedError("queue full"))
    result = call_with_retry(
        fn, POLICY, sleep=sleeps.append, before_retry=lambda: reconnects.append(1)
    )
    assert result == "ok" and fn.calls == 3
    assert sleeps == [0.1, 0.2]
    # a fresh connection after the connection error; not after the overloaded answer
    assert len(reconnects) == 1


def test_attempts_are_bounded_and_the_last_error_is_raised():
    errors = [ServerUnavailableError(f"down {i}") for i in range(5)]
    fn = Flaky(*errors)
    with pytest.raises(ServerUnavailableError, match="down 3"):
        call_with_retry(fn, POLICY, sleep=lambda s: None)
    assert fn.calls == 4


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
    fn = Flaky(error)
    with pytest.raises(type(error)):
        call_with_retry(fn, POLICY, sleep=lambda s: pytest.fail("must not wait"))
    assert fn.calls == 1
    assert not is_retryable(error)


def test_no_retry_policy_tries_once():
    fn = Flaky(ServerUnavailableError("down"))
    with pytest.raises(ServerUnavailableError):
        call_with_retry(fn, NO_RETRY, sleep=lambda s: None)
    assert fn.calls == 1


def test_no_retry_starts_past_the_deadline(monkeypatch):
    clock = iter([0.0, 0.05, 10.0, 10.0])  # start, first failure, second failure
    monkeypatch.setattr(retry_module.time, "monotonic", lambda: next(clock))
    fn = Flaky(*[ServerUnavailableError("down")] * 3)
    with pytest.raises(ServerUnavailableError):
        call_with_retry(fn, POLICY, deadline_s=1.0, sleep=lambda s: None)
    assert fn.calls == 2


def test_async_retry_retries_and_lets_cancellation_through():
    async def main() -> None:
        fn = Flaky(ServerUnavailableError("down"))
        sleeps: list[float] = []

        async def sleep(s: float) -> None:
            sleeps.append(s)

        async def call() -> str:
            return fn()

        assert await acall_with_retry(call, POLICY, sleep=sleep) == "ok"
        assert sleeps == [0.1]

        async def cancelled() -> str:
            raise asyncio.CancelledError

        with pytest.raises(asyncio.CancelledError):
            await acall_with_retry(cancelled, POLICY, sleep=sleep)

    asyncio.run(main())


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


def test_an_overloaded_answer_is_retried_on_the_same_connection():
    """Reconnecting closes the shared channel, which cancels every other request in flight
    on it: a stress run with four sessions lost all of them to one session's overload."""
    errors = [ServerOverloadedError("full"), ServerUnavailableError("down")]
    reconnects = []

    def fn():
        if errors:
            raise errors.pop(0)
        return "ok"

    out = call_with_retry(fn, POLICY, before_retry=lambda: reconnects.append(1), sleep=lambda s: 0)
    assert out == "ok" and reconnects == [1]  # only after the connection error

    async def main():
        errors[:] = [ServerOverloadedError("full"), ServerOverloadedError("full")]

        async def afn():
            if errors:
                raise errors.pop(0)
            return "ok"

        async def reconnect():
            reconnects.append(2)

        async def no_sleep(_):
            return None

        return await acall_with_retry(afn, POLICY, before_retry=reconnect, sleep=no_sleep)

    assert asyncio.run(main()) == "ok" and reconnects == [1]
