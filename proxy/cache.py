"""A small bounded, optionally expiring, in-process cache for the hot path (no I/O, no locks:
used from one event loop)."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any


class BoundedCache(OrderedDict):  # type: ignore[type-arg]
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
