"""Messages requests logged in their sessions (issue 19, item 2): the official ``anthropic`` SDK
through the proxy to the strict fake Anthropic provider, the log read back through the read API,
on SQLite and PostgreSQL. Turns are stored once, in their native shape; a reply the client echoes
(moved cache breakpoints and the SDK's ``null`` fields included) continues the same branch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import pytest

from tests.fakes.anthropic import FakeAnthropicState, reply, text, thinking, tool_use
from tests.support.anthropic_server import ANTHROPIC_KEY, anthropic_client
from tests.support.polling import wait_for

WEATHER: Any = {"name": "get_weather", "description": "Weather of a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
SYSTEM: Any = [{"type": "text", "text": "You are a weather bot.", "cache_control": {"type": "ephemeral"}}]


def logged(url: str, session_id: str, requests: int) -> dict[str, Any]:
    """The session's JSON once it has ``requests`` request records (the log is written after the answer)."""
    with httpx.Client(base_url=url, headers={"x-api-key": ANTHROPIC_KEY}, timeout=30) as http:
        def done() -> dict[str, Any] | None:
            r = http.get(f"/sessions/{session_id}")
            return r.json() if r.status_code == 200 and r.json()["request_count"] >= requests else None

        found = wait_for(done, 10.0)
        assert found is not None, http.get(f"/sessions/{session_id}").text
        found["messages"] = http.get(f"/sessions/{session_id}/messages").json()["data"]
        found["requests"] = http.get(f"/sessions/{session_id}/requests").json()["data"]
        return found


def marked(turn: Any) -> Any:
    """``turn`` with a cache breakpoint on its last block, as Claude Code marks the newest turn."""
    content = turn["content"] if isinstance(turn["content"], list) else [{"type": "text", "text": turn["content"]}]
    return {**turn, "content": [*content[:-1], {**content[-1], "cache_control": {"type": "ephemeral"}}]}


def test_a_tool_conversation_is_logged_once_in_its_claude_code_session(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState, database_url: str) -> None:
    url = anthropic_proxy(database_url=database_url)
    anthropic_state.script.extend([
        reply(thinking("The user wants the weather."), text("Checking."),
              tool_use("get_weather", {"city": "Paris"}, id="toolu_01paris")),
        reply(thinking("It is sunny."), text("Sunny in Paris.")),
    ])
    session = {"x-claude-code-session-id": "1b0c5e3e-7d52-4c1e-9a52-5b8a3f0c9d11"}
    first: Any = {"role": "user", "content": "Weather in Paris?"}
    thinking_on: Any = {"type": "enabled", "budget_tokens": 1024}
    with anthropic_client(url, default_headers=session) as c:
        one: Any = c.messages.create(model="claude-sonnet-4-5", max_tokens=2048, system=SYSTEM, tools=[WEATHER],
                                     thinking=thinking_on, messages=[marked(first)])
        echo: Any = {"role": "assistant", "content": [b.model_dump() for b in one.content]}  # the SDK's own dump
        result: Any = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01paris",
                                                     "content": "21 C, sunny"}]}
        with c.messages.stream(model="claude-sonnet-4-5", max_tokens=2048, system=SYSTEM, tools=[WEATHER],
                               thinking=thinking_on, messages=[first, echo, marked(result)]) as stream:
            two: Any = stream.get_final_message()
    assert [b.text for b in two.content if b.type == "text"] == ["Sunny in Paris."]
    found = logged(url, session["x-claude-code-session-id"], 2)
    assert found["branch_count"] == 1, found  # the echo and the moved breakpoints continue one branch
    messages = found["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[0]["content"] == SYSTEM and messages[1]["content"] == marked(first)["content"]  # as sent
    assert [b["type"] for b in messages[2]["content"]] == ["thinking", "text", "tool_use"]
    assert messages[2]["content"][0]["signature"] == one.content[0].signature  # opaque, byte for byte
    assert messages[3]["content"] == marked(result)["content"]
    streamed = messages[4]["content"]
    assert [b["type"] for b in streamed] == [b.type for b in two.content]
    assert streamed[-1]["text"] == "Sunny in Paris." and streamed[0]["signature"] == two.content[0].signature
    with httpx.Client(base_url=url, headers={"x-api-key": ANTHROPIC_KEY}, timeout=30) as http:
        archive = http.get(f"/sessions/{session['x-claude-code-session-id']}/archive").text
    assert "Weather in Paris?" in archive and '**tool call** `"toolu_01paris"` `"get_weather"`:' in archive
    assert '{"city":"Paris"}' in archive and "21 C, sunny" in archive and "Sunny in Paris." in archive
    records = sorted(found["requests"], key=lambda r: r["created_at"])
    assert [r["stream"] for r in records] == [False, True]
    assert [r["finish_reason"] for r in records] == ["tool_use", "end_turn"]
    assert records[0]["usage"] == anthropic_state.requests[0].usage  # the upstream's figures, unchanged
    assert records[1]["usage"]["output_tokens"] == anthropic_state.requests[1].usage["output_tokens"]


def test_sessions_are_named_by_claude_code_then_x_session_id_then_derived(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState) -> None:
    url = anthropic_proxy()
    turn: Any = [{"role": "user", "content": "Name this session"}]
    with anthropic_client(url) as c:
        raw: Any = c.messages.with_raw_response.create(model="m", max_tokens=8, messages=turn)
        derived = raw.headers["x-context-proxy-session-id"]
        again: Any = c.messages.with_raw_response.create(model="m", max_tokens=8, messages=turn)
        named: Any = c.messages.with_raw_response.create(model="m", max_tokens=8, messages=turn,
                                                          extra_headers={"x-session-id": "mine"})
        both: Any = c.messages.with_raw_response.create(
            model="m", max_tokens=8, messages=turn,
            extra_headers={"x-session-id": "mine", "x-claude-code-session-id": "cc-1"})
        odd: Any = c.messages.with_raw_response.create(  # not an id the read API can address: passed over
            model="m", max_tokens=8, messages=turn, extra_headers={"x-claude-code-session-id": "a/b"})
    assert derived.startswith("sess_") and again.headers["x-context-proxy-session-id"] == derived
    assert named.headers["x-context-proxy-session-id"] == "mine"
    assert both.headers["x-context-proxy-session-id"] == "cc-1"
    assert odd.headers["x-context-proxy-session-id"] == derived
    assert anthropic_state.requests[-1].headers["x-claude-code-session-id"] == "a/b"  # forwarded as it came
    with anthropic_client(url) as c, pytest.raises(anthropic.BadRequestError) as caught:
        c.messages.create(model="m", max_tokens=8, messages=turn, extra_headers={"x-session-id": "x/y"})
    assert caught.value.body["type"] == "error" and "X-Session-Id" in caught.value.body["error"]["message"]


def test_provider_errors_are_logged_and_passed_back_unchanged(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState) -> None:
    url = anthropic_proxy()
    orphan: Any = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}]}]
    with httpx.Client(headers={"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01",
                               "x-session-id": "errs"}, timeout=30) as http:
        r = http.post(url + "/v1/messages", json={"model": "m", "max_tokens": 8, "messages": orphan})
        garbage = http.post(url + "/v1/messages", content=b'{"model": "m", "messages": "not a list"')
    assert r.status_code == 400 and r.json()["error"]["message"] == anthropic_state.requests[0].error
    assert garbage.status_code == 400 and anthropic_state.requests[1].raw == b'{"model": "m", "messages": "not a list"'
    found = logged(url, "errs", 1)
    assert found["request_count"] == 1  # the body the proxy cannot read went unlogged, as it came
    assert [m["role"] for m in found["messages"]] == ["user", "assistant", "user"]  # the client's turns kept
    assert found["requests"][0]["status"] == 400 and "tool_result" in found["requests"][0]["error"]


def test_a_key_the_provider_refuses_logs_no_content(anthropic_proxy: Callable[..., str],
                                                    anthropic_state: FakeAnthropicState) -> None:
    url = anthropic_proxy()
    anthropic_state.api_keys = {"sk-ant-the-real-one"}
    with anthropic_client(url, key="sk-ant-made-up", default_headers={"x-session-id": "refused"}) as c, \
            pytest.raises(anthropic.AuthenticationError) as caught:
        c.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "secret text"}])
    assert caught.value.body["error"]["message"] == "invalid x-api-key"  # the provider's words
    with httpx.Client(base_url=url, headers={"x-api-key": "sk-ant-made-up"}, timeout=30) as http:
        def recorded() -> Any:
            r = http.get("/sessions/refused")
            return r.json() if r.status_code == 200 and r.json()["request_count"] == 1 else None

        assert wait_for(recorded, 10.0) is not None
        assert http.get("/sessions/refused/messages").json()["data"] == []


def test_a_client_gone_after_message_stop_has_its_reply_logged_whole(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState) -> None:
    """The client reads up to ``message_stop`` and leaves before the end of the body (the fake waits
    after each event): the reply is complete, so the client's echo of it continues the branch."""
    url = anthropic_proxy()
    anthropic_state.chunk_delay_s = 0.3
    anthropic_state.script.append(reply(text("All done.")))
    first: Any = {"role": "user", "content": "Finish up"}
    headers = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01", "x-session-id": "gone-early"}
    body = {"model": "m", "max_tokens": 64, "stream": True, "messages": [first]}
    with httpx.Client(timeout=30) as http, http.stream("POST", url + "/v1/messages", json=body, headers=headers) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and '"message_stop"' in line:
                break  # the connection closes with the body still open
    anthropic_state.chunk_delay_s = 0.0
    wait_for(lambda: logged(url, "gone-early", 1), 10.0)
    echo: Any = {"role": "assistant", "content": [{"type": "text", "text": "All done."}]}
    with anthropic_client(url, default_headers={"x-session-id": "gone-early"}) as c:
        c.messages.create(model="m", max_tokens=8, messages=[first, echo, {"role": "user", "content": "Thanks"}])
    found = logged(url, "gone-early", 2)
    assert found["branch_count"] == 1, found
    assert [r["error"] for r in found["requests"]] == [None, None]


def test_an_error_event_mid_stream_is_relayed_and_the_reply_logged_partial(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState) -> None:
    url = anthropic_proxy()
    anthropic_state.fail_next.append(("stream_error", "overloaded_error", "Overloaded"))
    with anthropic_client(url, default_headers={"x-session-id": "cut"}) as c, pytest.raises(anthropic.APIStatusError):
        with c.messages.stream(model="m", max_tokens=64, messages=[{"role": "user", "content": "go"}]) as stream:
            stream.get_final_message()
    found = logged(url, "cut", 1)
    assert "error event" in found["requests"][0]["error"]


START = (b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message",'
         b'"role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,'
         b'"usage":{"input_tokens":5,"output_tokens":1}}}\n\n'
         b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
         b'"content_block":{"type":"text","text":""}}\n\n'
         b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
         b'"delta":{"type":"text_delta","text":"Half"}}\n\n')
"""A stream's start: a message with half a text block (what an upstream cut short sent)."""


@pytest.mark.parametrize("cut", ["connection", "clean_end"])
def test_a_stream_the_upstream_cuts_short_ends_with_an_error_event(
        anthropic_proxy: Callable[..., str], cut: str) -> None:
    """The upstream closes mid-stream (the connection, or a clean end of the body without
    ``message_stop``): the client gets what came, then an ``error`` event (the SDK raises), and the
    log keeps the reply as far as it came, marked partial."""
    from tests.e2e.raw_http import RawServer

    def answer(head: bytes) -> bytes:
        framing = b"" if cut == "connection" else b"transfer-encoding: chunked\r\n"
        body = START if cut == "connection" else f"{len(START):x}\r\n".encode() + START + b"\r\n0\r\n\r\n"
        length = b"content-length: 100000\r\n" if cut == "connection" else b""  # promised, never sent
        return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n" + framing + length + b"\r\n" + body

    upstream = RawServer(answer)
    try:
        url = anthropic_proxy(anthropic_upstream_url=upstream.url)
        headers = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01", "x-session-id": f"cut-{cut}"}
        body = {"model": "m", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "go"}]}
        r = httpx.post(url + "/v1/messages", json=body, headers=headers, timeout=30)
        assert r.status_code == 200 and r.content.startswith(START), r.content
        tail = r.content[len(START):]
        assert tail.startswith(b"event: error\ndata: ") and b'"type":"api_error"' in tail, tail
        with anthropic_client(url, default_headers={"x-session-id": f"cut-{cut}"}) as c, \
                pytest.raises(anthropic.APIStatusError):
            with c.messages.stream(model="m", max_tokens=64, messages=[{"role": "user", "content": "go"}]) as s:
                s.get_final_message()
        found = logged(url, f"cut-{cut}", 2)
        assert all(r["error"] for r in found["requests"]), found["requests"]
        assert found["messages"][-1]["content"][0]["text"] == "Half"
        assert found["messages"][-1]["x_context_proxy"]["partial"] is True
    finally:
        upstream.close()


@pytest.mark.parametrize("compaction", [True, False])
def test_a_regenerated_or_continued_turn_is_known_stored_without_a_read(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState, monkeypatch: pytest.MonkeyPatch,
        compaction: bool) -> None:
    """The same history sent again (a retry, a regenerate) and the next turn find what this process
    wrote: the end of the request is queued, the stored prefix never read from the database again.
    The pipeline moves the prefix state to the request's end itself (``SessionLog.follow``), the
    defenses on or off (their projection moves it too, but not on every path: a request served
    degraded or refused before it)."""
    from proxy.forward.session_log import SessionLog
    from storage.store import Store

    reads: list[int] = []
    follows: list[int] = []
    original = Store.stored_prefix_len
    follow = SessionLog.follow

    async def counted(self: Store, session_pk: int, chain: list[str]) -> int:
        reads.append(len(chain))
        return await original(self, session_pk, chain)

    def followed(self: SessionLog, chain: list[str]) -> None:
        follows.append(len(chain))
        follow(self, chain)

    monkeypatch.setattr(Store, "stored_prefix_len", counted)
    monkeypatch.setattr(SessionLog, "follow", followed)
    url = anthropic_proxy(compaction_enabled=compaction)
    turn: Any = [{"role": "user", "content": "Again and again"}]
    with anthropic_client(url, default_headers={"x-session-id": "regen"}) as c:
        for n in range(3):
            c.messages.create(model="m", max_tokens=8, messages=turn)
            logged(url, "regen", n + 1)
        echo: Any = {"role": "assistant", "content": [{"type": "text", "text": "OK: Again and again"}]}
        c.messages.create(model="m", max_tokens=8, messages=[*turn, echo, {"role": "user", "content": "More"}])
    found = logged(url, "regen", 4)
    assert len(reads) == 1, reads  # the first request of the session only
    assert found["branch_count"] == 1 and len(found["messages"]) == 4
    assert follows == [1, 1, 1, 3]


def test_odd_bodies_are_forwarded_and_never_a_proxy_error(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState) -> None:
    """Found by breaking it: a block nested 600 deep (parsed, too deep to hash in Python) was a 500;
    ``"messages": []`` with no system lost its record to an IndexError. Both go to the provider,
    which answers them; the deep one is logged (it was forwarded unlogged until the hashing and the
    log took any depth, ``proxy.json_depth``), the empty one not (there is nothing to log of it)."""
    url = anthropic_proxy()
    deep: Any = 1
    for _ in range(600):
        deep = {"a": deep}
    headers = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01", "x-session-id": "odd"}
    with httpx.Client(headers=headers, timeout=30) as http:
        nested = http.post(url + "/v1/messages", json={"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x", "extra": deep}]}]})
        empty = http.post(url + "/v1/messages", json={"model": "m", "max_tokens": 8, "messages": []})
    assert nested.status_code < 500 and empty.status_code < 500, (nested.text, empty.text)
    assert [r.status for r in anthropic_state.requests] == [nested.status_code, empty.status_code]
    assert empty.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": anthropic_state
                            .requests[1].error}, "request_id": empty.json().get("request_id")}
    with httpx.Client(base_url=url, headers={"x-api-key": ANTHROPIC_KEY}, timeout=30) as http:
        session = wait_for(lambda: (r := http.get("/sessions/odd")).status_code == 200 and r.json(), 10.0)
        assert session and session["request_count"] == 1, session  # the deep request's record alone
        (turn,) = http.get("/sessions/odd/messages").json()["data"]
    assert turn["content"][0]["extra"] == deep


def test_a_stream_event_past_the_splitter_bound_marks_the_reply_cut(anthropic_proxy: Callable[..., str]) -> None:
    """An event over ``SSESplitter.MAX_EVENT_BYTES``, arriving in pieces (found by breaking it),
    reaches the client whole but cannot be read for the log: the reply is logged as far as it
    came, marked, never as a whole but empty answer."""
    import socket
    import threading
    import time

    from proxy.forward.sse import SSESplitter

    text = b"x" * (SSESplitter.MAX_EVENT_BYTES + 1024)
    head = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"'
    end = (b'"}}\n\nevent: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
           b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
           b'"usage":{"output_tokens":9}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n')
    stream = START + head + text + end
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:  # the event's first 8 MB, a pause, then the rest with its end
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            length = int(data.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(data.split(b"\r\n\r\n", 1)[1]) < length:
                data += conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: "
                         + str(len(stream)).encode() + b"\r\nconnection: close\r\n\r\n")
            cut = len(START) + len(head) + SSESplitter.MAX_EVENT_BYTES + 512
            conn.sendall(stream[:cut])
            time.sleep(0.5)
            conn.sendall(stream[cut:])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        url = anthropic_proxy(anthropic_upstream_url=f"http://127.0.0.1:{listener.getsockname()[1]}")
        headers = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01", "x-session-id": "huge"}
        body = {"model": "m", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "go"}]}
        r = httpx.post(url + "/v1/messages", json=body, headers=headers, timeout=60)
        assert r.status_code == 200 and r.content == stream  # relayed whole
        found = logged(url, "huge", 1)
        assert "stream_log_max_bytes" in (found["requests"][0]["error"] or ""), found["requests"]
        assert found["messages"][-1]["x_context_proxy"]["partial"] is True
    finally:
        thread.join(10)
        listener.close()


def test_other_spellings_of_the_messages_path_are_refused(anthropic_proxy: Callable[..., str],
                                                         anthropic_state: FakeAnthropicState) -> None:
    """``/v1/messages/``, ``/v1/Messages``, ``/v1/messages;x=1`` would be relayed past the log: a 400,
    as for chat completions spelt another way; the sub-resources stay reachable."""
    url = anthropic_proxy()
    headers = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"}
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    for path in ("/v1/messages/", "/v1/Messages", "/v1/messages;x=1", "/v1//messages"):
        r = httpx.post(url + path, json=body, headers=headers, timeout=30)
        assert r.status_code == 400 and r.json()["type"] == "error", (path, r.text)
        assert "POST /v1/messages exactly" in r.json()["error"]["message"]
    assert anthropic_state.requests == []
    assert httpx.post(url + "/v1/messages/count_tokens", json={"model": "m", "messages": body["messages"]},
                      headers=headers, timeout=30).status_code == 200


def test_the_session_says_which_api_it_speaks(anthropic_proxy: Callable[..., str],
                                             anthropic_state: FakeAnthropicState) -> None:
    url = anthropic_proxy()
    with anthropic_client(url, default_headers={"x-session-id": "speaks"}) as c:
        c.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert logged(url, "speaks", 1)["api"] == "messages"


def test_messages_request_ids_come_from_the_apps_one_entropy_pool(
        anthropic_proxy: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The Messages pipeline draws its request ids from the chat pipeline's pool (one bound, one
    read of system entropy per 682 ids), not from ``secrets`` per id."""
    from types import SimpleNamespace

    from proxy.forward import session_log
    from proxy.forward.entropy import EntropyPool

    made: list[EntropyPool] = []
    drawn: list[tuple[EntropyPool, str]] = []
    init, draw = EntropyPool.__init__, EntropyPool.hex

    def counted_init(self: EntropyPool, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        init(self, *args, **kwargs)

    def counted_draw(self: EntropyPool, chars: int) -> str:
        drawn.append((self, draw(self, chars)))
        return drawn[-1][1]

    def no_token_hex(n: int) -> str:
        raise AssertionError("a request id read system entropy alone")

    monkeypatch.setattr(EntropyPool, "__init__", counted_init)
    monkeypatch.setattr(EntropyPool, "hex", counted_draw)
    monkeypatch.setattr(session_log, "secrets", SimpleNamespace(token_hex=no_token_hex))
    url = anthropic_proxy()
    ids = []
    with anthropic_client(url, default_headers={"x-session-id": "ids"}) as c:
        for stream in (False, True):
            raw = c.messages.with_raw_response.create(model="m", max_tokens=8, stream=stream,
                                                      messages=[{"role": "user", "content": "Hi"}])
            ids.append(raw.headers["x-context-proxy-request-id"])
            raw.parse()
    assert len(made) == 1 and len(drawn) == 2 and all(pool is made[0] for pool, _ in drawn)
    assert [i[-12:] for i in ids] == [hex_ for _, hex_ in drawn]
