"""The data the viewer's browser tests browse, made through the real proxy under uvicorn.

``seed_sessions(proxy, upstream)`` replays a shared trace at a 16k window (the proxy learns the
window from the strict fake's first overflow, then compacts), forks a second branch, and adds a
session with hostile content, one of another tenant, and one whose large tool result is offloaded
and read back through the proxy's read tool (a stub, an artifact, internal rounds).
``seed_large(database_url, tenant)`` writes a large session (``LARGE_MESSAGES`` messages of
``LARGE_CHARS`` characters: 60 MB) straight into the store, as the log writer would.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from proxy.conversation.canonical import chain_hash
from storage.records import NewMessage
from storage.store import Store
from tests.e2e.test_read_tool import TOOLS, history_with_offload
from tests.e2e.test_trace_compaction import load_trace, replay
from tests.fakes.anthropic import FakeAnthropicState, reply, text, thinking, tool_use
from tests.support.anthropic_server import anthropic_client
from tests.support.real_server import Proxy, Upstream, wait_logged

TRACE = "openhands__ponyc-4588__llama-4-maverick.jsonl"
"""49 turns, about 22,000 tokens: at a 16k window it overflows once, then compacts."""
MODEL = "fake-16k-openai"
REPLAYED = "viewer-replayed"
HOSTILE = "<img src=x onerror=\"window.__xss=7\"> javascript:window.__xss=8"
"""A session id is the client's text too."""
OTHER = "viewer-other-tenant"
LARGE = "viewer-large"
READ_TOOL = "viewer-read-tool"
MESSAGES = "viewer-messages"
WEATHER: Any = {"name": "get_weather", "description": "Weather of a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
READ_MODEL = "fake-32k-openai"
MODELS_YAML = f'"{READ_MODEL}":\n  context_window_tokens: 32768\n'
"""The proxy's models file: this model's window is known, so a large tool result is offloaded."""
LARGE_MESSAGES = 10_000
LARGE_CHARS = 6_000
HOSTILE_TEXT = (
    "<script>window.__xss = 1</script> <img src=x onerror=\"window.__xss = 2\"> "
    "[click](javascript:window.__xss=3) <a href=\"javascript:window.__xss=4\">link</a> "
    "<svg onload=\"window.__xss=5\"></svg> <iframe src=\"javascript:window.__xss=6\"></iframe>"
)


@dataclass(frozen=True)
class Seeded:
    replayed: str
    hostile: str
    other: str
    read_tool: str


def seed_sessions(proxy: Proxy, upstream: Upstream, trace_dir: Path, other_key: str) -> Seeded:
    """The replayed trace (with a second branch), the hostile session and another tenant's."""
    trace = load_trace(trace_dir / TRACE)
    replay(proxy, upstream, trace, MODEL, REPLAYED, code="LC-VIEWER")
    # a second branch: the history before the first assistant reply, then another question
    first = next(i for i, m in enumerate(trace) if m["role"] == "assistant")
    client = proxy.client(default_headers={"x-session-id": REPLAYED})
    upstream.state.script.append({"content": "another branch"})
    client.chat.completions.create(model=MODEL, messages=[*trace[:first],
                                                          {"role": "user", "content": "Take another way."}])
    hostile = proxy.client(default_headers={"x-session-id": HOSTILE})
    upstream.state.script.append({"content": HOSTILE_TEXT})
    hostile.chat.completions.create(model="fake-128k-openai", messages=[{"role": "user", "content": HOSTILE_TEXT}])
    other = proxy.client(key=other_key, default_headers={"x-session-id": OTHER})
    upstream.state.script.append({"content": "only mine"})
    other.chat.completions.create(model="fake-128k-openai", messages=[{"role": "user", "content": "secret of B"}])
    # an offloaded tool result the model reads back through the proxy's read tool
    reader = proxy.client(default_headers={"x-session-id": READ_TOOL})
    reply = reader.chat.completions.create(model=READ_MODEL, messages=history_with_offload("FACT: build_id=B-7741"),
                                           tools=TOOLS)
    assert reply.choices[0].message.content == "ANSWER: B-7741"
    wait_logged(proxy, HOSTILE, 1)
    wait_logged(proxy, READ_TOOL, 1)
    return Seeded(REPLAYED, HOSTILE, OTHER, READ_TOOL)


def seed_messages(proxy: Proxy, state: FakeAnthropicState, key: str) -> str:
    """An Anthropic Messages session (the ``anthropic`` SDK): thinking, a tool call, its result, an answer."""
    state.script.extend([reply(thinking("The user wants the weather."), text("Checking."),
                               tool_use("get_weather", {"city": "Paris"}, id="toolu_01paris")),
                         reply(thinking("It is sunny."), text("Sunny in Paris."))])
    first: Any = {"role": "user", "content": "Weather in Paris?"}
    thinking_on: Any = {"type": "enabled", "budget_tokens": 1024}
    with anthropic_client(proxy.url, key, default_headers={"x-session-id": MESSAGES}) as client:
        one: Any = client.messages.create(model="claude-sonnet-4-5", max_tokens=2048, tools=[WEATHER],
                                          thinking=thinking_on, messages=[first])
        echo: Any = {"role": "assistant", "content": [b.model_dump() for b in one.content]}
        result: Any = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01paris",
                                                     "content": "21 C, sunny"}]}
        client.messages.create(model="claude-sonnet-4-5", max_tokens=2048, tools=[WEATHER], thinking=thinking_on,
                               messages=[first, echo, result])
    wait_logged(proxy, MESSAGES, 2)
    return MESSAGES


def seed_large(database_url: str, tenant: str) -> None:
    """``LARGE_MESSAGES`` messages of ``LARGE_CHARS`` characters in session ``LARGE`` of ``tenant``
    (in a thread of its own: the caller's may run an event loop, as Playwright's sync API does)."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _write_large(database_url, tenant)).result()


async def _write_large(database_url: str, tenant: str) -> None:
    store = await Store.open(database_url, pool_size=2)
    try:
        now = datetime.now(UTC)
        session = await store.get_or_create_session(tenant, LARGE, now)
        parent: str | None = None
        batch: list[NewMessage] = []
        for seq in range(LARGE_MESSAGES):
            role = "user" if seq % 2 == 0 else "assistant"
            text = f"message {seq} " + ("lorem ipsum dolor " * (LARGE_CHARS // 18))[: LARGE_CHARS - 16]
            digest = f"{seq:064x}"
            hash_ = chain_hash(parent, digest)
            batch.append(NewMessage(hash_, parent, seq, role, {"role": role, "content": text}))
            parent = hash_
            if len(batch) == 500:
                await store.append_messages(session.pk, batch, now)
                batch = []
        if batch:
            await store.append_messages(session.pk, batch, now)
    finally:
        await store.close()
