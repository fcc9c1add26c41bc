"""End to end: sessions, the append-only log and the read API (issue 2, points 6 and 7).

Conversations go through the proxy with the official SDK; the log is read back over REST and,
where the API cannot show it (rows per request), counted in the database itself.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Proxy, Upstream
from tests.support.polling import wait_for

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
LIST_KEYS = {"object", "data", "first_id", "last_id", "has_more"}


def db_rows(database_url: str, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` run directly on the test database (SQLite file or PostgreSQL)."""
    if database_url.startswith("sqlite:///"):
        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:
            return conn.execute(sql).fetchall()
    import psycopg

    with psycopg.connect(database_url) as conn:
        return conn.execute(sql).fetchall()


def get(http: httpx.Client, path: str, **params: Any) -> Any:
    resp = http.get(path, params=params)
    assert resp.status_code == 200, resp.text
    return resp.json()


def all_messages(http: httpx.Client, session_id: str, **params: Any) -> list[dict[str, Any]]:
    """Every message of one branch, following ``after`` pages of 7."""
    out: list[dict[str, Any]] = []
    after = None
    while True:
        page = get(http, f"/sessions/{session_id}/messages", limit=7, **({"after": after} if after else {}), **params)
        out += page["data"]
        if not page["has_more"]:
            return out
        after = page["last_id"]


def settled(http: httpx.Client, session_id: str, requests: int) -> dict[str, Any]:
    """The session once its ``requests`` request records are written."""
    summary = wait_for(lambda: (s := get(http, f"/sessions/{session_id}"))["request_count"] >= requests and s)
    assert summary, f"{session_id} never reached {requests} request records"
    return summary


def pairs(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(m["role"], m.get("content")) for m in messages]


# --- sessions ----------------------------------------------------------------------------------


def test_session_header_names_the_session(any_proxy: Proxy, upstream: Upstream) -> None:
    client = any_proxy.client()
    reply = client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, {"role": "user", "content": "Hello there"}],
                                           extra_headers={"X-Session-Id": "my-agent-run-1"})
    assert "X-Session-Id".lower() not in upstream.state.chat_requests[-1].headers  # addressed to the proxy only
    with any_proxy.http() as http:
        summary = settled(http, "my-agent-run-1", 1)
        assert summary["id"] == "my-agent-run-1" and summary["object"] == "session"
        assert summary["message_count"] == 3 and summary["request_count"] == 1 and summary["branch_count"] == 1
        assert summary["last_model"] == "gpt-4o"
        messages = all_messages(http, "my-agent-run-1")
    assert pairs(messages) == [("system", SYSTEM["content"]), ("user", "Hello there"),
                               ("assistant", reply.choices[0].message.content)]
    assert [m["seq"] for m in messages] == [0, 1, 2]
    assert all(m["object"] == "session.message" and isinstance(m["created_at"], int) for m in messages)


def test_session_is_derived_and_stable_across_turns(any_proxy: Proxy, database_url: str) -> None:
    client = any_proxy.client()
    history: list[Any] = [SYSTEM, {"role": "user", "content": "Turn one"}]
    session_ids = []
    for turn in range(3):
        raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
        session_ids.append(raw.headers["x-context-proxy-session-id"])
        history += [raw.parse().choices[0].message, {"role": "user", "content": f"Turn {turn + 2}"}]
    assert len(set(session_ids)) == 1 and session_ids[0].startswith("sess_")
    other = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[SYSTEM, {"role": "user", "content": "A different conversation"}])
    assert other.headers["x-context-proxy-session-id"] != session_ids[0]
    with any_proxy.http() as http:
        summary = settled(http, session_ids[0], 3)
        assert summary["message_count"] == 2 + 3 * 2 - 1  # system, 3 users, 3 replies; the 4th user was never sent
        assert len(get(http, "/sessions")["data"]) == 2


def test_request_stores_only_what_it_adds(any_proxy: Proxy, database_url: str) -> None:
    """Each turn adds its new user message and the reply, never the history again (O(N) rows)."""
    client = any_proxy.client()
    history: list[Any] = [SYSTEM, {"role": "user", "content": "u1"}]
    with any_proxy.http() as http:
        for turn in range(2, 7):
            reply = client.chat.completions.create(model="gpt-4o", messages=history, extra_headers={"X-Session-Id": "delta"})
            history += [reply.choices[0].message, {"role": "user", "content": f"u{turn}"}]
            summary = settled(http, "delta", turn - 1)  # a client that waits: the turn's log writes are done
    assert summary["message_count"] == len(history) - 1
    (stored,) = db_rows(database_url, "SELECT count(*) FROM messages")[0]
    assert stored == len(history) - 1
    added = wait_for(lambda: [r[0] for r in db_rows(database_url, "SELECT added_messages FROM requests ORDER BY created_at")])
    # Turn 1 adds system + user; each later turn only its new user message: the echoed reply is the
    # row the proxy logged. (A client faster than the log writes may add the echo itself: same chain
    # hash, still one row; ``test_concurrent_turns_never_duplicate`` covers that.)
    assert added == [2, 1, 1, 1, 1]


def test_concurrent_turns_never_duplicate(plain_proxy: Proxy, database_url: str) -> None:
    """Clients that do not wait for the log (and racing duplicates of one request) still leave one row per message."""
    import concurrent.futures

    history: list[Any] = [SYSTEM]
    for turn in range(6):
        history += [{"role": "user", "content": f"q{turn}"}, {"role": "assistant", "content": f"a{turn}"}]
    history.append({"role": "user", "content": "last"})
    client = plain_proxy.client()

    def send(n: int) -> None:
        client.chat.completions.create(model="gpt-4o", messages=history[: 2 + 2 * (n % 7)], extra_headers={"X-Session-Id": "racy"})

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(send, range(16)))
    with plain_proxy.http() as http:
        summary = settled(http, "racy", 16)
        # The history once, plus the reply to each of the 7 distinct prefixes ("OK: qN" differs from
        # the history's "aN", so each is a branch leaf).
        assert summary["message_count"] == len(history) + 7
        assert summary["branch_count"] == 7
    (rows,) = db_rows(database_url, "SELECT count(*) FROM messages")[0]
    (distinct,) = db_rows(database_url, "SELECT count(DISTINCT chain_hash) FROM messages")[0]
    assert rows == distinct == summary["message_count"]


ECHO_FORMS = {
    "sdk_object": lambda m: m,
    "exclude_none": lambda m: m.model_dump(exclude_none=True),
    "full_dump": lambda m: m.model_dump(),
    "minimal": lambda m: {"role": "assistant", "content": m.content,
                          **({"tool_calls": [c.model_dump() for c in m.tool_calls]} if m.tool_calls else {})},
}


ECHO_SCRIPTED = {"role": "assistant", "content": "",
                 "tool_calls": [{"id": "call_a", "type": "function", "function": {"name": "ls", "arguments": '{"path": "/tmp"}'}},
                                {"id": "call_b", "type": "function", "function": {"name": "ls", "arguments": '{"path": "/var/log"}'}}]}


def streamed_echo(chunks: list[Any], content: str | None) -> dict[str, Any]:
    """The assistant message a client rebuilds from stream chunks (tool calls joined by index)."""
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for delta_call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(delta_call.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            call["id"] += delta_call.id or ""
            if delta_call.function:
                call["function"]["name"] += delta_call.function.name or ""
                call["function"]["arguments"] += delta_call.function.arguments or ""
    return {"role": "assistant", "content": content, "tool_calls": [calls[i] for i in sorted(calls)]}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_echoed_reply_is_not_duplicated(plain_proxy: Proxy, upstream: Upstream, stream: bool) -> None:
    """However the client echoes the reply back, it hashes as the reply the proxy logged: one row."""
    client = plain_proxy.client()
    forms = list(ECHO_FORMS) if not stream else ["content_none", "content_empty"]
    for form in forms:
        session_id = f"echo-{form}"
        headers = {"X-Session-Id": session_id}
        upstream.state.script.append(ECHO_SCRIPTED)
        history: list[Any] = [SYSTEM, {"role": "user", "content": "List two dirs"}]
        if stream:
            chunks = list(client.chat.completions.create(model="gpt-4o", messages=history, stream=True, extra_headers=headers))
            echoed: Any = streamed_echo(chunks, None if form == "content_none" else "")
        else:
            reply = client.chat.completions.create(model="gpt-4o", messages=history, extra_headers=headers)
            echoed = ECHO_FORMS[form](reply.choices[0].message)
        history += [echoed, {"role": "tool", "tool_call_id": "call_a", "content": "a.txt"},
                    {"role": "tool", "tool_call_id": "call_b", "content": "syslog"}]
        client.chat.completions.create(model="gpt-4o", messages=history, extra_headers=headers)
        with plain_proxy.http() as http:
            summary = settled(http, session_id, 2)
            messages = all_messages(http, session_id)
        assert (summary["message_count"], summary["branch_count"]) == (6, 1), form
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "assistant"]
        assert messages[2]["tool_calls"] == ECHO_SCRIPTED["tool_calls"]


def test_edit_and_regenerate_become_branches(plain_proxy: Proxy, upstream: Upstream) -> None:
    client = plain_proxy.client()
    headers = {"X-Session-Id": "branches"}
    u1 = {"role": "user", "content": "Name a colour"}
    upstream.state.script.extend([{"role": "assistant", "content": "Blue"}, {"role": "assistant", "content": "Green"}])
    a1 = client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, u1], extra_headers=headers).choices[0].message
    a2 = client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, u1, a1, {"role": "user", "content": "Another"}],
                                        extra_headers=headers).choices[0].message
    with plain_proxy.http() as http:
        settled(http, "branches", 2)
        first_branch = all_messages(http, "branches")
        assert pairs(first_branch)[-2:] == [("user", "Another"), ("assistant", "Green")]

        # The same history sent again, same reply: nothing new is stored.
        upstream.state.script.append({"role": "assistant", "content": "Green"})
        client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, u1, a1, {"role": "user", "content": "Another"}],
                                       extra_headers=headers)
        assert settled(http, "branches", 3)["message_count"] == 5

        # An edited last user message: a branch, never a duplicate of the shared prefix.
        upstream.state.script.append({"role": "assistant", "content": "Red"})
        client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, u1, a1, {"role": "user", "content": "Another one, warm"}],
                                       extra_headers=headers)
        summary = settled(http, "branches", 4)
        assert summary["message_count"] == 7 and summary["branch_count"] == 2
        newest = all_messages(http, "branches")
        assert pairs(newest) == pairs(first_branch[:3]) + [("user", "Another one, warm"), ("assistant", "Red")]
        assert [m["id"] for m in newest[:3]] == [m["id"] for m in first_branch[:3]]
        older = all_messages(http, "branches", leaf=first_branch[-1]["id"])
        assert older == first_branch

        # A regenerated reply (same history, different answer) is a third branch.
        upstream.state.script.append({"role": "assistant", "content": "Purple"})
        client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, u1, a1, {"role": "user", "content": "Another"}],
                                       extra_headers=headers)
        summary = settled(http, "branches", 5)
        assert summary["message_count"] == 8 and summary["branch_count"] == 3
        assert pairs(all_messages(http, "branches"))[-1] == ("assistant", "Purple")
        unknown = http.get("/sessions/branches/messages", params={"leaf": "0" * 64})
        assert unknown.status_code == 404
    assert a2.content == "Green"


def test_streamed_reply_is_reassembled_in_the_log(any_proxy: Proxy, upstream: Upstream, database_url: str) -> None:
    scripted = {"role": "assistant", "content": "I will check both files now, one moment please.",
                "tool_calls": [{"id": "call_1", "type": "function",
                                "function": {"name": "read_file", "arguments": '{"path": "/etc/hosts", "offset": 0, "limit": 200}'}},
                               {"id": "call_2", "type": "function",
                                "function": {"name": "read_file", "arguments": '{"path": "/etc/resolv.conf", "offset": 10}'}}]}
    upstream.state.script.append(scripted)
    stream = any_proxy.client().chat.completions.create(
        model="gpt-4o", messages=[SYSTEM, {"role": "user", "content": "Read two files"}], stream=True,
        stream_options={"include_usage": True}, extra_headers={"X-Session-Id": "streamed"})
    chunks = list(stream)
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.tool_calls) > 4  # arguments came in pieces
    with any_proxy.http() as http:
        settled(http, "streamed", 1)
        logged = all_messages(http, "streamed")[-1]
    assert logged["role"] == "assistant"
    assert logged["content"] == scripted["content"]
    assert logged["tool_calls"] == scripted["tool_calls"]
    assert "x_context_proxy" not in logged  # a complete stream, not marked partial
    ((status, stream_flag, usage),) = db_rows(database_url, "SELECT status, stream, usage FROM requests")
    assert status == 200 and bool(stream_flag)
    assert '"completion_tokens"' in usage and str(chunks[-1].usage.completion_tokens) in usage


def test_request_records(plain_proxy: Proxy, upstream: Upstream, database_url: str) -> None:
    client = plain_proxy.client()
    headers = {"X-Session-Id": "records"}
    client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "a"}], extra_headers=headers)
    with plain_proxy.http() as http:
        settled(http, "records", 1)
    list(client.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "OK: a"},
                                                                     {"role": "user", "content": "b"}], stream=True, extra_headers=headers))
    with plain_proxy.http() as http:
        summary = settled(http, "records", 2)
    assert summary["last_model"] == "gpt-4.1" and summary["message_count"] == 4
    rows = db_rows(database_url, "SELECT model, status, stream, latency_ms, added_messages, first_added_seq FROM requests ORDER BY created_at")
    assert [(r[0], r[1], bool(r[2]), r[4], r[5]) for r in rows] == [("gpt-4o-mini", 200, False, 1, 0), ("gpt-4.1", 200, True, 1, 2)]
    assert all(r[3] > 0 for r in rows)


# --- the read API ------------------------------------------------------------------------------


def test_list_sessions_newest_first_with_pagination(plain_proxy: Proxy) -> None:
    client = plain_proxy.client()
    for name in ("s-one", "s-two", "s-three"):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": name}],
                                       extra_headers={"X-Session-Id": name})
        time.sleep(0.01)
    with plain_proxy.http() as http:
        wait_for(lambda: all(get(http, f"/sessions/{n}")["request_count"] for n in ("s-one", "s-two", "s-three")))
        full = get(http, "/sessions")
        assert set(full) == LIST_KEYS and full["object"] == "list"
        assert [s["id"] for s in full["data"]] == ["s-three", "s-two", "s-one"]
        page1 = get(http, "/sessions", limit=2)
        assert [s["id"] for s in page1["data"]] == ["s-three", "s-two"]
        assert (page1["first_id"], page1["last_id"], page1["has_more"]) == ("s-three", "s-two", True)
        page2 = get(http, "/sessions", limit=2, after=page1["last_id"])
        assert [s["id"] for s in page2["data"]] == ["s-one"]
        assert (page2["first_id"], page2["last_id"], page2["has_more"]) == ("s-one", "s-one", False)
        assert http.get("/sessions", params={"limit": 0}).status_code == 400


def test_list_messages_pagination(plain_proxy: Proxy) -> None:
    history: list[Any] = [SYSTEM] + [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(9)]
    plain_proxy.client().chat.completions.create(model="gpt-4o", messages=history, extra_headers={"X-Session-Id": "pages"})
    with plain_proxy.http() as http:
        settled(http, "pages", 1)
        page1 = get(http, "/sessions/pages/messages", limit=4)
        assert set(page1) == LIST_KEYS and page1["object"] == "list"
        assert [m["seq"] for m in page1["data"]] == [0, 1, 2, 3] and page1["has_more"] is True
        assert (page1["first_id"], page1["last_id"]) == (page1["data"][0]["id"], page1["data"][-1]["id"])
        page2 = get(http, "/sessions/pages/messages", limit=4, after=page1["last_id"])
        assert [m["seq"] for m in page2["data"]] == [4, 5, 6, 7] and page2["has_more"] is True
        page3 = get(http, "/sessions/pages/messages", limit=4, after=page2["last_id"])
        assert [m["seq"] for m in page3["data"]] == [8, 9, 10] and page3["has_more"] is False
        everything = page1["data"] + page2["data"] + page3["data"]
        assert [m["content"] for m in everything[:10]] == [m["content"] for m in history]
        assert everything[-1]["content"] == "OK: m8"
        bad = http.get("/sessions/pages/messages", params={"after": "not-a-message"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "after"


def test_events_archive_and_artifacts(plain_proxy: Proxy) -> None:
    plain_proxy.client().chat.completions.create(
        model="gpt-4o", messages=[SYSTEM, {"role": "user", "content": "Archive me, please"}],
        extra_headers={"X-Session-Id": "archived"})
    with plain_proxy.http() as http:
        settled(http, "archived", 1)
        assert get(http, "/sessions/archived/events") == {"object": "list", "data": [], "first_id": None,
                                                          "last_id": None, "has_more": False}
        archive = http.get("/sessions/archived/archive")
        assert archive.status_code == 200
        assert archive.headers["content-type"].startswith("text/markdown")
        for text in ("archived", SYSTEM["content"], "Archive me, please", "OK: Archive me, please"):
            assert text in archive.text
        missing = http.get("/artifacts/art_does_not_exist")
        assert missing.status_code == 404
        assert set(missing.json()["error"]) == {"message", "type", "param", "code"}
        for path in ("/sessions/nope", "/sessions/nope/messages", "/sessions/nope/events", "/sessions/nope/archive"):
            resp = http.get(path)
            assert resp.status_code == 404 and resp.json()["error"]["type"] == "not_found_error", path


def test_docs_and_health(plain_proxy: Proxy) -> None:
    with plain_proxy.http(key=None) as http:
        assert http.get("/healthz").status_code == 200
        ready = http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["database"] is True
        docs = http.get("/docs")
        assert docs.status_code == 200 and "text/html" in docs.headers["content-type"]
        spec = http.get("/openapi.json").json()
    for path in ("/sessions", "/sessions/{session_id}", "/sessions/{session_id}/messages", "/sessions/{session_id}/events",
                 "/sessions/{session_id}/archive", "/artifacts/{artifact_id}", "/v1/chat/completions", "/healthz", "/readyz"):
        assert path in spec["paths"], path


@pytest.mark.parametrize("stream", [False, True])
def test_request_records_carry_the_finish_reason(stream: bool, proxy: Proxy, upstream: Upstream) -> None:
    """The reply's finish_reason and usage are logged with each request (streams reassembled)."""
    upstream.state.script.append({"content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})
    client = proxy.client(default_headers={"x-session-id": "finish"})
    kwargs = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    out = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], **kwargs)
    if stream:
        list(out)
    deadline = time.monotonic() + 10  # the record is written after the response
    with proxy.http() as http:
        while True:
            data = http.get("/sessions/finish/requests").json()["data"]
            if data or time.monotonic() > deadline:
                break
            time.sleep(0.02)
    assert len(data) == 1
    assert data[0]["finish_reason"] == "tool_calls"
    assert data[0]["usage"]["prompt_tokens"] > 0
    assert data[0]["stream"] is stream and data[0]["status"] == 200
