"""One SAM2TritonClient shared by several threads: same masks as one thread, and no hang.

tritonclient's HTTP client (gevent) hangs when called from another thread than the one that
made it; before each thread got its own connection, the HTTP case of this test hung.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from triton_sam.client import SAM2TritonClient, SpeculativeSAM2Client
from triton_sam.tools.sample import sample_image

pytestmark = [pytest.mark.triton, pytest.mark.timeout(180)]

IMAGE = sample_image(320, 240)
CLICKS = [[[20 + 25 * i, 30 + 15 * i]] for i in range(8)]
THREADS = 4
# Concurrent clicks meet in the decoder's dynamic batcher, and a batch of 4 runs other GEMM
# shapes than a batch of 1: float32 rounding differs (seen: 1.5e-7), values do not.
ATOL = 1e-5


def assert_close(got: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)


def _in_threads(fn, items) -> list:
    """``fn`` over ``items`` on THREADS threads; a hung call fails the test after 60 s
    instead of hanging it (pytest-timeout cannot interrupt the wait for a thread)."""
    pool = ThreadPoolExecutor(THREADS)
    try:
        return list(pool.map(fn, items, timeout=60))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _url(server, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


@pytest.mark.parametrize("server_embeddings", [True, False], ids=["session", "stateless"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_threads_sharing_a_client_get_the_masks_one_thread_gets(
    sam2_tiny_server, protocol, server_embeddings
):
    url = _url(sam2_tiny_server, protocol)
    with SAM2TritonClient(
        url, protocol=protocol, use_server_embeddings=server_embeddings
    ) as client:
        client.set_image(IMAGE)
        expected = [client.predict(point_coords=c, point_labels=[1]) for c in CLICKS]

        def click(i: int) -> tuple[np.ndarray, np.ndarray]:
            return client.predict(point_coords=CLICKS[i], point_labels=[1])

        got = _in_threads(click, range(len(CLICKS)))  # every click from a thread not the maker's
        for (masks, iou), (ref_masks, ref_iou) in zip(got, expected, strict=True):
            assert_close(iou, ref_iou)
            assert_close(masks, ref_masks)
    assert not client._transport._open  # close() reached every thread's connection


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_client_made_in_one_thread_works_in_another(sam2_tiny_server, protocol):
    with ThreadPoolExecutor(1) as maker:
        client = maker.submit(
            SAM2TritonClient, _url(sam2_tiny_server, protocol), protocol=protocol
        ).result()
    try:
        client.set_image(IMAGE)
        masks, iou = client.predict(point_coords=CLICKS[0], point_labels=[1])
        assert masks.shape == (1, 1, *IMAGE.shape[:2]) and np.isfinite(iou).all()
    finally:
        client.close()


def test_the_speculative_clients_blocking_calls_work_from_threads(sam2_tiny_server):
    with SpeculativeSAM2Client(sam2_tiny_server.http_url, protocol="http") as client:
        client.set_image(IMAGE)
        expected = client.predict_sync(CLICKS[1], [1])
        got = _in_threads(lambda _: client.predict_sync(CLICKS[1], [1]), range(THREADS))
        for masks, iou in got:
            assert_close(iou, expected[1])
            assert_close(masks, expected[0])
