"""proxy/cache.py: the bounded, expiring LRU of the hot path."""

from __future__ import annotations

import time

from proxy.cache import BoundedCache


def test_size_bound_evicts_the_least_recently_put() -> None:
    cache = BoundedCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 3)  # refreshed: now the newest
    cache.put("c", 4)
    assert cache.fresh("b") is None and cache.fresh("a") == 3 and cache.fresh("c") == 4


def test_expired_entries_are_dropped_on_the_next_put_not_only_hidden() -> None:
    """Memory follows the recent traffic: entries older than the TTL leave the cache."""
    cache = BoundedCache(1000, ttl_s=0.05)
    for i in range(100):
        cache.put(i, i)
    assert cache.fresh(99) == 99
    time.sleep(0.08)
    assert cache.fresh(99) is None  # expired: hidden
    cache.put("new", 1)
    assert list(cache) == ["new"]  # and gone
