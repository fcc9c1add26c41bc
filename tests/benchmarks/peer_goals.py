"""Issue 21's goals against the peers, per mode (quiet, crowded): the ``goals.peers`` and
``goals.crowded`` objects of ``results.json`` and their rows in the report and the README.

- ``vs_awecompress``: the proxy's added p50 (ms) against awecompress's at every non-streaming
  concurrency (keys ``"1"``, ``"16"``, ...) and to the first streamed event at the first
  concurrency (key ``"ttfb"``); goal: at or below awecompress's everywhere.
- ``history``: the large-history point (``overhead.HISTORY_BYTES``): every candidate's added p50
  (ms); goal: the proxy's the lowest of the peers (every candidate but ``NOT_PEERS``).
- ``throughput_crowded_vs_quiet``: the proxy's requests/s in crowded mode ÷ in quiet mode, per
  non-streaming concurrency (shown with the floor's, which shares the crowd: no goal, a collapse
  shows as a ratio far below the floor's).
"""

from __future__ import annotations

from typing import Any

NOT_PEERS = ("direct", "floor", "proxy-httpx", "baseline")
"""Candidates that are no peer: the references and this project's own variants and trees."""


def _non_streaming(ov: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in ov.get("points", []) if not p["stream"]]


def goals(ov: dict[str, Any] | None) -> dict[str, Any]:
    """``{"vs_awecompress": {...} | None, "history": {...} | None}`` of one overhead section."""
    out: dict[str, Any] = {"vs_awecompress": None, "history": None}
    if not ov:
        return out
    vs: dict[str, dict[str, float]] = {}
    for point in ov.get("points", []):
        cands = point["candidates"]
        if "proxy" not in cands or "awecompress" not in cands:
            continue
        if not point["stream"]:
            vs[str(point["concurrency"])] = {"proxy": cands["proxy"]["added_p50_ms"]["median"],
                                             "awecompress": cands["awecompress"]["added_p50_ms"]["median"]}
        elif "ttfb" not in vs:
            vs["ttfb"] = {"proxy": cands["proxy"]["added_ttfb_p50_ms"]["median"],
                          "awecompress": cands["awecompress"]["added_ttfb_p50_ms"]["median"]}
    if vs:
        out["vs_awecompress"] = vs
    for point in ov.get("history_points") or []:
        added = {k: c["added_p50_ms"]["median"] for k, c in point["candidates"].items() if k != "direct"}
        peers = {k: v for k, v in added.items() if k not in NOT_PEERS}
        if "proxy" in peers:
            fastest = min(peers, key=lambda k: peers[k])
            out["history"] = {"bytes": point["history_bytes"], "added_p50_ms": added, "fastest_peer": fastest,
                              "proxy_fastest": fastest == "proxy"}
    return out


def verdicts(g: dict[str, Any]) -> dict[str, bool]:
    """``vs_awecompress`` (every key met) and ``history_fastest``, for the goals measured."""
    out: dict[str, bool] = {}
    if g.get("vs_awecompress"):
        out["vs_awecompress"] = all(v["proxy"] <= v["awecompress"] for v in g["vs_awecompress"].values())
    if g.get("history"):
        out["history_fastest"] = bool(g["history"]["proxy_fastest"])
    return out


def crowded_vs_quiet(quiet: dict[str, Any] | None, crowded: dict[str, Any] | None) -> dict[str, Any] | None:
    """Requests/s crowded ÷ quiet by non-streaming concurrency, for the proxy and the floor;
    ``None`` unless both modes ran."""
    if not quiet or not crowded:
        return None
    out: dict[str, dict[str, float]] = {}
    for q, c in zip(_non_streaming(quiet), _non_streaming(crowded), strict=False):
        row = {}
        for kind in ("proxy", "floor"):
            if kind in q["candidates"] and kind in c["candidates"]:
                row[kind] = c["candidates"][kind]["rps"]["median"] / max(q["candidates"][kind]["rps"]["median"], 1e-9)
        out[str(q["concurrency"])] = row
    return out


def _verdict(ok: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "–"}[ok]


def rows(g: dict[str, Any], mode: str) -> list[str]:
    """Markdown rows of the goals table (``| goal | measured | verdict |``) for one mode."""
    lines: list[str] = []
    vs = g.get("vs_awecompress")
    if vs:
        keys = sorted((k for k in vs if k != "ttfb"), key=int)
        cells = " / ".join(f"{vs[k]['proxy']:.2f} vs {vs[k]['awecompress']:.2f} ms" for k in keys)
        met = all(vs[k]["proxy"] <= vs[k]["awecompress"] for k in keys)
        lines.append(f"| {mode}: added p50 ≤ awecompress's (concurrency {' / '.join(keys)}) | {cells} | {_verdict(met)} |")
        if "ttfb" in vs:
            t = vs["ttfb"]
            lines.append(f"| {mode}: added time to the first streamed event ≤ awecompress's | {t['proxy']:.2f} vs "
                         f"{t['awecompress']:.2f} ms | {_verdict(t['proxy'] <= t['awecompress'])} |")
    else:
        lines.append(f"| {mode}: added p50 ≤ awecompress's | not measured (awecompress not installed) | – |")
    h = g.get("history")
    if h:
        others = ", ".join(f"{k} {v:.2f}" for k, v in sorted(h["added_p50_ms"].items(), key=lambda kv: kv[1]) if k != "proxy")
        lines.append(f"| {mode}: {h['bytes'] // 1000} KB history (concurrency 1), the proxy's added p50 the lowest of "
                     f"the peers | {h['added_p50_ms']['proxy']:.2f} ms ({others}) | {_verdict(h['proxy_fastest'])} |")
    return lines


def crowd_rows(ratios: dict[str, Any] | None) -> list[str]:
    """The shown (no goal) row: throughput crowded ÷ quiet."""
    if not ratios:
        return []
    keys = sorted(ratios, key=int)
    cells = " / ".join(f"{ratios[k].get('proxy', float('nan')):.2f}× (floor {ratios[k].get('floor', float('nan')):.2f}×)"
                       for k in keys)
    return [f"| (shown, no goal) requests/s crowded ÷ quiet (concurrency {' / '.join(keys)}) | {cells} | – |"]
