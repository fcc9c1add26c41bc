"""The defenses seen from outside: headers, stability, byte-identical re-projection, unfittable
requests, artifacts and the archive after compaction, and the fail-safe when storage fails."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.e2e.conftest import Proxy, Upstream, wait_logged
from tests.strict import validate_chat_messages
from tests.support.shared import needs_exact_encodings
from tests.test_projection_stability import TOOLS, agent_turn

WINDOW = 32_768
MODEL = "fake-32k-openai"


@pytest.fixture
def known_window(tmp_path: Path) -> str:
    path = tmp_path / "models.yaml"
    path.write_text(f'"fake-*-openai-4k":\n  context_window_tokens: 4096\n"{MODEL}":\n  context_window_tokens: {WINDOW}\n')
    return str(path)


def prefix_share(a: bytes, b: bytes) -> float:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n / len(a)


def run_session(proxy: Proxy, upstream: Upstream, turns: int, session: str) -> list[dict[str, Any]]:
    rng = random.Random(11)
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Refactor the project. FACT: ticket=PRJ-42"},
    ]
    client = proxy.client(default_headers={"x-session-id": session})
    for k in range(turns):
        step = agent_turn(rng, k)
        for m in step[1:]:  # heavier tool output than the unit test's, so a 60-turn session needs summaries
            if m["role"] == "tool":
                m["content"] = m["content"] + "\n" + m["content"]
        reply, rest = step[0], step[1:]
        upstream.state.script.append({key: v for key, v in reply.items() if key in ("content", "tool_calls")})
        client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=1024)
        history = history + [reply, *rest]
    return history


@needs_exact_encodings  # when the summaries happen decides the figure
def test_prefix_stability_over_a_60_turn_session_at_32k(proxy_factory: Any, upstream: Upstream, known_window: str) -> None:
    proxy = proxy_factory(models_file=known_window)
    history = run_session(proxy, upstream, 60, "stability")
    bodies = [orjson.dumps(c.json["messages"]) for c in upstream.state.chat_requests if not c.is_summary]
    assert len(bodies) == 60
    shares = [prefix_share(a, b) for a, b in zip(bodies, bodies[1:], strict=False)]
    stability = sum(shares) / len(shares)
    print(f"\nprefix stability through the proxy, 60 turns at 32k: {stability:.4f}; "
          f"summary calls: {len(upstream.state.summary_requests)}; "
          f"client tokens at the end ~{len(orjson.dumps(history)) // 4}")
    assert stability >= 0.95
    assert all(c.outcome == "ok" for c in upstream.state.chat_requests)
    assert upstream.state.summary_requests, "the session must have needed compaction"
    # the summarized history stays readable: the archive has a section per compaction
    wait_logged(proxy, "stability", 60)
    with proxy.http() as http:
        events = http.get("/sessions/stability/events").json()["data"]
        archive = http.get("/sessions/stability/archive")
    assert archive.headers["content-type"].startswith("text/markdown")
    summaries = [e for e in events if e["kind"] == "summary"]
    assert summaries and archive.text.count("\n## Compaction ") == len(summaries)
    assert "FACT: ticket=PRJ-42" in archive.text
    for event in summaries:  # each section shows the summary the model was given (issue 20)
        lines = [line for line in event["payload"]["summary"].splitlines() if line.strip()]
        assert lines and all(f"\n  {line[:500]}" in archive.text for line in lines), event["id"]


def test_same_history_twice_is_forwarded_byte_identically(proxy_factory: Any, upstream: Upstream, known_window: str) -> None:
    proxy = proxy_factory(models_file=known_window)
    history = run_session(proxy, upstream, 40, "twice")
    client = proxy.client(default_headers={"x-session-id": "twice"})
    upstream.state.requests.clear()
    for _ in range(2):
        client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=1024)
    a, b = [c.body for c in upstream.state.chat_requests if not c.is_summary]
    assert a == b
    assert not upstream.state.summary_requests


def test_headers_report_what_was_done(proxy_factory: Any, upstream: Upstream, known_window: str) -> None:
    proxy = proxy_factory(models_file=known_window)
    history = run_session(proxy, upstream, 45, "headers")
    raw = proxy.client(default_headers={"x-session-id": "headers"}).chat.completions.with_raw_response.create(
        model=MODEL, messages=history, tools=TOOLS, max_tokens=1024
    )
    h = raw.headers
    assert int(h["x-context-proxy-tokens-client"]) > int(h["x-context-proxy-tokens-forwarded"])
    assert "summary" in h["x-context-proxy-defenses"].split(",")
    assert h["x-context-proxy-events"].startswith("evt_")
    assert h["x-context-proxy-session-id"] == "headers"


def test_a_request_that_cannot_fit_is_refused_at_once(proxy_factory: Any, upstream: Upstream, tmp_path: Path) -> None:
    models = tmp_path / "models.yaml"
    models.write_text('"fake-4k-openai":\n  context_window_tokens: 4096\n')
    proxy = proxy_factory(models_file=str(models))
    with proxy.http() as http:
        r = http.post("/v1/chat/completions", json={
            "model": "fake-4k-openai", "max_tokens": 4090,
            "messages": [{"role": "user", "content": "hello " * 50}],
        })
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and "4096" in err["message"]
    assert len(upstream.state.chat_requests) <= 1  # never a compaction loop


def test_offloaded_result_is_readable_by_line_range(proxy_factory: Any, upstream: Upstream, known_window: str) -> None:
    proxy = proxy_factory(models_file=known_window)
    big = "\n".join(f"line {i}: " + "x" * 60 for i in range(2000))  # ~40k tokens: over the offload threshold
    messages = [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": big},
    ]
    raw = proxy.client().chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert "offload" in raw.headers["x-context-proxy-defenses"]
    sent = upstream.state.chat_requests[-1].json["messages"][-1]
    assert sent["role"] == "tool" and sent["tool_call_id"] == "c1" and len(sent["content"]) < 4000
    (ref,) = set(__import__("re").findall(r"art_[0-9a-f]{32}", sent["content"]))
    with proxy.http() as http:
        part = http.get(f"/artifacts/{ref}", params={"offset": 100, "limit": 3}).json()
        assert part["content"].splitlines() == big.splitlines()[100:103]
        assert part["line_count"] == 2000
        assert http.get(f"/artifacts/{ref}", headers={"authorization": "Bearer another-tenant"}).status_code == 404


def test_artifact_store_failure_forwards_the_original(proxy_factory: Any, upstream: Upstream, known_window: str) -> None:
    """Fail safe (DESIGN.md): no reference to unsaved data is ever sent."""
    from storage.errors import StorageError

    proxy = proxy_factory(models_file=known_window)
    store = proxy.server.config.app.state.proxy.store

    async def broken(items: Any) -> None:
        raise StorageError("disk full")

    store.put_artifacts = broken
    big = "\n".join(f"row {i} " + "y" * 60 for i in range(1000))  # over the offload threshold, under the window
    messages = [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": big},
    ]
    proxy.client().chat.completions.create(model=MODEL, messages=messages)
    sent = upstream.state.chat_requests[-1].json["messages"][-1]
    assert sent["content"] == big
    assert "art_" not in upstream.state.chat_requests[-1].body.decode()
    assert validate_chat_messages(upstream.state.chat_requests[-1].json["messages"]) == []
    assert json.loads(json.dumps(sent))
