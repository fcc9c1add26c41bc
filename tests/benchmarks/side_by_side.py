"""The current proxy against a baseline tree measured in the same run (``--compare REV``): the
``goals.vs_baseline`` object of ``results.json`` and its table in the report and the README.

Measures, each for both trees: added p50 (ms) at every non-streaming concurrency and the ratio of
the proxy's to the baseline's (per repetition, median); the added time to the first streamed event
at concurrency 1 (ms); CPU per request (ms) and its ratio at every point, streaming ones too (keys
``"16"`` and ``"16 stream"``; the goal: within 5% of before everywhere); the pipeline's warm CPU per
MB of history (ms/MB); storage bytes per unique message byte (worst trace).
"""

from __future__ import annotations

from typing import Any

CPU_GOAL_RATIO = 1.05
"""CPU per request of the proxy ÷ the baseline's, at every concurrency (issue 18 item 7)."""


def _proxy_and_baseline(point: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    cands = point["candidates"]
    if "proxy" not in cands or "baseline" not in cands:
        return None
    return cands["proxy"], cands["baseline"]


def goals(results: dict[str, Any]) -> dict[str, Any] | None:
    """``None`` without a baseline; else the comparison (keys in the module docstring) and
    ``cpu_within_goal`` (``None`` when the overhead section did not run)."""
    base = results.get("baseline")
    if not base:
        return None
    out: dict[str, Any] = {"label": base["label"], "added_p50_ms": {}, "added_p50_vs_baseline": {},
                           "cpu_ms_per_request": {}, "cpu_vs_baseline": {}, "added_ttfb_ms_at_1": None}
    for point in (results.get("overhead") or {}).get("points", []):
        pair = _proxy_and_baseline(point)
        if pair is None:
            continue
        proxy, baseline = pair
        c = str(point["concurrency"])
        key = c + (" stream" if point["stream"] else "")
        out["cpu_ms_per_request"][key] = {"proxy": proxy["cpu_ms_per_request"]["median"],
                                          "baseline": baseline["cpu_ms_per_request"]["median"]}
        out["cpu_vs_baseline"][key] = proxy["cpu_vs_baseline"]["median"]
        if not point["stream"]:
            out["added_p50_ms"][c] = {"proxy": proxy["added_p50_ms"]["median"], "baseline": baseline["added_p50_ms"]["median"]}
            out["added_p50_vs_baseline"][c] = proxy["added_p50_vs_baseline"]["median"]
        elif point["concurrency"] == 1:
            out["added_ttfb_ms_at_1"] = {"proxy": proxy["added_ttfb_p50_ms"]["median"],
                                         "baseline": baseline["added_ttfb_p50_ms"]["median"]}
    pipe, store = results.get("pipeline") or {}, results.get("storage") or {}
    if pipe and base.get("pipeline"):
        out["pipeline_ms_per_mb"] = {"proxy": pipe["ms_per_mb"], "baseline": base["pipeline"]["ms_per_mb"]}
    if store and base.get("storage"):
        out["storage_vs_unique_bytes_max"] = {"proxy": store["vs_unique_max"], "baseline": base["storage"]["vs_unique_max"]}
    ratios = out["cpu_vs_baseline"]
    out["cpu_within_goal"] = all(r <= CPU_GOAL_RATIO for r in ratios.values()) if ratios else None
    return out


def _pair(row: dict[str, float] | None, unit: str, digits: int = 2) -> tuple[str, str, str]:
    if row is None:
        return "–", "–", "–"
    p, b = row["proxy"], row["baseline"]
    ratio = f"{p / b:.2f}×" if b else "–"
    return f"{p:.{digits}f}{unit}", f"{b:.{digits}f}{unit}", ratio


def table(g: dict[str, Any]) -> list[str]:
    """Markdown: one row per measure, this tree against the baseline (``g``: ``goals()``)."""
    label = g["label"]
    lines = [f"| measure | this tree | {label} | this ÷ {label} |", "|---|---|---|---|"]
    for c in sorted(g["added_p50_ms"], key=int):
        now, before, _ = _pair(g["added_p50_ms"][c], " ms")
        lines.append(f"| added p50, concurrency {c} | {now} | {before} | {g['added_p50_vs_baseline'][c]:.2f}× |")
    now, before, ratio = _pair(g.get("added_ttfb_ms_at_1"), " ms")
    lines.append(f"| added time to the first streamed event, concurrency 1 | {now} | {before} | {ratio} |")
    for key in sorted(g["cpu_ms_per_request"], key=lambda k: (k.endswith("stream"), int(k.split()[0]))):
        now, before, _ = _pair(g["cpu_ms_per_request"][key], " ms", 3)
        c, streaming = key.split()[0], ", streaming" if key.endswith("stream") else ""
        lines.append(f"| CPU per request, concurrency {c}{streaming} (goal ≤ {CPU_GOAL_RATIO:g}×) | {now} | {before} | "
                     f"{g['cpu_vs_baseline'][key]:.3f}× |")
    now, before, ratio = _pair(g.get("pipeline_ms_per_mb"), " ms/MB")
    lines.append(f"| pipeline CPU per MB of history | {now} | {before} | {ratio} |")
    now, before, ratio = _pair(g.get("storage_vs_unique_bytes_max"), "×")
    lines.append(f"| storage ÷ unique message bytes (worst trace) | {now} | {before} | {ratio} |")
    verdict = {True: "met", False: "**not met**", None: "–"}[g.get("cpu_within_goal")]
    lines += ["", f"CPU per request within {CPU_GOAL_RATIO - 1:.0%} of {label} at every point: {verdict}. Ratios of "
              "latency and CPU are taken per repetition (the candidates interleaved), then the median."]
    return lines
