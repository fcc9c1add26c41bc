"""Pipeline cost against history length: the proxy's own CPU per request (issue 7, item 3).

The real app runs in-process (``inproc.InProcessProxy``) against an upstream that answers at once
(``httpx.MockTransport``), so ``time.process_time`` around a request is the proxy's work: parsing,
hashing, the log append, the projection and token counts, the reply and request records (plus
the in-process HTTP plumbing, measured alone as ``harness_ms`` and subtracted). Histories of
10..5,000 messages are real trace messages (``../shared/traces``) concatenated, each repeat made
unique. A client resends its whole history: each timed request is the previous one plus the
proxy's reply and one new user message. ``cold_ms`` is the first request of a session (every
message logged and counted once); ``warm_ms`` the median of the next ones (what is memoized must
not be redone); ``warm_mean_ms`` their mean (it carries the full garbage collections a median may
skip: each warm request allocates a whole parsed history and frees the previous one). The
compaction turn: the same history under a model whose window puts it just over the trigger (85%),
so that request plans and stores a summary (one summary call answered by the same fake).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

import httpx
import orjson

from tests.benchmarks import TRACES_DIR
from tests.benchmarks.config import BenchConfig
from tests.benchmarks.inproc import CLIENT_HEADERS, InProcessProxy, fixed_upstream
from tests.benchmarks.servers import COMPLETION
from tests.benchmarks.stats import spread

BIG_MODEL = "bench-big"
BIG_WINDOW_TOKENS = 1_000_000_000
"""A window no history reaches: requests under ``BIG_MODEL`` are never compacted."""
REPLY = orjson.loads(COMPLETION)["choices"][0]["message"]


def trace_messages() -> list[dict[str, Any]]:
    """Every shared trace's messages in file order, system messages after the first dropped."""
    out: list[dict[str, Any]] = []
    for path in sorted(TRACES_DIR.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                m = orjson.loads(line)
                if m.get("role") != "system" or not out:
                    out.append(m)
    return out


def build_history(n: int, pool: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """``n`` messages: the trace pool repeated; copies after the first get a ``[copy k]`` suffix."""
    pool = pool or trace_messages()
    out: list[dict[str, Any]] = []
    k = 0
    while len(out) < n:
        for m in pool[: n - len(out)]:
            if k and isinstance(m.get("content"), str):
                m = m | {"content": f"{m['content']} [copy {k}]"}
            out.append(m)
        k += 1
    return out


def turn_body(model: str, history: list[dict[str, Any]], k: int) -> tuple[bytes, list[dict[str, Any]]]:
    """Request ``k`` after ``history``: the history, then (reply, user) pairs 1..k."""
    messages = list(history)
    for i in range(1, k + 1):
        messages += [dict(REPLY), {"role": "user", "content": f"Go on with step {i}."}]
    return orjson.dumps({"model": model, "messages": messages}), messages


async def _timed(proxy: InProcessProxy, body: bytes, session: str) -> tuple[float, httpx.Response]:
    c0 = time.process_time()
    resp = await proxy.chat(body, session)
    return (time.process_time() - c0) * 1000, resp


async def harness_ms(body: bytes, reps: int = 5) -> float:
    """CPU ms of the in-process client + ASGI plumbing alone: an app that reads the body and answers."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": COMPLETION})

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://h") as client:
        times = []
        for _ in range(reps):
            c0 = time.process_time()
            (await client.post("/", content=body, headers=CLIENT_HEADERS)).read()
            times.append((time.process_time() - c0) * 1000)
    return statistics.median(times)


async def measure_size(n: int, cfg: BenchConfig, pool: list[dict[str, Any]]) -> dict[str, Any]:
    try:
        from proxy.tokens.counter import load_counter
    except ImportError:  # a baseline tree from before the layout by job (issue 18): tokens was a module
        from proxy.tokens import load_counter  # type: ignore[attr-defined,no-redef]

    history = build_history(n, pool)
    counter = load_counter(os.environ.get("TIKTOKEN_CACHE_DIR"))
    _, cmp_messages = turn_body(BIG_MODEL, history, 1)
    if hasattr(counter, "bind"):  # issue 18 item 1: the counter counts pieces bound to a codec
        from proxy.conversation.chat_codec import CHAT

        counter = counter.bind(CHAT)
    tokens = sum(counter.count_message(m) for m in cmp_messages) + 3 + 3  # + reply priming
    cmp_model = f"bench-cmp-{n}"
    windows = {BIG_MODEL: BIG_WINDOW_TOKENS, cmp_model: max(256, int(tokens / 0.85 * 0.95))}
    row: dict[str, Any] = {"messages": n, "tokens": tokens}
    async with InProcessProxy(fixed_upstream(), windows=windows, tune_gc=cfg.serve_gc_tuning) as proxy:
        body0, _ = turn_body(BIG_MODEL, history, 0)
        row["history_bytes"] = len(body0)
        row["cold_ms"], _ = await _timed(proxy, body0, f"pipe-{n}")
        warm = []
        for k in range(1, cfg.pipeline_requests + 1):
            body, _ = turn_body(BIG_MODEL, history, k)
            ms, resp = await _timed(proxy, body, f"pipe-{n}")
            assert resp.status_code == 200, resp.text
            assert resp.headers.get("x-context-proxy-defenses") == "none", resp.headers
            warm.append(ms)
        row["harness_ms"] = await harness_ms(body)
        row["warm"] = spread(warm)
        row["warm_ms"] = row["warm"]["median"] - row["harness_ms"]
        row["warm_mean_ms"] = statistics.fmean(warm) - row["harness_ms"]
        row["warm_ms_per_mb"] = row["warm_ms"] / (len(body) / 1e6)
        compaction = []
        for rep in range(cfg.pipeline_compaction_reps):
            session = f"cmp-{n}-{rep}"
            await proxy.chat(body0, session)  # the log, untimed
            body, _ = turn_body(cmp_model, history, 1)
            ms, resp = await _timed(proxy, body, session)
            assert resp.status_code == 200, resp.text
            row["compaction_defenses"] = resp.headers.get("x-context-proxy-defenses")
            compaction.append(ms - row["harness_ms"])
        row["compaction"] = spread(compaction)
        row["compaction_ms"] = row["compaction"]["median"]
        row["compaction_ms_per_mb"] = row["compaction_ms"] / (len(body) / 1e6)
    return row


def run(cfg: BenchConfig) -> dict[str, Any]:
    """``{"sizes": [row per size], "ms_per_mb", "marginal_ms_per_mb", "linearity"}`` (see module doc).

    ``ms_per_mb``: warm CPU ms per MB of the largest history (the goal's measure, fixed per-request
    costs included); ``marginal_ms_per_mb``: the slope between the two largest sizes;
    ``linearity``: their log-log slope (1.0 linear, below 1 fixed costs still matter, above 1 a
    worse-than-linear term)."""

    async def main() -> list[dict[str, Any]]:
        pool = trace_messages()
        rows = []
        for n in cfg.pipeline_sizes:
            row = await measure_size(n, cfg, pool)
            print(f"  pipeline {n} msgs ({row['history_bytes'] / 1e6:.2f} MB): warm {row['warm_ms']:.2f} ms "
                  f"({row['warm_ms_per_mb']:.2f} ms/MB; mean {row['warm_mean_ms']:.2f} ms), cold {row['cold_ms']:.1f} ms, "
                  f"compaction {row['compaction_ms']:.1f} ms [{row['compaction_defenses']}]", flush=True)
            rows.append(row)
        return rows

    rows = asyncio.run(main())
    largest = rows[-1]
    return {
        "sizes": rows,
        "ms_per_mb": largest["warm_ms_per_mb"],
        "ms_per_mb_note": f"warm request of the largest history ({largest['messages']} messages), per-request costs included",
        "marginal_ms_per_mb": _marginal(rows),
        "linearity": _slope(rows),
    }


def _marginal(rows: list[dict[str, Any]]) -> float | None:
    """Extra warm ms per extra MB between the two largest sizes (the per-byte cost alone)."""
    if len(rows) < 2:
        return None
    a, b = rows[-2], rows[-1]
    return (b["warm_ms"] - a["warm_ms"]) / ((b["history_bytes"] - a["history_bytes"]) / 1e6)


def _slope(rows: list[dict[str, Any]]) -> float | None:
    """Log-log slope of warm ms against history bytes between the two largest sizes (1.0 = linear)."""
    import math

    if len(rows) < 2:
        return None
    a, b = rows[-2], rows[-1]
    if a["warm_ms"] <= 0 or b["warm_ms"] <= 0:
        return None
    return math.log(b["warm_ms"] / a["warm_ms"]) / math.log(b["history_bytes"] / a["history_bytes"])
