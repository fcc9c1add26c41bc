"""A turn that compacts against a normal turn, with a summarizer that takes its time (issue 21, item 5).

The real app in-process (``inproc.InProcessProxy``) in front of an upstream that answers the
client's requests at once and a summary request (the proxy's, recognized as the strict fake
recognizes it: "summarize the conversation" in its last user text or a system message) after
``BenchConfig.summary_delay_s`` seconds, as a provider writing a 2,000-token summary does.
Wall-clock latency of the client's request, from before it is sent to the last byte of the answer
(the log writes it leaves behind are waited for after, untimed):

- ``normal_ms``: median of ``BenchConfig.compaction_turn_normal`` requests of the same history
  under a window no history reaches (nothing to compact);
- ``compaction_ms``: median of ``BenchConfig.pipeline_compaction_reps`` first turns over the
  trigger (85% of the window) of a new session whose log holds the history: the proxy summarizes
  before it forwards, so the client waits for the summary;
- ``stall_ms``: the difference; ``summary_calls``: summary requests the upstream saw per
  compacting turn.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

import httpx
import orjson

from tests.benchmarks.config import BenchConfig
from tests.benchmarks.inproc import CLIENT_HEADERS, InProcessProxy
from tests.benchmarks.servers import COMPLETION
from tests.fakes.responders import is_summary_request

SUMMARY_PHRASE = "summarize the conversation"
HISTORY_MESSAGES = 200
"""Messages of the history (real trace messages, ``pipeline.build_history``)."""


class DelayedSummaries(httpx.AsyncBaseTransport):
    """The upstream: ``servers.COMPLETION`` to every request, after ``delay_s`` for a summary
    request; ``summary_calls`` counts those."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.summary_calls = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = orjson.loads(await request.aread())
        if is_summary_request(body.get("messages"), SUMMARY_PHRASE):
            self.summary_calls += 1
            await asyncio.sleep(self.delay_s)
        return httpx.Response(200, content=COMPLETION, headers={"content-type": "application/json"})


async def _timed(proxy: InProcessProxy, body: bytes, session: str) -> tuple[float, httpx.Response]:
    t0 = time.perf_counter()
    resp = await proxy.client.post("/v1/chat/completions", content=body,
                                   headers=CLIENT_HEADERS | {"x-session-id": session})
    ms = (time.perf_counter() - t0) * 1000
    await proxy.pipeline.writer.drain()
    assert resp.status_code == 200, resp.text
    return ms, resp


async def measure(cfg: BenchConfig) -> dict[str, Any]:
    from proxy.conversation.chat_codec import CHAT
    from proxy.tokens.counter import load_counter
    from tests.benchmarks.pipeline import BIG_MODEL, BIG_WINDOW_TOKENS, build_history, turn_body

    history = build_history(HISTORY_MESSAGES)
    counter = load_counter(os.environ.get("TIKTOKEN_CACHE_DIR")).bind(CHAT)
    _, messages = turn_body(BIG_MODEL, history, 1)
    tokens = sum(counter.count_message(m) for m in messages) + 6
    cmp_model = "bench-compacting"
    windows = {BIG_MODEL: BIG_WINDOW_TOKENS, cmp_model: max(256, int(tokens / 0.85 * 0.95))}
    upstream = DelayedSummaries(cfg.summary_delay_s)
    body0, _ = turn_body(BIG_MODEL, history, 0)
    async with InProcessProxy(upstream, windows=windows, tune_gc=cfg.serve_gc_tuning) as proxy:
        await _timed(proxy, body0, "normal")
        normal = []
        for k in range(1, cfg.compaction_turn_normal + 1):
            ms, resp = await _timed(proxy, turn_body(BIG_MODEL, history, k)[0], "normal")
            assert resp.headers.get("x-context-proxy-defenses") == "none", resp.headers
            normal.append(ms)
        assert upstream.summary_calls == 0
        compaction, defenses = [], ""
        for rep in range(cfg.pipeline_compaction_reps):
            await _timed(proxy, body0, f"compacting-{rep}")  # the log, untimed
            ms, resp = await _timed(proxy, turn_body(cmp_model, history, 1)[0], f"compacting-{rep}")
            defenses = resp.headers.get("x-context-proxy-defenses", "")
            compaction.append(ms)
    normal_ms, compaction_ms = statistics.median(normal), statistics.median(compaction)
    return {"summary_delay_s": cfg.summary_delay_s, "history_messages": HISTORY_MESSAGES, "history_bytes": len(body0),
            "normal_ms": normal_ms, "normal": normal, "compaction_ms": compaction_ms, "compaction": compaction,
            "stall_ms": compaction_ms - normal_ms, "defenses": defenses,
            "summary_calls": upstream.summary_calls / max(1, cfg.pipeline_compaction_reps)}


def run(cfg: BenchConfig) -> dict[str, Any]:
    """The section's result (keys in the module docstring)."""
    result = asyncio.run(measure(cfg))
    print(f"  compaction turn: {result['compaction_ms']:.0f} ms against a normal turn's {result['normal_ms']:.1f} ms "
          f"(summarizer {result['summary_delay_s']:g} s; {result['summary_calls']:g} summary calls; "
          f"{result['defenses']})", flush=True)
    return result


def table(r: dict[str, Any]) -> list[str]:
    """The report's section."""
    return ["## A turn that compacts", "",
            f"In-process, wall clock to the answer's last byte; {r['history_messages']} trace messages "
            f"({r['history_bytes'] / 1e3:.0f} kB); the upstream answers a summary request after "
            f"{r['summary_delay_s']:g} s, the client's requests at once.", "",
            "| turn | latency ms (median) | runs |", "|---|---|---|",
            f"| normal (nothing to compact) | {r['normal_ms']:.1f} | {len(r['normal'])} |",
            f"| over the trigger ({r['defenses']}; {r['summary_calls']:g} summary calls) | {r['compaction_ms']:.0f} | "
            f"{len(r['compaction'])} |",
            f"| stall (difference) | {r['stall_ms']:.0f} | |", ""]
