"""URL handling and error translation of the client transport (no server)."""

from __future__ import annotations

import threading

import pytest

from triton_sam.client.transport import Transport, resolve_endpoint, translate_error
from triton_sam.errors import (
    InferenceTimeoutError,
    InputValidationError,
    InvalidRequestError,
    ServerError,
    ServerUnavailableError,
)


@pytest.mark.parametrize(
    "url, protocol, address, ssl",
    [
        (None, "http", "localhost:8000", False),
        (None, "grpc", "localhost:8001", False),
        ("example.org", "grpc", "example.org:8001", False),
        ("http://h:9000/", "http", "h:9000", False),
        ("https://h:443", "http", "h:443", True),
        ("grpcs://h", "grpc", "h:8001", True),
        ("[::1]:8000", "http", "[::1]:8000", False),
    ],
)
def test_resolve_endpoint(url, protocol, address, ssl, monkeypatch):
    monkeypatch.delenv("TRITON_URL", raising=False)
    ep = resolve_endpoint(url, protocol)
    assert (ep.address, ep.protocol, ep.ssl) == (address, protocol, ssl)


def test_triton_url_environment_variable_is_the_default(monkeypatch):
    monkeypatch.setenv("TRITON_URL", "https://remote:8443")
    ep = resolve_endpoint(None, "http")
    assert (ep.address, ep.ssl) == ("remote:8443", True)


@pytest.mark.parametrize(
    "url, protocol, field", [("h:1", "tcp", "protocol"), ("http://a/b", "http", "url")]
)
def test_bad_endpoint_names_the_field(url, protocol, field):
    with pytest.raises(InputValidationError) as info:
        resolve_endpoint(url, protocol)
    assert info.value.field == field


def test_translate_error_maps_tritonclient_statuses():
    from tritonclient.utils import InferenceServerException

    def exc(msg, status=None):
        return InferenceServerException(msg, status=status)

    assert isinstance(
        translate_error(exc("x", "StatusCode.DEADLINE_EXCEEDED"), what="w"), InferenceTimeoutError
    )
    assert isinstance(
        translate_error(exc("x", "StatusCode.UNAVAILABLE"), what="w"), ServerUnavailableError
    )
    err = translate_error(exc("unexpected shape for input 'image'", "400"), what="infer on m")
    assert type(err) is InvalidRequestError
    assert "unexpected shape" in str(err) and "infer on m" in str(err)
    err = translate_error(exc("model failed: boom", "500"), what="infer on m")
    assert type(err) is ServerError and "boom" in str(err)
    assert isinstance(
        translate_error(ConnectionRefusedError("no"), what="w"), ServerUnavailableError
    )


# -- threads: one connection per thread ------------------------------------------------------
class _Conn:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _threaded_transport(monkeypatch) -> tuple[Transport, list[_Conn]]:
    made: list[_Conn] = []

    def connect(self) -> _Conn:
        made.append(_Conn())
        return made[-1]

    monkeypatch.setattr(Transport, "_connect", connect)
    return Transport(resolve_endpoint("localhost:1", "http")), made


def test_each_thread_gets_its_own_connection_and_close_reaches_them_all(monkeypatch):
    transport, made = _threaded_transport(monkeypatch)
    mine = transport._client
    seen: list[object] = []
    threads = [threading.Thread(target=lambda: seen.append(transport._client)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert mine is made[0] and transport._client is mine  # same thread, same connection
    assert len(made) == 4 and len({id(c) for c in seen}) == 3 and mine not in seen
    transport.close()
    assert all(c.closed for c in made)
    assert transport._client is made[4]  # a call after close() opens a fresh one


def test_reconnect_replaces_only_the_calling_threads_connection(monkeypatch):
    transport, made = _threaded_transport(monkeypatch)
    other = threading.Thread(target=lambda: transport._client)
    other.start()
    other.join()
    transport.reconnect()
    assert made[0].closed and not made[1].closed
    assert transport._client is made[2]
