"""The serving models' LRU (``triton_sam.serving.cache``) shared by tenants: global bounds, a
fair share each, and a tenant within its share never evicted by another tenant's entries."""

from __future__ import annotations

from triton_sam.serving.cache import LruCache


def test_one_tenant_is_plain_lru():
    lru = LruCache(max_entries=3)
    for name in "abc":
        lru.put(name, name, 1)
    lru.get("a")
    assert lru.put("d", "d", 1) == ["b"] and lru.keys() == ["c", "a", "d"]


def test_a_burst_of_one_tenant_evicts_its_own_entries_not_another_tenants():
    lru = LruCache(max_entries=8)
    victim = [("victim", i) for i in range(3)]
    for key in victim:  # the oldest entries of the cache: plain LRU would evict them first
        lru.put(key, 0, 1, owner="victim")
    evicted = []
    for i in range(100):  # another tenant embeds 100 new images
        evicted += lru.put(("burst", i), 0, 1, owner="burst")
    assert all(key[0] == "burst" for key in evicted)
    assert all(key in lru for key in victim) and len(lru) == 8


def test_a_tenant_above_its_share_yields_to_one_within_it():
    lru = LruCache(max_entries=4)
    for i in range(4):  # alone, a tenant may use the whole cache
        lru.put(("a", i), 0, 1, owner="a")
    assert lru.put(("b", 0), 0, 1, owner="b") == [("a", 0)]  # shares are now 2 and 2
    assert lru.put(("b", 1), 0, 1, owner="b") == [("a", 1)]
    assert lru.put(("b", 2), 0, 1, owner="b") == [("b", 0)]  # b at its share: its own goes
    assert sorted(lru.keys()) == [("a", 2), ("a", 3), ("b", 1), ("b", 2)]


def test_the_byte_bound_is_shared_too():
    lru = LruCache(max_entries=100, max_bytes=100)
    lru.put("v1", 0, 20, owner="victim")
    lru.put("v2", 0, 20, owner="victim")
    evicted = []
    for i in range(10):
        evicted += lru.put(f"b{i}", 0, 20, owner="burst")
    assert "v1" not in evicted and "v2" not in evicted
    assert lru.nbytes <= 100 and "v1" in lru and "v2" in lru
