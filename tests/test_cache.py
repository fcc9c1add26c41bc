"""proxy/cache.py: the bounded, expiring LRU of the hot path."""

from __future__ import annotations

import time

from proxy.cache import BoundedCache, Memo


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


class _Clock:
    """A stand-in for the ``time`` module: ``monotonic()`` is what the test sets."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_memo_weight_bound_drops_least_recently_used_first() -> None:
    memo = Memo(10, weight=len)
    memo.put("a", [1] * 4)
    memo.put("b", [1] * 4)
    assert memo.get("a") == [1] * 4  # "a" is now the most recently used
    memo.put("c", [1] * 4)  # total 12 > 10: the least recently used ("b") leaves
    assert "b" not in memo and "a" in memo and "c" in memo and memo.total == 8
    assert memo.pop("a") == [1] * 4 and memo.total == 4 and memo.pop("a") is None
    memo.put("huge", [1] * 50)  # over the bound alone: kept, everything older leaves
    assert list(memo._entries) == ["huge"] and memo.total == 50


def test_memo_weighs_an_entry_once_when_put() -> None:
    """A stored entry's weight is the one counted at ``put``: leaving (popped or evicted) takes off
    that, without weighing the value again (a ``PrefixState`` was weighed at every put and pop)."""
    calls: list[int] = []

    def weight(value: list[int]) -> int:
        calls.append(len(value))
        return len(value)

    memo = Memo(10, weight=weight)
    grown = [1] * 3
    memo.put("a", grown)
    memo.put("b", [1] * 3)
    grown.extend([1] * 5)  # a caller broke the rule; the bound's arithmetic stays right all the same
    assert memo.pop("a") is grown and memo.total == 3
    memo.put("c", [1] * 9)  # 12 > 10: "b" is evicted, its 3 taken off
    assert list(memo._entries) == ["c"] and memo.total == 9
    assert calls == [3, 3, 9]


def test_memo_drops_entries_idle_longer_than_idle_s_but_keeps_used_ones(monkeypatch) -> None:
    """Memory follows the sessions active lately, not every session since start."""
    import proxy.cache

    clock = _Clock()
    monkeypatch.setattr(proxy.cache, "time", clock)
    memo = Memo(1_000_000, idle_s=60)
    for i in range(100):
        memo.put(i, i)
    clock.now += 30
    assert memo.get(7) == 7  # read: no longer idle
    clock.now += 31
    memo.put("new", 1)
    assert sorted(memo._entries, key=str) == [7, "new"] and memo.total == 2
    clock.now += 61
    memo.put("newer", 2)
    assert list(memo._entries) == ["newer"]


def test_digest_memo_forgets_idle_conversations_and_stays_correct(monkeypatch) -> None:
    import copy

    import proxy.conversation.digest_memo
    from proxy.conversation.digest_memo import DigestMemo
    from tests.test_chat import _direct as direct

    clock = _Clock()
    monkeypatch.setattr(proxy.conversation.digest_memo, "time", clock)
    memo = DigestMemo(idle_s=60)
    old = [{"role": "user", "content": f"old {i}"} for i in range(5)]
    live = [{"role": "user", "content": f"live {i}"} for i in range(5)]
    memo.digests_and_chain(old)
    memo.digests_and_chain(live)
    assert len(memo._runs) == 2
    clock.now += 50
    live.append({"role": "user", "content": "next turn"})
    memo.digests_and_chain(copy.deepcopy(live))  # the live conversation is used again
    clock.now += 20  # "old" idle 70 s, "live" 20 s
    assert memo.digests_and_chain(copy.deepcopy(live)) == direct(live)
    assert len(memo._runs) == 1 and memo._bytes == next(iter(memo._runs.values())).nbytes
    hashed = memo.hashed
    assert memo.digests_and_chain(copy.deepcopy(old)) == direct(old)  # forgotten: hashed again
    assert memo.hashed == hashed + len(old)


def test_memo_pop_longest_takes_the_deepest_remembered_key_within_the_lookback() -> None:
    memo = Memo(100)
    memo.put("a", "value of [a]")
    memo.put("c", "value of [a, b, c]")
    assert memo.pop_longest(["a", "b", "c", "d"], 4) == ("value of [a, b, c]", 3)
    assert "c" not in memo  # taken: the caller puts the extended value under its new end
    assert memo.pop_longest(["a", "b", "c", "d"], 2) == (None, 0)  # "a" is beyond the lookback
    assert memo.pop_longest(["a", "b"], 2) == ("value of [a]", 1) and memo.total == 0
