"""The routing header (client side) and the proxy configuration (rendered), without servers.

tests/integration/test_replicas.py runs both for real: clients through nginx to 3 replicas.
"""

from __future__ import annotations

import numpy as np
import pytest

from triton_sam.client.embedding_path import bytes_tensor, probe_inputs
from triton_sam.client.routing import ROUTING_HEADER, routing_headers, routing_key
from triton_sam.errors import InputValidationError
from triton_sam.scaleout.nginx import (
    HASH_VARIABLE,
    ProxyConfig,
    compose_config,
    render_nginx_conf,
)
from triton_sam.scaleout.proxy import read_access_log

IMAGE = "0123456789abcdef0123456789abcdef"


def test_session_requests_carry_their_image_id_as_the_key():
    assert routing_key(probe_inputs(IMAGE)) == IMAGE
    click = {"image_id": bytes_tensor(IMAGE), "point_coords": np.zeros((1, 1, 2), np.float32)}
    assert routing_headers(click) == {ROUTING_HEADER: IMAGE}


def test_tracker_requests_carry_their_videos_key_never_the_session_id():
    inputs = {"command": np.array([b"add_points"], dtype=np.object_)}
    inputs["session_id"] = np.array([[b"issued-secret"]], dtype=np.object_)
    assert routing_key(inputs) is None  # a bearer capability never goes into a header
    assert routing_headers(inputs, "video-7f3a") == {ROUTING_HEADER: "video-7f3a"}
    both = {**inputs, "image_id": bytes_tensor(IMAGE)}
    assert routing_key(both, "video-7f3a") == "video-7f3a"  # the caller's key wins
    assert routing_key(inputs, "a\nb") is None and routing_key(inputs, "") is None


@pytest.mark.parametrize(
    "inputs",
    [
        {"images": np.zeros((1, 3, 4, 4), np.float32)},  # encoder: no image id
        {"image_id": np.zeros((1, 1), np.int32)},  # not a BYTES tensor
        {"image_id": np.array([[b"a"], [b"b"]], dtype=np.object_)},  # more than one id
        {"image_id": bytes_tensor("")},
        {"image_id": bytes_tensor("x" * 257)},  # not an id of ours: not echoed
        {"image_id": bytes_tensor("a\nb")},  # would break the header
    ],
)
def test_requests_without_a_usable_image_id_carry_no_header(inputs):
    assert routing_key(inputs) is None
    assert routing_headers(inputs) is None


class _RecordingClient:
    """Stands in for a tritonclient client: records the keyword arguments of infer."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def infer(self, model, inputs, **kwargs):
        self.calls.append(kwargs)
        return self

    def as_numpy(self, name):
        return np.zeros((1, 1), np.float32)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_transport_sends_the_header_with_session_calls_only(protocol, monkeypatch):
    from triton_sam.client.transport import Transport, resolve_endpoint

    fake = _RecordingClient()
    monkeypatch.setattr(Transport, "_connect", lambda self: fake)
    transport = Transport(resolve_endpoint("localhost", protocol))
    transport.infer("sam2_session", probe_inputs(IMAGE), ["encoded"])
    transport.infer("sam2_encoder", {"images": np.zeros((1, 3), np.float32)}, ["x"])
    assert [c["headers"] for c in fake.calls] == [{ROUTING_HEADER: IMAGE}, None]


def test_proxy_hashes_the_header_consistently_and_retries_idempotent_calls():
    conf = render_nginx_conf(ProxyConfig(("a:8000", "b:8000"), ("a:8001", "b:8001")))
    assert HASH_VARIABLE == "$http_x_sam_image_id"
    assert conf.count(f"hash {HASH_VARIABLE} consistent;") == 2
    assert "proxy_next_upstream error timeout non_idempotent;" in conf
    assert "grpc_next_upstream error timeout non_idempotent;" in conf
    assert "grpc_pass grpc://triton_grpc;" in conf
    assert conf.count("server a:800") == 2 and conf.count("server b:800") == 2
    assert conf.count("zone triton_") == 2  # failure state shared by the workers


@pytest.mark.parametrize("tokens", [None, "/etc/nginx/tokens.map"])
def test_grpc_streams_have_no_total_body_limit_http_keeps_its_own(tokens):
    """A gRPC stream's body is every message it carries: sam-link's streams live as long as
    Paintera does, so a total limit would cut them after a number of encodes."""
    config = ProxyConfig(("a:8000",), ("a:8001",), tokens_file=tokens)
    blocks = render_nginx_conf(config).split("  server {")
    grpc = [b for b in blocks if "http2;" in b.split("\n", 2)[1]]
    http = [b for b in blocks[1:] if b not in grpc]
    assert len(grpc) == 1 and "    client_max_body_size 0;" in grpc[0]
    assert len(http) == 1 and "client_max_body_size" not in http[0]  # the http{} limit applies
    assert f"client_max_body_size {config.max_body};" in blocks[0]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "backends"),
        ({"http_backends": ("a:1",), "grpc_backends": ("a:2", "b:2")}, "grpc_backends"),
        ({"http_backends": ("a:1; evil",)}, "http_backends"),
        ({"http_backends": ("a:1",), "fail_timeout_s": 0}, "fail_timeout_s"),
    ],
)
def test_proxy_config_rejects_bad_fields(kwargs, field):
    with pytest.raises(InputValidationError, match=field):
        ProxyConfig(**kwargs)


def test_compose_config_names_one_replica_per_gpu():
    config = compose_config(3)
    assert config.http_backends == ("triton-0:8000", "triton-1:8000", "triton-2:8000")
    assert config.grpc_backends == ("triton-0:8001", "triton-1:8001", "triton-2:8001")
    with pytest.raises(InputValidationError, match="replicas"):
        compose_config(0)


def test_access_log_lines_parse_with_retries(tmp_path):
    log = tmp_path / "access.log"
    log.write_text(
        "127.0.0.1:1, 127.0.0.1:2\t502, 200\t200\t0\tabc\t900\t0.120\t/v2/models/m/infer\n"
        "127.0.0.1:3\t200\t200\t-\t-\t80\t0.002\t/v2/health/ready\n"
        "garbage\n"
    )
    first, second = read_access_log(log)
    assert first.upstreams == ("127.0.0.1:1", "127.0.0.1:2")
    assert first.upstream == "127.0.0.1:2" and first.statuses == ("502", "200")
    assert (first.key, first.grpc_status, first.request_length) == ("abc", "0", 900)
    assert (second.key, second.grpc_status, second.status) == ("", "", 200)
