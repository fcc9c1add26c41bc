"""Compression on the shared traces at 16k, 32k and 128k windows (issue 7, item 5).

Each trace is replayed through the real app in-process, turn by turn, against the strict fake
provider of ``tests.fakes`` (reached through ``httpx.ASGITransport``): it enforces the window,
answers with the trace's next assistant message, and summarizes deterministically (keeping
``FACT:`` lines). The proxy knows the window from a models file (``fake-<w>k-openai``).
Token counts are the fake provider's (``tests.fakes.tokens``), for the client's prompt and the
forwarded one alike. Reported per trace and window: prompt tokens forwarded against pass-through
(sum over turns), summary calls and their prompt tokens (so forwarded + summarization, the total
sent upstream, is visible), overflows without the proxy (turns whose client prompt exceeds the
window) and with it (overflow answers from the provider, and errors reaching the client), and
prefix stability: the mean share of each forwarded prompt's messages (JSON bytes) that repeats
the previous forwarded prompt byte for byte.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.benchmarks import REPO_DIR, TRACES_DIR, optional_python
from tests.benchmarks.config import BenchConfig
from tests.benchmarks.inproc import InProcessProxy
from tests.benchmarks.traces import load_trace, prefix_share, request_points

PLOT_TRACE = "mini-swe-agent__sqlfluff-1733__deepseek-chat"
"""The longest shared trace: its tokens per turn are plotted."""


class ClientTokens:
    """The fake provider's count of a client prompt, memoized per message (the history repeats)."""

    def __init__(self) -> None:
        from tests.fakes.tokens import TOKENS_PER_REPLY, count_message_tokens

        self._count, self._reply = count_message_tokens, TOKENS_PER_REPLY
        self._memo: dict[bytes, int] = {}

    def __call__(self, messages: list[dict[str, Any]]) -> int:
        total = self._reply
        for m in messages:
            key = orjson.dumps(m)
            if key not in self._memo:
                self._memo[key] = self._count(m)
            total += self._memo[key]
        return total


def select_traces(limit: int | None, name_filter: str | None = None) -> list[Path]:
    """All traces (whose name contains ``name_filter``), or ``limit`` of them spread over sizes
    from the largest (the plotted one) down."""
    paths = sorted(p for p in TRACES_DIR.glob("*.jsonl") if not name_filter or name_filter in p.name)
    if limit is None or limit >= len(paths):
        return paths
    by_size = sorted(paths, key=lambda p: p.stat().st_size, reverse=True)
    step = max(1, len(by_size) // limit)
    return by_size[::step][:limit]


async def replay(path: Path, window: int, counter: ClientTokens) -> dict[str, Any]:
    """One trace at one window; the row of the compression table (plus ``per_turn``)."""
    from tests.fakes.upstream import create_fake_upstream

    trace = load_trace(path)
    app, state = create_fake_upstream()
    model = f"fake-{window // 1024}k-openai"
    client_tokens: list[int] = []
    errors = 0
    async with InProcessProxy(httpx.ASGITransport(app=app), windows={model: window}) as proxy:
        for i in request_points(trace):
            state.script.append({k: v for k, v in trace[i].items() if k in ("content", "tool_calls")})
            messages = trace[:i]
            client_tokens.append(counter(messages))
            before = len(state.requests)
            resp = await proxy.chat({"model": model, "messages": messages}, f"cmp-{window}")
            if resp.status_code != 200:
                errors += 1
            for r in state.requests[before:]:
                r.turn = len(client_tokens) - 1  # type: ignore[attr-defined]
    forwarded = [r for r in state.chat_requests if not r.is_summary]
    ok = [r for r in forwarded if r.outcome == "ok"]
    summaries = [r for r in state.chat_requests if r.is_summary]
    per_turn_fwd = [0] * len(client_tokens)
    for r in ok:
        per_turn_fwd[r.turn] = r.prompt_tokens or 0
    bodies = [orjson.dumps(r.json["messages"]) for r in ok]
    shares = [prefix_share(a, b) for a, b in itertools.pairwise(bodies)]
    passthrough = sum(client_tokens)
    fwd = sum(r.prompt_tokens or 0 for r in ok)
    summary_tokens = sum(r.prompt_tokens or 0 for r in summaries)
    return {
        "trace": path.stem, "window": window, "turns": len(client_tokens),
        "passthrough_tokens": passthrough, "forwarded_tokens": fwd,
        "forwarded_ratio": fwd / passthrough if passthrough else None,
        "summary_calls": len(summaries), "summary_prompt_tokens": summary_tokens,
        "upstream_total_tokens": fwd + summary_tokens,
        "upstream_total_ratio": (fwd + summary_tokens) / passthrough if passthrough else None,
        "overflows_without": sum(t > window for t in client_tokens),
        "overflow_answers_with": sum(r.outcome == "overflow" for r in forwarded),
        "client_errors_with": errors,
        "prefix_stability": sum(shares) / len(shares) if shares else None,
        "per_turn": {"client": client_tokens, "forwarded": per_turn_fwd},
    }


DEEPAGENTS_PYTHON_ENV = "CONTEXT_PROXY_BENCH_DEEPAGENTS_PYTHON"
"""A Python with ``deepagents`` installed, when the test environment has none (it brings
LangChain and LangGraph: a virtual environment of its own keeps the tests' versions)."""


def deepagents_python() -> str | None:
    """This interpreter if it has ``deepagents``, else the one ``CONTEXT_PROXY_BENCH_DEEPAGENTS_PYTHON``
    names if that has it; ``None``: the comparison is not run."""
    return optional_python("deepagents", DEEPAGENTS_PYTHON_ENV)


def deepagents_rows(paths: list[Path], windows: tuple[int, ...]) -> dict[str, Any]:
    """``{"status", "version", "rows"}``: the traces through Deep Agents' middleware
    (``tests.benchmarks.deepagents_compare``, in a process of its own), or why not."""
    python = deepagents_python()
    if python is None:
        return {"status": f"not installed (optional: `pip install deepagents` in the test environment, or set "
                          f"{DEEPAGENTS_PYTHON_ENV} to a Python that has it)", "version": None, "rows": []}
    job = orjson.dumps({"traces": [str(p) for p in paths], "windows": list(windows)})
    done = subprocess.run([python, "-m", "tests.benchmarks.deepagents_compare"], input=job, capture_output=True,
                          cwd=REPO_DIR, check=False)
    if done.returncode != 0:
        return {"status": "failed: " + done.stderr.decode(errors="replace").strip().splitlines()[-1][:300],
                "version": None, "rows": []}
    out = orjson.loads(done.stdout)
    return {"status": f"deepagents {out['version']}", "version": out["version"], "rows": out["rows"]}


def run(cfg: BenchConfig) -> dict[str, Any]:
    """``{"rows": [...], "deepagents": status, "plot": {...}}``."""

    async def main() -> list[dict[str, Any]]:
        counter = ClientTokens()
        rows = []
        for path in select_traces(cfg.compression_traces, cfg.trace_filter):
            for window in cfg.windows:
                row = await replay(path, window, counter)
                rows.append(row)
                print(f"  compression {path.stem[:44]} @{window // 1024}k: {row['forwarded_ratio']:.2f}x tokens, "
                      f"{row['summary_calls']} summaries, overflows {row['overflows_without']} -> "
                      f"{row['overflow_answers_with']}/{row['client_errors_with']}, "
                      f"stability {row['prefix_stability'] or 0:.3f}", flush=True)
        return rows

    rows = asyncio.run(main())
    deep = deepagents_rows(select_traces(cfg.compression_traces, cfg.trace_filter), cfg.windows)
    for r in deep["rows"]:
        print(f"  deepagents ({r['counter']} counter) {r['trace'][:44]} @{r['window'] // 1024}k: {r['forwarded_ratio']:.2f}x tokens, "
              f"{r['summary_calls']} summaries, overflows {r['overflows_without']} -> {r['overflows_with']}, "
              f"stability {r['prefix_stability'] or 0:.3f}", flush=True)
    plot_rows = [r for r in rows if r["trace"] == PLOT_TRACE] or rows[:1]
    plot = None
    if plot_rows:
        chosen = min(plot_rows, key=lambda r: r["window"] if r["window"] >= 32_768 else 1 << 40)
        plot = {"trace": chosen["trace"], "window": chosen["window"], **chosen["per_turn"]}
        twin = [r for r in deep["rows"] if r["trace"] == chosen["trace"] and r["window"] == chosen["window"]
                and r["counter"] == "default"]
        if twin:
            plot["deepagents"] = twin[0]["per_turn_forwarded"]
    for r in [*rows, *deep["rows"]]:
        r.pop("per_turn", None)
        r.pop("per_turn_forwarded", None)
    return {"rows": rows, "deepagents": deep["status"], "deepagents_rows": deep["rows"], "plot": plot}
