"""Issue 21's table against the peers, regenerated from one overhead section (quiet or crowded):
in ``report.md`` and the README's Performance section.

Rows (``ROWS``): the floor, awecompress, context-proxy, cliffcompaction, context-guardian,
headroom-ai (cache off), LiteLLM's proxy; each a measured candidate, or why it is not (an optional
peer not installed: how to install it). Columns (``COLUMNS``): added p50 at concurrency 1,
requests/s at 16, added p50 at 64, added time to the first streamed byte at 1, added p50 on the
large-history request (``overhead.HISTORY_BYTES``) at 1; each the median over the repetitions of
the section's points (``overhead.measure_point``), "–" where the run has no such point.
"""

from __future__ import annotations

from typing import Any

from tests.benchmarks import peers
from tests.benchmarks.overhead import HISTORY_BYTES

ROWS = ("floor", "awecompress", "proxy", "cliffcompaction", "context-guardian", "headroom", "litellm")
OWN_NAMES = {"floor": "the Python floor (raw ASGI relay on aiohttp)", "proxy": "**context-proxy**"}
NAME_SUFFIX = {"headroom": " (cache off)"}
COLUMNS = (("added p50, c=1", "added_p50_ms", 1, False), ("requests/s, c=16", "rps", 16, False),
           ("added p50, c=64", "added_p50_ms", 64, False), ("added time to the first streamed byte, c=1",
                                                            "added_ttfb_p50_ms", 1, True))
"""(header, measure, concurrency, streamed) of the columns read from ``points``; the last column
(the large-history request) is read from ``history_points``."""
MEASURES = (*(m for _h, m, _c, _s in COLUMNS), "added_p50_ms")


def _cell(measure: str, value: float) -> str:
    if measure == "rps":
        return f"{value:,.0f}"
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:+.{digits}f} ms"


def row_name(kind: str, ov: dict[str, Any]) -> str:
    """The row's name: ours, or the peer's name with the version measured (its pinned one when
    not measured) and headroom's "(cache off)"."""
    if kind in OWN_NAMES:
        return OWN_NAMES[kind]
    peer = peers.BY_KIND[kind]
    measured = (ov.get("peer_versions") or {}).get(kind)
    pinned = peer.install.rstrip("'").partition("==")[2]
    version = measured or pinned
    return f"{peer.name}{' ' + version if version else ''}{NAME_SUFFIX.get(kind, '')}"


def values(ov: dict[str, Any], kind: str) -> list[float | None]:
    """``kind``'s measured values, one per column (``COLUMNS``, then the large-history request)."""
    out: list[float | None] = []
    for _header, measure, concurrency, stream in COLUMNS:
        point = next((p for p in ov.get("points", []) if p["concurrency"] == concurrency and p["stream"] == stream
                      and p.get("api", "chat") == "chat"), None)
        cand = point["candidates"].get(kind) if point else None
        out.append(cand[measure]["median"] if cand else None)
    history = (ov.get("history_points") or [None])[0]
    cand = history["candidates"].get(kind) if history else None
    out.append(cand["added_p50_ms"]["median"] if cand else None)
    return out


def table(ov: dict[str, Any], mode: str) -> list[str]:
    """The peer table of one overhead section as Markdown lines (``mode``: quiet or crowded)."""
    history = (ov.get("history_points") or [None])[0]
    kb = f"{(history['history_bytes'] if history else HISTORY_BYTES) // 1000} KB"
    reps = next((p["reps"] for p in ov.get("points", [])), 0)
    headers = [h for h, *_ in COLUMNS] + [f"added p50, {kb} history, c=1"]
    up = ov.get("servers_on_candidate_core", "–")
    where = (f"{up} servers on the candidate core, all but the one measured paused" if mode == "quiet"
             else f"{up} servers up on the candidate core")
    lines = [f"Against the peers, {mode} ({where}): "
             f"added latency over the direct call, median of {reps} repetitions, candidates interleaved.", "",
             "| candidate | " + " | ".join(headers) + " |", "|---" * (len(headers) + 1) + "|"]
    status = ov.get("peer_status") or {}
    for kind in ROWS:
        measured = values(ov, kind)
        if all(v is None for v in measured):
            why = status.get(kind) or "not measured in this run"
            lines.append(f"| {row_name(kind, ov)} | {why} |" + " – |" * (len(headers) - 1))
            continue
        cells = [_cell(m, v) if v is not None else "–" for m, v in zip(MEASURES, measured, strict=True)]
        lines.append(f"| {row_name(kind, ov)} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def tables(results: dict[str, Any]) -> list[str]:
    """The peer tables of the run's overhead sections, quiet then crowded (none without one)."""
    lines: list[str] = []
    for key, mode in (("overhead", "quiet"), ("overhead_crowded", "crowded")):
        if results.get(key):
            lines += table(results[key], mode)
    return lines

