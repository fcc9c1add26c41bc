"""End to end: real agent traces replayed through the proxy turn by turn (issue 2, point 10).

For each trace of ``../shared/traces`` (conventions in its ``SOURCES.md``), the client does what
the agent did: the leading system/user messages are the first request; the fake upstream answers
with the trace's next assistant message (pushed to ``state.script`` before each request); the
client appends that reply (as the SDK returned it) and the tool/user messages that follow it in the
trace, and sends the grown history again. A final assistant message whose calls are unanswered is
the last upstream reply. A trace that ends with tool or user messages ends with a request whose
upstream answer is a 503: the run stopped there, nothing after it is in the trace, and the
client's messages must still reach the log.

Asserted on SQLite and PostgreSQL: the session's log read over REST is exactly the trace (role,
content, tool_calls, tool_call_id; ``null`` and ``""`` content of an assistant are the same, as in
``proxy.conversation.canonical``'s canonical form), and the database holds one row per trace message, not one per
message per turn.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SHARED_DIR
from tests.e2e.conftest import Proxy, Upstream

TRACES = sorted(p.name for p in (SHARED_DIR / "traces").glob("*.jsonl"))
MODEL = "gpt-4.1"
"""Its profile window is 1M tokens: the defenses (when on) have nothing to compact in these traces."""
COMPARED = ("role", "content", "tool_calls", "tool_call_id")


def load_trace(shared_dir: Path, name: str) -> list[dict[str, Any]]:
    lines = (shared_dir / "traces" / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def comparable(message: dict[str, Any]) -> dict[str, Any]:
    """The compared fields; an assistant's ``content`` ``""`` is ``None`` and absent fields are ``None``."""
    out = {key: message.get(key) for key in COMPARED}
    if out["role"] == "assistant" and out["content"] == "":
        out["content"] = None
    if out["tool_calls"]:
        out["tool_calls"] = [{"id": c["id"], "type": c.get("type", "function"),
                              "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
                             for c in out["tool_calls"]]
    return out


def db_count(database_url: str, sql: str) -> int:
    if database_url.startswith("sqlite:///"):
        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:
            return int(conn.execute(sql).fetchone()[0])
    import psycopg

    with psycopg.connect(database_url) as conn:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return int(row[0])


def read_log(proxy: Proxy, session_id: str) -> list[dict[str, Any]]:
    """The session's newest branch, all pages."""
    out: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 100}
    with proxy.http() as http:
        while True:
            page = http.get(f"/sessions/{session_id}/messages", params=params).json()
            out += page["data"]
            if not page["has_more"]:
                return out
            params["after"] = page["last_id"]


def replay(proxy: Proxy, upstream: Upstream, trace: list[dict[str, Any]], session_id: str) -> int:
    """Replay ``trace`` turn by turn; returns the number of requests sent.

    The client posts JSON as an agent's HTTP layer does (the SDK's request transform over a
    300-message history costs more than the rest of the replay; the SDK itself is covered by
    ``test_forwarding``) and appends the reply's ``message`` object exactly as the provider sent it
    (``refusal: null``, ``annotations: []`` included).
    """
    headers = {"X-Session-Id": session_id}
    i = next(k for k, m in enumerate(trace) if m["role"] == "assistant")
    history: list[Any] = list(trace[:i])
    requests = 0
    with proxy.http() as http:
        while i < len(trace):  # trace[i] is the assistant message the model answered with
            upstream.state.script.append(trace[i])
            resp = http.post("/v1/chat/completions", json={"model": MODEL, "messages": history}, headers=headers)
            assert resp.status_code == 200, resp.text
            requests += 1
            history.append(resp.json()["choices"][0]["message"])
            i += 1
            following = i
            while i < len(trace) and trace[i]["role"] != "assistant":
                i += 1
            if following == i == len(trace):
                return requests  # the trace ends with this reply (e.g. its unanswered final call)
            history += trace[following:i]  # nothing when two assistant messages follow each other
        upstream.state.fail_next.append(("status", 503, {"error": {"message": "run ended", "type": "server_error",
                                                                   "param": None, "code": None}}))
        resp = http.post("/v1/chat/completions", json={"model": MODEL, "messages": history}, headers=headers)
        assert resp.status_code == 503
    return requests + 1


def _message_count(name: str) -> int:
    with (SHARED_DIR / "traces" / name).open(encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


LONG_TRACE_MESSAGES = 150
"""Traces longer than this take 4-10 s each per database: marked ``slow`` (still run by default)."""
CASES = [
    pytest.param(compaction, name, id=f"{'compaction' if compaction else 'plain'}-{name.removesuffix('.jsonl')}",
                 marks=[pytest.mark.slow] if _message_count(name) > LONG_TRACE_MESSAGES else [])
    for compaction in (False, True)
    for name in TRACES
    # With the defenses on, the long traces add time but no coverage: a 1M window compacts nothing.
    if not (compaction and _message_count(name) > LONG_TRACE_MESSAGES)
]


@pytest.mark.parametrize(("compaction", "name"), CASES)
def test_trace_replay_stores_each_message_once(proxy_factory: Callable[..., Proxy], upstream: Upstream, database_url: str,
                                               shared_dir: Path, compaction: bool, name: str) -> None:
    upstream.state.windows[MODEL] = 1_047_576
    trace_proxy = proxy_factory(compaction_enabled=compaction)
    trace = load_trace(shared_dir, name)
    session_id = "trace-" + name.removesuffix(".jsonl")
    requests = replay(trace_proxy, upstream, trace, session_id)

    assert all(r.status == 200 for r in upstream.state.chat_requests[:-1])
    assert all(not r.is_summary for r in upstream.state.chat_requests)
    deadline = time.monotonic() + 10
    while db_count(database_url, "SELECT count(*) FROM requests") < requests and time.monotonic() < deadline:
        time.sleep(0.05)
    assert db_count(database_url, "SELECT count(*) FROM requests") == requests

    logged = read_log(trace_proxy, session_id)
    assert [m["seq"] for m in logged] == list(range(len(trace)))
    for seq, (got, expected) in enumerate(zip(logged, trace, strict=True)):
        assert comparable(got) == comparable(expected), f"message {seq} of {name}"
    assert db_count(database_url, "SELECT count(*) FROM messages") == len(trace)
    with trace_proxy.http() as http:
        summary = http.get(f"/sessions/{session_id}").json()
    assert (summary["message_count"], summary["branch_count"], summary["request_count"]) == (len(trace), 1, requests)
