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
        """Insert or refresh ``key`` (newest), evicting the oldest past ``size``."""
        expires = time.monotonic() + self.ttl_s if self.ttl_s is not None else None
        self[key] = (value, expires)
        self.move_to_end(key)
        if len(self) > self.size:
            self.popitem(last=False)

    def fresh(self, key: Any) -> Any | None:
        """The value if present and not expired, else ``None``."""
        hit = self.get(key)
        if hit is None or (hit[1] is not None and hit[1] <= time.monotonic()):
            return None
        return hit[0]
