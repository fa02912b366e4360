"""Server-side embeddings (``<family>_session``) against the embedded Triton, random-init models.

What is checked, each against the stateless decoder path on the same server:

- a click is at most 4 KiB on the wire (counted by a TCP proxy between client and server,
  framing and headers included), over gRPC and HTTP, for SAM2 and SAM1;
- same masks and scores for the prompt matrix (click, clicks with a negative, box, box +
  click, multimask, mask_input refinement, the mask sent by reference), exactly (the same
  decoder graph runs on the same features: tolerance 0);
- the LRU bound: with capacity 2 the cached images/bytes gauges stop at 2 images and the
  stub's RSS stops growing; a click on an evicted image is re-encoded transparently;
- 8 sessions on 8 images with interleaved clicks each get their own image's masks (within
  1e-5: there the encoder and decoder run batched, the reference alone);
- a click on a cached image is answered while another image is being encoded (by order of
  completion, not by a time bound);
- a server restarted between two clicks: the client re-encodes and gives the same mask.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prompt_matrix import prompt_matrix

from triton_sam.bench.wire import ByteCountingProxy
from triton_sam.client import SAM2TritonClient, SpeculativeSAM2Client
from triton_sam.models import get_family
from triton_sam.repository.config import RepositoryOptions
from triton_sam.repository.session_config import SessionOptions, embedding_bytes, write_session
from triton_sam.server import EmbeddedTriton
from triton_sam.tools.sample import sample_image

pytestmark = [
    pytest.mark.slow,
    pytest.mark.triton,
    pytest.mark.timeout(600),
    pytest.mark.uses_servers("sam2_tiny_server", "sam1_vit_b_server", "sam3_server"),
]

MAX_CLICK_BYTES = 4096
BATCHED_ATOL = 1e-5  # batched vs single ORT runs of the same graph (measured <= 1e-7)
IMAGE = sample_image(640, 427)
H, W = IMAGE.shape[:2]
PROMPTS = prompt_matrix(W, H)  # the parity tests' matrix
CLICK = PROMPTS["click"]["point_coords"]
BOX = PROMPTS["box"]["box"]


def other_image(seed: int, size: tuple[int, int] = (96, 64)) -> np.ndarray:
    """A small distinct image (the encoder cost is the same at any size)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)


def url_of(server: EmbeddedTriton, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def assert_same(ours, ref) -> None:
    np.testing.assert_array_equal(ours.iou_predictions, ref.iou_predictions)
    np.testing.assert_array_equal(ours.low_res_logits, ref.low_res_logits)
    np.testing.assert_array_equal(ours.masks, ref.masks)


def metrics(server: EmbeddedTriton) -> dict[str, float]:
    """The session model's gauges and counters, by short name."""
    with urllib.request.urlopen(f"{server.metrics_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("triton_sam_session_"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0].removeprefix("triton_sam_session_")] = float(value)
    return values


# counts what clients send (and receive): request, protocol framing, HTTP headers
CountingProxy = ByteCountingProxy


def wire_bytes_of_click(proxy: CountingProxy, client, **prompt) -> int:
    client.predict(**prompt)  # warm: connection set up, HPACK tables filled
    before = proxy.sent
    client.predict(**prompt)
    time.sleep(0.05)  # let the proxy threads count the last bytes
    return proxy.sent - before


# -- bytes on the wire -------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("family", ["sam2", "sam1", "sam3"])
def test_a_click_is_at_most_4_kib_on_the_wire(family, protocol, request):
    servers = {"sam2": "sam2_tiny_server", "sam1": "sam1_vit_b_server", "sam3": "sam3_server"}
    server = request.getfixturevalue(servers[family])
    address = server.grpc_address if protocol == "grpc" else server.http_address
    proxy = CountingProxy(address)
    prompt = PROMPTS["box_and_click"]
    try:
        with (
            SAM2TritonClient(proxy.address, model_type=family, protocol=protocol) as session,
            SAM2TritonClient(
                proxy.address, model_type=family, protocol=protocol, use_server_embeddings=False
            ) as stateless,
        ):
            assert session.uses_server_embeddings and not stateless.uses_server_embeddings
            session.set_image(IMAGE)
            stateless.set_image(IMAGE)
            wire = wire_bytes_of_click(proxy, session, **prompt)
            serialised = session.last_request_bytes
            stateless_wire = wire_bytes_of_click(proxy, stateless, **prompt)
            assert_same(session.predict_full(**prompt), stateless.predict_full(**prompt))
    finally:
        proxy.close()
    print(
        f"{family}/{protocol}: click {wire} B on the wire ({serialised} B request), "
        f"stateless {stateless_wire} B ({stateless_wire / wire:.0f}x)"
    )
    assert serialised <= wire <= MAX_CLICK_BYTES
    assert stateless_wire > 1000 * wire  # the features no longer travel


# -- same masks --------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["grpc", "http"])
def pair(request, sam2_tiny_server):
    """(session client, stateless client) on the same server, both with IMAGE set."""
    url = url_of(sam2_tiny_server, request.param)
    with (
        SAM2TritonClient(url, protocol=request.param) as session,
        SAM2TritonClient(url, protocol=request.param, use_server_embeddings=False) as stateless,
    ):
        session.set_image(IMAGE)
        stateless.set_image(IMAGE)
        yield session, stateless


@pytest.mark.parametrize("name", list(PROMPTS))
def test_prompt_matrix_same_as_stateless(pair, name):
    session, stateless = pair
    assert_same(session.predict_full(**PROMPTS[name]), stateless.predict_full(**PROMPTS[name]))
    assert session.last_request_bytes <= MAX_CLICK_BYTES


def test_mask_input_refinement_same_as_stateless(pair):
    session, stateless = pair
    first_ours = session.predict_full(**PROMPTS["click"])
    first_ref = stateless.predict_full(**PROMPTS["click"])
    refine = PROMPTS["clicks_with_negative"]
    # the previous logits: sent by reference (kept on the server), a few bytes
    ours = session.predict_full(mask_input=first_ours.low_res_logits[0, 0], **refine)
    assert session.last_request_bytes <= MAX_CLICK_BYTES
    ref = stateless.predict_full(mask_input=first_ref.low_res_logits[0, 0], **refine)
    assert_same(ours, ref)
    # a mask the server has never seen travels in full, with the same result
    edited = first_ours.low_res_logits[0, 0] * 0.5
    ours = session.predict_full(mask_input=edited, **refine)
    assert session.last_request_bytes > 256 * 256 * 4
    assert_same(ours, stateless.predict_full(mask_input=edited, **refine))
    # the mask must matter, or this proves nothing about it
    without = stateless.predict_full(**refine)
    assert np.abs(without.low_res_logits - ref.low_res_logits).max() > 1e-3


def test_multimask_refinement_by_reference(pair):
    session, stateless = pair
    ours = session.predict_full(**PROMPTS["multimask"])
    ref = stateless.predict_full(**PROMPTS["multimask"])
    refine = PROMPTS["clicks_with_negative"]
    ours = session.predict_full(mask_input=ours.low_res_logits[0, 2], **refine)
    assert session.last_request_bytes <= MAX_CLICK_BYTES
    assert_same(ours, stateless.predict_full(mask_input=ref.low_res_logits[0, 2], **refine))


def _executed(http_url: str, kind: str) -> int:
    """Inferences the server ran, summed over its models whose name says ``kind``."""
    with urllib.request.urlopen(f"{http_url}/v2/models/stats", timeout=5) as r:
        stats = json.load(r)["model_stats"]
    return sum(int(m.get("inference_count", 0)) for m in stats if kind in m["name"])


def test_a_click_runs_one_decoder_and_no_encoder(pair, sam2_tiny_server):
    """Session or stateless, each click is one decoder inference and no encoder run, by the
    server's statistics. Which path is faster is a measurement, not a test: `triton-sam bench
    users` reports both (its ``session-<protocol>`` and ``stateless-<protocol>`` rows)."""
    url = sam2_tiny_server.http_url
    for client in pair:
        before = _executed(url, "decoder"), _executed(url, "encoder")
        for _ in range(5):
            client.predict(**PROMPTS["click"])
        assert _settled(lambda: _executed(url, "decoder"), before[0] + 5) - before[0] == 5
        assert _executed(url, "encoder") == before[1]


def _settled(read, expected: int, timeout_s: float = 10.0) -> int:
    """``read()`` once it reaches ``expected`` (or the timeout): Triton counts an inference in
    its statistics after the response has gone out, so the last click's count can lag the
    answer by a moment. A count past ``expected`` is returned at once (the test then fails)."""
    deadline = time.monotonic() + timeout_s
    value = read()
    while value < expected and time.monotonic() < deadline:
        time.sleep(0.05)
        value = read()
    return value


# -- 8 sessions, interleaved -------------------------------------------------------------------
def test_eight_sessions_on_eight_images_interleaved(sam2_tiny_server):
    """Also: every click's decoder slot comes back (the ``decodes_in_flight`` gauge is 0 once
    all are answered: a lost slot would stall every later click)."""
    images = [other_image(seed) for seed in range(8)]
    clicks = [[[10 + 9 * i, 20 + 4 * i]] for i in range(8)]

    async def main():
        clients = [SpeculativeSAM2Client(sam2_tiny_server.grpc_url) for _ in images]
        try:
            await asyncio.gather(
                *(c.set_image_async(im) for c, im in zip(clients, images, strict=True))
            )
            assert all(c.uses_server_embeddings for c in clients)
            rounds = []
            for _ in range(3):  # every session clicks, all in flight at once, 3 times
                tasks = [
                    (await c.predict_async(clicks[i], [1], session_id=f"s{i}"))[1]
                    for i, c in enumerate(clients)
                ]
                rounds.append(await asyncio.gather(*tasks))
            return rounds
        finally:
            for c in clients:
                await c.aclose()

    rounds = asyncio.run(main())
    # Reference: each image alone, one click at a time (the features are cached: no encode;
    # the session path equals the stateless one, see the prompt matrix).
    with SAM2TritonClient(sam2_tiny_server.http_url) as reference:
        for i, image in enumerate(images):
            reference.set_image(image)
            masks, scores = reference.predict(clicks[i], [1])
            for r in rounds:
                # The concurrent embeds and clicks ran in encoder/decoder batches, the
                # reference alone: ORT's batched kernels reassociate (measured <= 1e-7).
                np.testing.assert_allclose(r[i][0], masks, atol=BATCHED_ATOL, rtol=0)
                np.testing.assert_allclose(r[i][1], scores, atol=BATCHED_ATOL, rtol=0)
    firsts = [r[0] for r in rounds[0]]
    assert len({m.tobytes() for m in firsts}) == 8  # eight different answers
    assert metrics(sam2_tiny_server)["decodes_in_flight"] == 0


# -- a click does not wait for another image's encode ------------------------------------------
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_click_is_answered_while_other_images_are_encoded(sam2_tiny_server, protocol):
    """Triton runs one ``execute`` of the session instance at a time; the model returns from
    it at once and answers by response sender, so a click on a cached image overtakes the
    encodes in flight. Four new images keep the encoder busy for a full batch (seconds on
    this CPU, against a click of tens of ms), so the order of completion shows it."""
    url = url_of(sam2_tiny_server, protocol)
    first = 2000 if protocol == "grpc" else 2010
    seeds = [first + i for i in range(4)]  # never embedded on this server
    finished: list[str] = []
    lock = threading.Lock()

    def embed(seed: int) -> None:
        with SAM2TritonClient(url, protocol=protocol) as client:
            client.set_image(other_image(seed))
        with lock:
            finished.append("encode")

    with SAM2TritonClient(url, protocol=protocol) as clicker:
        clicker.set_image(IMAGE)
        expected = clicker.predict(CLICK, [1])
        threads = [threading.Thread(target=embed, args=(seed,)) for seed in seeds]
        for thread in threads:
            thread.start()
        time.sleep(0.3)  # the embeds reach the server and the encoder starts
        masks, scores = clicker.predict(CLICK, [1])
        with lock:
            finished.append("click")
        for thread in threads:
            thread.join(timeout=300)
    assert finished == ["click"] + ["encode"] * 4
    np.testing.assert_array_equal(masks, expected[0])
    np.testing.assert_array_equal(scores, expected[1])


# -- LRU bound and restart: a server of our own, capacity 2 ------------------------------------
@pytest.fixture(scope="module")
def small_repository(sam2_tiny_repository, tmp_path_factory) -> Path:
    """The tiny SAM2 pair (ONNX files symlinked) + a session model that keeps 2 images."""
    repo = tmp_path_factory.mktemp("session_lru") / "model_repository"
    for name in ("sam2_encoder", "sam2_decoder"):
        shutil.copytree(sam2_tiny_repository / name, repo / name, copy_function=os.symlink)
    options = RepositoryOptions(instance_kind="cpu")  # the embedded server's session twin
    write_session(repo, get_family("sam2"), options, SessionOptions(max_images=2))
    return repo


def free_ports(n: int) -> list[int]:
    sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def stub_rss_bytes(server: EmbeddedTriton, model: str) -> int:
    """Resident memory of the python-backend stub process serving ``model``."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if os.getpgid(int(pid)) != server.pid or not any(model.encode() in a for a in cmdline):
                continue
            status = Path(f"/proc/{pid}/status").read_text()
        except (OSError, ProcessLookupError):
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no stub process for {model}")


def test_lru_bound_holds_and_evicted_images_are_reencoded(embedded_triton, small_repository):
    server = embedded_triton(small_repository)
    per_image = embedding_bytes(get_family("sam2"))  # 16 MiB
    images = [other_image(100 + i) for i in range(10)]
    seen = []
    with (
        SAM2TritonClient(server.http_url) as first,
        SAM2TritonClient(server.grpc_url, protocol="grpc") as other,
    ):
        first.set_image(images[0])
        before, _ = first.predict([[20, 20]], [1])
        for image in images[1:]:  # capacity 2: images[0] goes at the second of these
            other.set_image(image)
            other.predict([[20, 20]], [1])
            m = metrics(server)
            rss = stub_rss_bytes(server, "sam2_session")
            seen.append((m["cached_images"], m["cached_bytes"], rss))
        print("(images, bytes, stub RSS) after each embed:", seen)
        assert [s[0] for s in seen] == [2] * 9
        assert all(s[1] <= 2 * (per_image + 4 * 256 * 256 * 4) for s in seen)
        rss = [s[2] for s in seen]
        # Memory stops growing. The stub's RSS is noisy, not monotone: the python backend's
        # shared-memory pool grows one ~16 MiB step at the first eviction (seen: 138 -> 155 MB),
        # and the allocator flips between two resident sizes ~10 MB apart (seen on CI:
        # 161/172 MB). So skip that first step and compare the later embeds against the
        # earlier ones with a margin of 2 images: a leak of one image per embed would add
        # 7 x 16 MiB over these embeds; jitter stays under one image.
        rss = rss[1:]
        half = len(rss) // 2
        assert max(rss[half:]) - min(rss[:half]) < 2 * per_image, seen
        assert metrics(server)["evictions"] == len(images) - 2
        # images[0] was evicted: the click misses, and predict re-encodes and answers
        misses = metrics(server).get("misses", 0)
        after, _ = first.predict([[20, 20]], [1])
        assert metrics(server)["misses"] == misses + 1
        np.testing.assert_array_equal(after, before)


def test_evicted_images_come_back_from_the_feature_store_without_the_encoder(
    embedded_triton, sam2_tiny_repository, tmp_path
):
    """Capacity 2 and a feature store: images evicted from memory are written to disk and a
    click on one reads it back (no encoder run, no miss), to the same masks."""
    store = tmp_path / "features"
    repo = tmp_path / "model_repository"
    for name in ("sam2_encoder", "sam2_decoder"):
        shutil.copytree(sam2_tiny_repository / name, repo / name, copy_function=os.symlink)
    session = SessionOptions(max_images=2, feature_store_dir=str(store))
    write_session(repo, get_family("sam2"), RepositoryOptions(instance_kind="cpu"), session)
    server = embedded_triton(repo)
    url = server.http_url
    images = [other_image(200 + i) for i in range(4)]
    with SAM2TritonClient(url) as client:
        first = []
        for image in images:  # images 0 and 1 are evicted to the store
            client.set_image(image)
            first.append(client.predict([[20, 20]], [1]))
        encoded = _settled(lambda: _executed(url, "encoder"), 4)
        assert encoded == 4
        assert _settled(lambda: len(list(store.rglob("*.npz"))), 2) == 2
        misses = metrics(server).get("misses", 0)  # each new image's first probe missed
        for i in (0, 1):  # back from disk: the id probe finds them, nothing is encoded
            client.set_image(images[i])
            masks, scores = client.predict([[20, 20]], [1])
            np.testing.assert_array_equal(masks, first[i][0])
            np.testing.assert_array_equal(scores, first[i][1])
        m = metrics(server)
        assert m["restored"] == 2 and m.get("misses", 0) == misses
        assert _executed(url, "encoder") == encoded


def test_server_restarted_between_two_clicks(small_repository, tmp_path):
    http, grpc, metrics_port = free_ports(3)
    # exit_timeout_s: the clients' open connections would hold the stop for the full time
    ports = dict(http_port=http, grpc_port=grpc, metrics_port=metrics_port, exit_timeout_s=2)
    clients, first = {}, {}
    with EmbeddedTriton(small_repository, log_path=tmp_path / "a.log", **ports) as server:
        for protocol in ("grpc", "http"):
            clients[protocol] = SAM2TritonClient(url_of(server, protocol), protocol=protocol)
            clients[protocol].set_image(IMAGE)
            first[protocol] = clients[protocol].predict_full(**PROMPTS["click"])
    try:
        with EmbeddedTriton(small_repository, log_path=tmp_path / "b.log", **ports) as server:
            for protocol, client in clients.items():
                second = client.predict_full(**PROMPTS["click"])  # miss -> re-encode -> answer
                assert_same(second, first[protocol])
                # and a refinement by reference after the restart
                client.predict_full(
                    mask_input=second.low_res_logits[0, 0], **PROMPTS["clicks_with_negative"]
                )
                assert client.last_request_bytes <= MAX_CLICK_BYTES
            # the first client's click missed and re-embedded; the second client's image has
            # the same content id, so its click found the features already there
            assert metrics(server)["misses"] == 1
    finally:
        for client in clients.values():
            client.close()
