"""The session model's feature store: evicted features on disk, per tenant, bounded, shared.

The store runs on a real event loop and thread pool here, as in the model
(``serving/embedding_cache/disk.py``); the cache hook is tested with the model's own store.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os

import numpy as np
import pytest

from triton_sam.serving.embedding_cache import disk
from triton_sam.serving.embedding_cache.disk import FeatureStore
from triton_sam.serving.embedding_cache.store import EmbeddingCache, Scoped

NAMES = ("image_embeddings", "high_res_feats_0")
FEATURE_BYTES = 4 * 64 + 4 * 32  # what one entry's file holds, about (npz adds headers)


def features(seed):
    rng = np.random.default_rng(seed)
    return {
        "image_embeddings": rng.standard_normal((1, 4, 4, 4)).astype(np.float32),
        "high_res_feats_0": rng.standard_normal((1, 2, 4, 4)).astype(np.float32),
    }


@pytest.fixture
def pool():
    with concurrent.futures.ThreadPoolExecutor(2) as executor:
        yield executor


def run(coroutine):
    return asyncio.run(coroutine)


def test_spilled_features_come_back_exactly_with_their_size(tmp_path, pool):
    store = FeatureStore(tmp_path, 10**6, NAMES, pool)
    key = Scoped("alice", "a" * 32)

    async def go():
        await store.spill(key, features(0), (480, 640))
        return await store.restore(key)

    got, hw = run(go())
    assert hw == (480, 640)
    for name, value in features(0).items():
        np.testing.assert_array_equal(got[name], value)
    assert store.writes == 1 and store.reads == 1


def test_another_tenant_never_reads_them(tmp_path, pool):
    store = FeatureStore(tmp_path, 10**6, NAMES, pool)

    async def go():
        await store.spill(Scoped("alice", "same-picture"), features(0), None)
        return await store.restore(Scoped("bob", "same-picture"))

    assert run(go()) is None
    assert (
        store.path(Scoped("alice", "x")).split(os.sep)[-3]
        != store.path(Scoped("bob", "x")).split(os.sep)[-3]
    )  # a directory per tenant, named by a hash
    assert "alice" not in store.path(Scoped("alice", "../../etc/passwd"))
    assert os.path.dirname(os.path.dirname(store.path(Scoped("a", "../../x")))).startswith(
        str(tmp_path)
    )


def test_the_bound_is_shared_fairly_and_old_files_are_deleted(tmp_path, pool):
    one = os.path.getsize(_written(tmp_path / "probe", pool))
    store = FeatureStore(tmp_path / "store", 4 * one, NAMES, pool)  # four files in all

    async def go():
        for i in range(3):
            await store.spill(Scoped("alice", f"a{i}"), features(i), None)
        for i in range(3):  # bob's files take the room alice used above her share (2)
            await store.spill(Scoped("bob", f"b{i}"), features(10 + i), None)

    run(go())
    files = sorted(p.name for p in (tmp_path / "store").rglob("*.npz"))
    assert len(files) == 4
    held = store.index.keys()  # the LRU's keys, least recently used first
    assert sorted(k.image_id for k in held) == ["a1", "a2", "b1", "b2"]
    assert run(store.restore(Scoped("alice", "a0"))) is None  # deleted: a miss


def test_a_file_another_replica_wrote_is_found(tmp_path, pool):
    first = FeatureStore(tmp_path, 10**6, NAMES, pool)
    second = FeatureStore(tmp_path, 10**6, NAMES, pool)  # another replica, same volume
    run(first.spill(Scoped("t", "img"), features(3), (5, 6)))
    got, hw = run(second.restore(Scoped("t", "img")))
    assert hw == (5, 6)
    np.testing.assert_array_equal(got["high_res_feats_0"], features(3)["high_res_feats_0"])


def test_a_damaged_or_foreign_file_is_a_miss_and_is_deleted(tmp_path, pool):
    store = FeatureStore(tmp_path, 10**6, NAMES, pool)
    key = Scoped("t", "img")
    path = store.path(key)
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(b"PK\x03\x04 not a zip")
    assert run(store.restore(key)) is None and not os.path.exists(path)
    np.savez(path, other=np.zeros(3))  # well formed, wrong arrays (the name ends in .npz)
    assert run(store.restore(key)) is None and not os.path.exists(path)


def test_writes_waiting_for_the_disk_are_bounded(tmp_path, pool):
    store = FeatureStore(tmp_path, 10**9, NAMES, pool)

    async def go():
        tasks = [
            asyncio.ensure_future(store.spill(Scoped("t", f"i{i}"), features(i), None))
            for i in range(disk.MAX_PENDING_WRITES + 5)
        ]
        await asyncio.gather(*tasks)

    run(go())
    assert store.dropped == 5 and store.writes == disk.MAX_PENDING_WRITES


def test_the_cache_hands_each_evicted_image_to_the_store():
    cache = EmbeddingCache(max_images=2)
    evicted = []
    cache.on_evict(lambda scoped, entry: evicted.append((scoped, entry.features)))
    for i in range(4):
        cache.put(Scoped("t", f"i{i}"), {"f": i}, 10, hw=(1, 1))
    assert evicted == [(Scoped("t", "i0"), {"f": 0}), (Scoped("t", "i1"), {"f": 1})]
    for i in range(3):  # crops are not spilled
        cache.put(Scoped("t", f"c{i}"), {"f": i}, 10, crop=True)
    assert len(evicted) == 2


def test_only_host_features_are_spilled():
    class Gpu:
        def is_cpu(self):
            return False

    assert disk.host_arrays({"a": Gpu()}) is None
    arrays = disk.host_arrays({"a": np.ones(2)})
    assert list(arrays) == ["a"]


def _written(folder, pool):
    store = FeatureStore(folder, 10**6, NAMES, pool)
    run(store.spill(Scoped("t", "probe"), features(99), None))
    return store.path(Scoped("t", "probe"))
