"""A small bounded, optionally expiring, in-process cache for the hot path (no I/O, no locks:
used from one event loop)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any


class BoundedCache(OrderedDict):
    """An LRU mapping of at most ``size`` entries; ``ttl_s`` bounds how long ``fresh`` trusts one."""

    def __init__(self, size: int, ttl_s: float | None = None) -> None:
        super().__init__()
        self.size = size
        self.ttl_s = ttl_s

    def put(self, key: Any, value: Any) -> None:
        """Insert or refresh ``key`` (newest), evicting the oldest past ``size`` and, with a TTL,
        every expired entry (they are the oldest: one TTL for all, and ``put`` moves an entry to
        the end). So a cache holds what was put in the last ``ttl_s``, not ``size`` entries of
        long-finished sessions (a 200-stream load run's memory grew with them)."""
        now = time.monotonic()
        expires = now + self.ttl_s if self.ttl_s is not None else None
        self[key] = (value, expires)
        self.move_to_end(key)
        if len(self) > self.size:
            self.popitem(last=False)
        if expires is not None:
            while True:
                first = next(iter(self.values()))
                if first[1] > now:
                    break
                self.popitem(last=False)

    def fresh(self, key: Any) -> Any | None:
        """The value if present and not expired, else ``None``."""
        hit = self.get(key)
        if hit is None or (hit[1] is not None and hit[1] <= time.monotonic()):
            return None
        return hit[0]

    def touch(self, key: Any) -> None:
        """Make ``key`` (present) the newest, its expiry unchanged (without a TTL: ``put`` of its
        own value). Raises ``KeyError`` when absent."""
        self.move_to_end(key)


MEMO_IDLE_S = 60.0
"""Seconds an in-process memo keeps an entry nobody used. The memos serve an agent's loop (its next
turn resends the same history within seconds); an entry of a conversation that went quiet only
holds memory, and recomputing it costs about 3 ms per MB of history (``tests/benchmarks``,
pipeline section), so memory follows the sessions active in the last minute, not every session
since start. Measured in the 200-stream load run (sessions replaced every 20 turns): without
idle expiry, memo memory still grew after 7 minutes; see ``RELIABILITY.md``."""


class Memo:
    """An LRU memo bounded by weight and by idleness (no I/O, no locks: callers lock if shared).

    ``max_weight``: the bound on the sum of ``weight(value)`` over the entries (``weight``
    defaults to 1 an entry: a bound on entries); least recently used entries leave first, and an
    entry whose weight alone is over the bound is kept only until the next ``put``. ``idle_s``:
    an entry not read (``get``) or written (``put``) for that many seconds leaves at the next
    ``put``. ``None`` is not a storable value (``get`` answers ``None`` for a miss).
    """

    __slots__ = ("_entries", "idle_s", "max_weight", "total", "weight")

    def __init__(self, max_weight: int, idle_s: float = MEMO_IDLE_S, weight: Any = None) -> None:
        self._entries: OrderedDict[Any, list[Any]] = OrderedDict()  # key -> [value, last used, weight]
        self.max_weight = max_weight
        self.idle_s = idle_s
        self.weight = weight
        self.total = 0
        """Sum of the entries' weights."""

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Any) -> bool:
        return key in self._entries

    def clear(self) -> None:
        self._entries.clear()
        self.total = 0

    def get(self, key: Any) -> Any:
        """The value of ``key`` (now the most recently used), or ``None``."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        entry[1] = time.monotonic()
        self._entries.move_to_end(key)
        return entry[0]

    def pop(self, key: Any) -> Any:
        """Remove ``key``; its value, or ``None``."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self.total -= entry[2]
        return entry[0]

    def pop_longest(self, keys: Sequence[Any], lookback: int) -> tuple[Any, int]:
        """Remove and return the value under the last of ``keys``' newest ``lookback`` keys that
        has one, with the position after that key: ``(value, i + 1)``; ``(None, 0)`` when none has.
        For memos keyed by chain hash, where ``keys[i]`` names the prefix ``[0, i]``: the value of
        the longest prefix seen before (the caller extends it and ``put``s it under the new end)."""
        entries = self._entries
        stop = len(keys) - 1 - lookback
        # (``max(-1, stop)`` without its call: a builtin's arguments are parsed as keywords too)
        for i in range(len(keys) - 1, stop if stop > -1 else -1, -1):
            entry = entries.pop(keys[i], None)  # (``pop``, inlined: a request takes a prefix state twice)
            if entry is not None:
                self.total -= entry[2]
                return entry[0], i + 1
        return None, 0

    def put(self, key: Any, value: Any) -> None:
        """Store ``value`` under ``key`` (most recently used), then drop idle and excess entries.
        Its weight is taken now and counted until it leaves (``value`` must not change weight
        while stored)."""
        now = time.monotonic()
        entries = self._entries
        old = entries.pop(key, None)
        if old is not None:
            self.total -= old[2]
        weight = self.weight(value) if self.weight else 1
        entries[key] = [value, now, weight]
        self.total += weight
        cutoff = now - self.idle_s
        while len(entries) > 1:
            first = next(iter(entries.values()))
            if self.total <= self.max_weight and first[1] >= cutoff:
                break
            self.total -= first[2]
            entries.popitem(last=False)
