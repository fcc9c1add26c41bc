"""The shared traces as the benchmark reads them (light: no proxy imports, so the Deep Agents
driver can use it from another environment)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


def load_trace(path: Path) -> list[dict[str, Any]]:
    """The messages of a JSONL trace."""
    return [orjson.loads(line) for line in path.read_text().splitlines() if line.strip()]


def request_points(trace: list[dict[str, Any]]) -> list[int]:
    """Indices ``i`` of assistant messages: ``trace[:i]`` is one request."""
    return [i for i, m in enumerate(trace) if m.get("role") == "assistant" and i > 0]


def prefix_share(a: bytes, b: bytes) -> float:
    """Share of ``a`` that ``b`` starts with, byte for byte (0..1)."""
    n = min(len(a), len(b))
    lo, hi = 0, n
    while lo < hi:  # longest common prefix by bisection on slices (C speed)
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo / len(a) if a else 1.0
