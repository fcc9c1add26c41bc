"""Order statistics used by every section (no numpy needed)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation; ``nan`` for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def spread(values: Sequence[float]) -> dict[str, float]:
    """``{"median", "min", "max"}`` of repeated measurements (the spread shown in tables)."""
    vals = [v for v in values if v == v]
    if not vals:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
