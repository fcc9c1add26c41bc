"""Writing a run: ``results.json``, ``report.md``, the PNG plots and the README's Performance section."""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
from pathlib import Path
from typing import Any

import orjson

from tests.benchmarks import peer_table, peers
from tests.benchmarks.overhead import FLOOR_NOISE_MS
from tests.benchmarks.plots import plots

README_START, README_END = "<!-- perf:start -->", "<!-- perf:end -->"
PIPELINE_GOAL_MS_PER_MB = 2.0
"""Warm CPU per MB of history (issue 21; issue 7 had 5)."""
FLOOR_GOAL_RATIO = 2.0
"""Added p50 ÷ the floor's at every concurrency (issue 21; issue 7 had 3)."""
CPU_FLOOR_GOAL_RATIO = 2.0
"""CPU per request ÷ the floor's at every concurrency (issue 21)."""
TTFB_GOAL_MS = 1.0
STORAGE_GOAL_RATIO = 1.2


def machine() -> dict[str, Any]:
    """nproc, the CPU model (``/proc/cpuinfo``), Python, and the date of the run (UTC)."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": len(os.sched_getaffinity(0)), "cpu_model": model, "python": platform.python_version(),
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")}


def _overhead_goals(ov: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, bool | None]]:
    """One overhead section's goals (keys fixed by issues 7 and 21) and their verdicts."""
    from tests.benchmarks import overhead, peer_goals

    g = overhead.goals(ov) if ov else {}
    out: dict[str, Any] = {
        "added_latency_vs_floor": g.get("added_latency_vs_floor") or None,
        "added_latency_vs_litellm": g.get("added_latency_vs_litellm") or None,
        "added_p99_vs_floor": g.get("added_p99_vs_floor") or None,
        "added_ttfb_ms_at_1": g.get("added_ttfb_ms_at_1"),
        "cpu_vs_floor": g.get("cpu_vs_floor") or None,
        "floor_added_p50_ms": g.get("floor_added_p50_ms") or None,
        "messages_added_latency_vs_floor": g.get("messages_added_latency_vs_floor") or None,
        "peers": peer_goals.goals(ov),
        "overhead_measured": bool(ov),
    }
    verdicts: dict[str, bool | None] = {}
    if out["added_latency_vs_floor"]:  # an undefined ratio (None) cannot show the goal met
        verdicts["added_latency_vs_floor"] = all(r is not None and r <= FLOOR_GOAL_RATIO
                                                 for r in out["added_latency_vs_floor"].values())
    if out["messages_added_latency_vs_floor"]:
        verdicts["messages_added_latency_vs_floor"] = all(
            r is not None and r <= FLOOR_GOAL_RATIO for r in out["messages_added_latency_vs_floor"].values())
    if out["cpu_vs_floor"]:
        verdicts["cpu_vs_floor"] = all(r <= CPU_FLOOR_GOAL_RATIO for r in out["cpu_vs_floor"].values())
    if out["added_ttfb_ms_at_1"] is not None:
        verdicts["added_ttfb_ms_at_1"] = out["added_ttfb_ms_at_1"] <= TTFB_GOAL_MS
    verdicts.update(peer_goals.verdicts(out["peers"]))
    return out, verdicts


def goals(results: dict[str, Any]) -> dict[str, Any]:
    """The ``goals`` object of ``results.json`` (keys fixed by issues 7 and 21), plus the verdicts
    (``met``; the crowded mode's prefixed ``crowded.``). ``crowded``: the same overhead goals
    measured in crowded mode (``None`` when it did not run)."""
    from tests.benchmarks import peer_goals

    pipe, store = results.get("pipeline") or {}, results.get("storage") or {}
    out, verdicts = _overhead_goals(results.get("overhead"))
    out |= {"pipeline_ms_per_mb": pipe.get("ms_per_mb"), "storage_vs_unique_bytes_max": store.get("vs_unique_max"),
            "pipeline_linearity_slope": pipe.get("linearity"), "crowded": None}
    if results.get("overhead_crowded"):
        out["crowded"], crowded = _overhead_goals(results["overhead_crowded"])
        verdicts |= {f"crowded.{k}": v for k, v in crowded.items()}
        out["crowded"]["met"] = crowded
    out["crowded_vs_quiet"] = peer_goals.crowded_vs_quiet(results.get("overhead"), results.get("overhead_crowded"))
    if out["pipeline_ms_per_mb"] is not None:
        verdicts["pipeline_ms_per_mb"] = out["pipeline_ms_per_mb"] <= PIPELINE_GOAL_MS_PER_MB
    if out["storage_vs_unique_bytes_max"] is not None:
        verdicts["storage_vs_unique_bytes_max"] = out["storage_vs_unique_bytes_max"] <= STORAGE_GOAL_RATIO
    ins = results.get("instructions") or {}
    out["instructions_vs_floor"] = ins.get("proxy_vs_floor")
    if out["instructions_vs_floor"] is not None:
        verdicts["instructions_vs_floor"] = out["instructions_vs_floor"] <= CPU_FLOOR_GOAL_RATIO
    turn = results.get("compaction_turn")
    out["compaction_turn"] = {k: turn[k] for k in ("normal_ms", "compaction_ms", "stall_ms", "summary_delay_s")} if turn else None
    from tests.benchmarks import side_by_side

    out["vs_baseline"] = side_by_side.goals(results)
    if out["vs_baseline"] is not None and out["vs_baseline"]["cpu_within_goal"] is not None:
        verdicts["cpu_vs_baseline"] = out["vs_baseline"]["cpu_within_goal"]
    out["met"] = verdicts
    return out


def _ms(s: dict[str, float], digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def overhead_tables(ov: dict[str, Any], title: str = "Overhead (pass-through)") -> list[str]:
    crowd = ov.get("crowd") or []
    lines = [f"## {title}", "",
             "Added latency = candidate − direct, same repetition; median (min–max) over repetitions. "
             "CPU per request: the candidate's process (for *direct*: the upstream's). "
             f"{peers.status_note(ov)} Servers up on the candidate core: {ov.get('servers_on_candidate_core', '–')}"
             + (f" (idle bystanders: {', '.join(crowd)})." if crowd else "."), ""]
    if ov.get("idle"):
        lines += ["Idle, before the points (nothing sent): " + "; ".join(
            f"{k} {v['cpu_ms_per_s']:.2f} ms CPU/s, {v['wakeups_per_s']:.1f} wake-ups/s" for k, v in ov["idle"].items()) + ".", ""]
    for point in [*ov["points"], *(ov.get("history_points") or []), *(ov.get("messages_points") or [])]:
        mode = "streaming" if point["stream"] else "non-streaming"
        api = "" if point.get("api", "chat") == "chat" else "Messages (`POST /v1/messages`), "
        api += f"{point['history_bytes'] // 1000} KB history, " if "history_bytes" in point else ""
        lines += [f"### {api}concurrency {point['concurrency']}, {mode} ({point['requests']} requests × {point['reps']} reps)",
                  "",
                  "| candidate | requests/s | added p50 ms | added p99 ms | added TTFB p50 ms | CPU ms/request | added p50 ÷ floor |",
                  "|---|---|---|---|---|---|---|"]
        floor = point["candidates"].get("floor")
        # a floor adding less than the noise (the direct run saturated first): a ratio over it is undefined
        defined = floor is not None and floor["added_p50_ms"]["median"] >= FLOOR_NOISE_MS
        for kind, c in point["candidates"].items():
            ratio = _ms(c["added_p50_vs_floor"], 1) if "added_p50_vs_floor" in c and defined else "–"
            n = c.get("requests", point["requests"])
            name = kind if n == point["requests"] else f"{kind} ({n} requests)"
            lines.append(f"| {name} | {c['rps']['median']:.0f} | {_ms(c['added_p50_ms'])} | {_ms(c['added_p99_ms'])} | "
                         f"{_ms(c['added_ttfb_p50_ms'])} | {c['cpu_ms_per_request']['median']:.2f} | {ratio} |")
        lines.append("")
    return lines


def pipeline_table(pipe: dict[str, Any]) -> list[str]:
    lines = ["## Pipeline CPU per request against history length", "",
             "In-process; harness (client + ASGI plumbing) subtracted. Warm: median (min–max) of the requests after the "
             f"first. ms/MB goal ≤ {PIPELINE_GOAL_MS_PER_MB:g}: {pipe['ms_per_mb']:.1f} ({pipe['ms_per_mb_note']}); "
             f"marginal cost between the two largest sizes {pipe.get('marginal_ms_per_mb') or float('nan'):.1f} ms/MB; "
             f"log-log slope {pipe.get('linearity') or float('nan'):.2f} (1.0 = linear).", "",
             "| messages | history MB | tokens | cold ms | warm ms | warm ms/MB | compaction turn ms | compaction ms/MB | defenses |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in pipe["sizes"]:
        lines.append(f"| {r['messages']} | {r['history_bytes'] / 1e6:.2f} | {r['tokens']} | {r['cold_ms']:.1f} | "
                     f"{r['warm_ms']:.2f} ({r['warm']['min'] - r['harness_ms']:.2f}–{r['warm']['max'] - r['harness_ms']:.2f}) | "
                     f"{r['warm_ms_per_mb']:.2f} | {_ms(r['compaction'], 1)} | {r['compaction_ms_per_mb']:.1f} | {r['compaction_defenses']} |")
    return [*lines, ""]


def storage_table(st: dict[str, Any]) -> list[str]:
    lines = ["## Storage growth", "",
             f"Row bytes: SQLite's payload of the tables (the goal's measure, ≤ {STORAGE_GOAL_RATIO}× the unique messages); "
             f"file: VACUUMed file minus an empty database ({st['empty_db_bytes'] / 1e3:.0f} kB); naive: every request body stored.", "",
             "| trace | messages | requests | unique kB | rows kB (×) | file kB (×) | naive log kB (×) |", "|---|---|---|---|---|---|---|"]
    for r in st["traces"]:
        rows = f"{r['row_bytes'] / 1e3:.0f} ({r['rows_vs_unique']:.2f}×)" if r["row_bytes"] is not None else "–"
        lines.append(f"| {r['trace']} | {r['messages']} | {r['requests']} | {r['unique_message_bytes'] / 1e3:.0f} | {rows} | "
                     f"{r['db_bytes'] / 1e3:.0f} ({r['file_vs_unique']:.2f}×) | {r['naive_log_bytes'] / 1e3:.0f} "
                     f"({r['naive_log_bytes'] / r['unique_message_bytes']:.1f}×) |")
    return [*lines, ""]


def compression_table(cp: dict[str, Any]) -> list[str]:
    lines = ["## Compression on real traces", "",
             "Prompt tokens summed over turns (the fake provider's count). Total = forwarded + summary prompts. "
             f"Overflows: turns over the window without the proxy → overflow answers / client errors with it. "
             f"Deep Agents' middleware: {cp['deepagents']}.", "",
             "| trace | window | turns | pass-through tokens | forwarded (×) | summary calls | summary tokens | total (×) | overflows without → with | prefix stability |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in cp["rows"]:
        stab = f"{r['prefix_stability']:.3f}" if r["prefix_stability"] is not None else "–"
        lines.append(f"| {r['trace']} | {r['window'] // 1024}k | {r['turns']} | {r['passthrough_tokens']} | "
                     f"{r['forwarded_tokens']} ({r['forwarded_ratio']:.2f}) | {r['summary_calls']} | {r['summary_prompt_tokens']} | "
                     f"{r['upstream_total_tokens']} ({r['upstream_total_ratio']:.2f}) | {r['overflows_without']} → "
                     f"{r['overflow_answers_with']}/{r['client_errors_with']} | {stab} |")
    deep_rows = cp.get("deepagents_rows") or []
    deep = {(r["trace"], r["window"]): r for r in deep_rows if r.get("counter", "default") == "default"}
    if deep:
        lines += ["", "### The same sessions through Deep Agents' summarization middleware", "",
                  "Each request of the trace through `create_summarization_middleware` (its defaults from the model "
                  "profile, the window as `max_input_tokens`), with the same deterministic summarizer as the fake "
                  "provider; overflows *with* are forwarded prompts over the window. Tokens forwarded ÷ pass-through, "
                  "Deep Agents against the proxy (same run, same counter; converting to LangChain messages and back "
                  "moves the count by about 1%: 1.01 where nothing is summarized).", "",
                  "| trace | window | forwarded × (Deep Agents) | forwarded × (proxy) | summary calls (DA / proxy) | "
                  "total × (DA / proxy) | overflows without → with (DA) | prefix stability (DA / proxy) |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in cp["rows"]:
            d = deep.get((r["trace"], r["window"]))
            if d is None:
                continue
            dstab = f"{d['prefix_stability']:.3f}" if d["prefix_stability"] is not None else "–"
            stab = f"{r['prefix_stability']:.3f}" if r["prefix_stability"] is not None else "–"
            lines.append(f"| {r['trace']} | {r['window'] // 1024}k | {d['forwarded_ratio']:.2f} | {r['forwarded_ratio']:.2f} | "
                         f"{d['summary_calls']} / {r['summary_calls']} | {d['upstream_total_ratio']:.2f} / "
                         f"{r['upstream_total_ratio']:.2f} | {d['overflows_without']} → {d['overflows_with']} | "
                         f"{dstab} / {stab} |")
        lines += deepagents_totals(cp["rows"], deep_rows)
    return [*lines, ""]


def deepagents_totals(rows: list[dict[str, Any]], deep_rows: list[dict[str, Any]]) -> list[str]:
    """Per window, over every trace: the proxy against Deep Agents with its own token counter and
    with the proxy's (so that counting is not what differs)."""
    lines = ["", "Over every trace, per window (sums; Deep Agents with its own approximate counter, and with "
                 "the proxy's counter):", "",
             "| window | candidate | forwarded ÷ pass-through | with summary prompts | summary calls | prompts over the window |",
             "|---|---|---|---|---|---|"]
    for window in sorted({r["window"] for r in rows}):
        ours = [r for r in rows if r["window"] == window]
        candidates = [("proxy", ours, "overflow_answers_with")]
        for counter, name in (("default", "Deep Agents (own counter)"), ("proxy", "Deep Agents (proxy's counter)")):
            theirs = [r for r in deep_rows if r["window"] == window and r.get("counter", "default") == counter]
            if theirs:
                candidates.append((name, theirs, "overflows_with"))
        for name, group, over in candidates:
            passthrough = sum(r["passthrough_tokens"] for r in group)
            forwarded = sum(r["forwarded_tokens"] for r in group)
            summaries = sum(r["summary_prompt_tokens"] for r in group)
            lines.append(f"| {window // 1024}k | {name} | {forwarded / passthrough:.3f} | "
                         f"{(forwarded + summaries) / passthrough:.3f} | {sum(r['summary_calls'] for r in group)} | "
                         f"{sum(r[over] for r in group)} |")
    return lines


def _mode_rows(g: dict[str, Any], met: dict[str, bool | None], mode: str) -> list[str]:
    """The overhead section's goal rows of one mode (``mode``: a prefix for the goal's text)."""
    from tests.benchmarks import peer_goals

    def verdict(key: str) -> str:
        return {True: "met", False: "**not met**", None: "–"}[met.get(key)]

    floor = g["added_latency_vs_floor"]
    floor_ms = g.get("floor_added_p50_ms") or {}
    lines: list[str] = []
    if floor:
        cells = " / ".join(f"{floor[k]:.1f}×" if floor[k] is not None else f"undefined (floor +{floor_ms.get(k, 0):.2f} ms)"
                           for k in sorted(floor, key=int))
        lines.append(f"| {mode}added p50 ≤ {FLOOR_GOAL_RATIO:g}× the floor's (concurrency {' / '.join(sorted(floor, key=int))}) | "
                     f"{cells} | {verdict('added_latency_vs_floor')} |")
    cpu = g.get("cpu_vs_floor")
    if cpu:
        cells = " / ".join(f"{cpu[k]:.1f}×" for k in sorted(cpu, key=int))
        lines.append(f"| {mode}CPU per request ≤ {CPU_FLOOR_GOAL_RATIO:g}× the floor's, same concurrencies | {cells} | "
                     f"{verdict('cpu_vs_floor')} |")
    if g["added_ttfb_ms_at_1"] is not None:
        lines.append(f"| {mode}≤ {TTFB_GOAL_MS:g} ms added before the first streamed event (concurrency 1) | "
                     f"{g['added_ttfb_ms_at_1']:.2f} ms | {verdict('added_ttfb_ms_at_1')} |")
    lines += peer_goals.rows(g.get("peers") or {}, mode.rstrip(": ") or "quiet")
    messages = g.get("messages_added_latency_vs_floor")
    if messages:
        cells = " / ".join(f"{messages[k]:.1f}×" if messages[k] is not None else "undefined"
                           for k in sorted(messages, key=int))
        lines.append(f"| {mode}Messages (`POST /v1/messages`, logged): added p50 ≤ {FLOOR_GOAL_RATIO:g}× the floor's "
                     f"(concurrency {' / '.join(sorted(messages, key=int))}) | {cells} | "
                     f"{verdict('messages_added_latency_vs_floor')} |")
    p99 = g.get("added_p99_vs_floor")
    if p99:
        cells = " / ".join(f"{p99[k]:.1f}×" for k in sorted(p99, key=int))
        lines.append(f"| (shown, no goal) {mode}added p99 ÷ the floor's, same concurrencies | {cells} | – |")
    vs = g["added_latency_vs_litellm"]
    lines.append(f"| (shown, no goal) {mode}proxy's added p50 ÷ LiteLLM's, same concurrencies | "
                 + ("not measured (LiteLLM not installed)" if vs is None else " / ".join(f"{vs[c]:.3f}×" for c in sorted(vs, key=int)))
                 + " | – |")
    return lines


def goals_table(g: dict[str, Any]) -> list[str]:
    """The goals as a Markdown table: the quiet mode's overhead rows, the crowded mode's, then the
    in-process sections' (``g``: ``goals()``)."""
    from tests.benchmarks import peer_goals
    from tests.benchmarks.overhead import FLOOR_NOISE_MS

    met = g["met"]

    def verdict(key: str) -> str:
        return {True: "met", False: "**not met**", None: "–"}[met.get(key)]

    crowded = g.get("crowded")
    lines = ["| goal | measured | verdict |", "|---|---|---|"]
    if g.get("overhead_measured", True):
        lines += _mode_rows(g, met, "quiet: " if crowded else "")
    if crowded:
        lines += _mode_rows(crowded, crowded["met"], "crowded: ")
        lines += peer_goals.crowd_rows(g.get("crowded_vs_quiet"))
    if g["pipeline_ms_per_mb"] is not None:
        lines.append(f"| pipeline ≤ {PIPELINE_GOAL_MS_PER_MB:g} ms per MB of history | {g['pipeline_ms_per_mb']:.1f} ms/MB | "
                     f"{verdict('pipeline_ms_per_mb')} |")
    if g["storage_vs_unique_bytes_max"] is not None:
        lines.append(f"| storage ≤ {STORAGE_GOAL_RATIO:g}× the unique messages (worst trace) | "
                     f"{g['storage_vs_unique_bytes_max']:.2f}× | {verdict('storage_vs_unique_bytes_max')} |")
    if g.get("instructions_vs_floor") is not None:
        lines.append(f"| instructions per request ≤ {CPU_FLOOR_GOAL_RATIO:g}× the floor's (callgrind, concurrency 16; "
                     f"load-independent) | {g['instructions_vs_floor']:.2f}× | {verdict('instructions_vs_floor')} |")
    turn = g.get("compaction_turn")
    if turn:
        lines.append(f"| (shown, no goal) a turn that compacts against a normal turn (summarizer answering after "
                     f"{turn['summary_delay_s']:g} s) | {turn['compaction_ms']:.0f} vs {turn['normal_ms']:.1f} ms "
                     f"(stall {turn['stall_ms']:.0f} ms) | – |")
    floor = g["added_latency_vs_floor"]
    if floor and any(v is None for v in floor.values()):
        lines += ["", "*Undefined*: at that concurrency the floor's added p50 is under "
                  f"{FLOOR_NOISE_MS:g} ms, within this machine's noise (the load generator's core saturated before "
                  "the floor's, so a relay that parses nothing added no measurable latency); the ratio cannot be "
                  "computed and the goal is not counted as met. The proxy's added latency there is its CPU per "
                  "request (row above) queueing at saturation."]
    return lines


def _side_by_side(g: dict[str, Any]) -> list[str]:
    """The comparison with the baseline tree, when one was measured (``side_by_side.table``)."""
    from tests.benchmarks import side_by_side

    vs = g.get("vs_baseline")
    if not vs:
        return []
    return [f"### Side by side with {vs['label']} (same run)", "", *side_by_side.table(vs), ""]


def readme_section(results: dict[str, Any], out: Path, readme: Path, command: str) -> str:
    """The README's Performance section (between the markers): machine, date, goals, plots."""
    m = results["machine"]
    try:
        rel = os.path.relpath(out, readme.parent)
    except ValueError:
        rel = str(out)
    lines = ["## Performance", "",
             f"Measured by `{command}` on {m['date']}: {m['nproc']} cores ({m['cpu_model']}), Python {m['python']}. "
             "Every comparison is a ratio within one run, candidates interleaved, median of repetitions; "
             f"full tables in [{rel}/report.md]({rel}/report.md).", "",
             *goals_table(results["goals"]), "", *peer_table.tables(results), *_side_by_side(results["goals"])]
    lines += ["The load generator and the fake upstream share one core (raw HTTP/1.1 on asyncio protocols, far "
              "cheaper than any candidate); the candidate has the other. *Floor*: a raw ASGI relay on aiohttp's client "
              "that parses nothing. *Quiet*: the candidate measured has its core to itself (the other candidates' "
              "servers are paused meanwhile). *Crowded*: all candidates' servers up, and idle bystanders of their "
              f"kinds, beside the one measured on the candidate core. {peers.install_note()} Likewise Deep Agents' "
              "summarization middleware on the same traces: a Python with `deepagents`, named by "
              "`CONTEXT_PROXY_BENCH_DEEPAGENTS_PYTHON`.", ""]
    lines += [f"![{name}]({rel}/{name})" for name in results.get("plots", [])]
    return "\n".join(lines).rstrip() + "\n"


def update_readme(readme: Path, section: str) -> bool:
    """Replace the text between ``README_START`` and ``README_END``; False if the markers are absent."""
    if not readme.is_file():
        return False
    text = readme.read_text()
    pattern = re.compile(re.escape(README_START) + r".*?" + re.escape(README_END), re.DOTALL)
    if not pattern.search(text):
        return False
    readme.write_text(pattern.sub(lambda _m: f"{README_START}\n{section}{README_END}", text, count=1))
    return True


def write(results: dict[str, Any], out: Path, readme: Path, command: str) -> None:
    """Write ``results.json``, the plots, ``report.md``, ``README_perf.md`` and the README section."""
    out.mkdir(parents=True, exist_ok=True)
    results["goals"] = goals(results)
    results["plots"] = plots(results, out, PIPELINE_GOAL_MS_PER_MB)
    lines = [f"# Benchmarks ({'quick' if results['config']['quick'] else 'full'})", "",
             f"Machine: {results['machine']['nproc']} cores, {results['machine']['cpu_model']}; "
             f"Python {results['machine']['python']}; {results['machine']['date']}. Command: `{command}`.", "",
             "## Goals", "", *goals_table(results["goals"]), "", *peer_table.tables(results),
             *_side_by_side(results["goals"])]
    if results.get("overhead"):
        lines += overhead_tables(results["overhead"], "Overhead (pass-through), quiet" if results.get("overhead_crowded")
                                 else "Overhead (pass-through)")
    if results.get("overhead_crowded"):
        lines += overhead_tables(results["overhead_crowded"], "Overhead (pass-through), crowded")
    if results.get("instructions"):
        from tests.benchmarks import instructions

        lines += instructions.table(results["instructions"])
    if results.get("compaction_turn"):
        from tests.benchmarks import compaction_turn

        lines += compaction_turn.table(results["compaction_turn"])
    if results.get("pipeline"):
        lines += pipeline_table(results["pipeline"])
    if results.get("storage"):
        lines += storage_table(results["storage"])
    if results.get("compression"):
        lines += compression_table(results["compression"])
    lines += [f"![{name}]({name})" for name in results["plots"]]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    section = readme_section(results, out, readme, command)
    (out / "README_perf.md").write_text(section)
    results["readme_updated"] = update_readme(readme, section)
