"""A reply the provider nested deeper than the proxy's recursive helpers go (orjson writes 254
levels; ``hash_view`` and the stdlib recurse about 500): the client gets it as the provider sent
it, the log keeps it, readable through the read API as it came, and the client's echo of it on
the next turn continues the same branch (the logged reply and the echo hash alike). In process,
against the strict fakes, on SQLite.

Before: a Messages reply (streamed or whole) was never logged (``hash_view``'s
``RecursionError``; a whole one cost the client its answer too: a 500), nor a chat reply
carrying such a field (orjson's depth error: the request's record and turns lost with it); a
chat stream's tool call whose ``arguments`` came as a JSON value that deep was logged without
them."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from storage.records import NewMessage
from tests.fakes.anthropic import create_fake_anthropic, reply, tool_use
from tests.support.inprocess import (
    CLIENT_KEY,
    FakeProvider,
    InProcessProxy,
    session_messages,
    start_messages_inprocess,
)
from tests.support.values import nested, nested_text, same

DEPTH = 600
TOOLS = [{"name": "f", "input_schema": {"type": "object"}}]


def deep_input() -> Any:
    return {"path": "a.txt", "tree": nested(DEPTH, {"leaf": 1.5, "flag": True})}


def streamed_input(body: bytes) -> Any:
    """The ``tool_use`` input of a Messages event stream, joined from its ``partial_json``."""
    pieces = []
    for event in body.split(b"\n\n"):
        data = next((line[6:] for line in event.split(b"\n") if line.startswith(b"data: ")), None)
        delta = json.loads(data).get("delta", {}) if data else {}
        if delta.get("type") == "input_json_delta":
            pieces.append(delta["partial_json"])
    return json.loads("".join(pieces))


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_a_deep_messages_reply_is_relayed_logged_and_its_echo_continues_the_branch(
        tmp_path: Path, sqlite_template: Path, stream: bool) -> None:
    shutil.copyfile(sqlite_template, tmp_path / "log.db")
    provider, state = create_fake_anthropic()
    state.script.extend([reply(tool_use("f", deep_input(), id="toolu_01")), reply("Done.")])
    first: Any = {"role": "user", "content": "go"}
    body = {"model": "claude-sonnet-4-5", "max_tokens": 4096, "tools": TOOLS, "stream": stream}
    headers = {"x-session-id": "deep"}
    async with start_messages_inprocess(f"sqlite:///{tmp_path}/log.db", provider) as http:
        resp = await http.post("/v1/messages", json=body | {"messages": [first]}, headers=headers)
        assert resp.status_code == 200, resp.text
        if stream:
            assert same(streamed_input(resp.content), deep_input())
        else:
            assert resp.json() == state.message_requests[-1].response  # the provider's Message
        logged = await session_messages(http, "deep")
        assert [m["role"] for m in logged] == ["user", "assistant"]
        block = logged[1]["content"][0]
        assert block["id"] == "toolu_01" and same(block["input"], deep_input())
        echo = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01", "name": "f",
                                                  "input": deep_input()}]}
        result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "ok"}]}
        raw = json.dumps(body | {"messages": [first, echo, result]}).encode()
        again = await http.post("/v1/messages", content=raw, headers=headers | {"content-type": "application/json"})
        assert again.status_code == 200, again.text
        assert state.message_requests[-1].raw == raw
        logged = await session_messages(http, "deep", requests=2)
        session = (await http.get("/sessions/deep")).json()
    assert [m["role"] for m in logged] == ["user", "assistant", "user", "assistant"]
    assert session["branch_count"] == 1  # the echo is the logged reply: one branch


async def test_a_deep_chat_reply_is_logged_and_its_echo_continues_the_branch(
        inprocess_proxy: InProcessProxy, fake_provider: FakeProvider) -> None:
    fake_provider.state.script.append({"role": "assistant", "content": "hi", "vendor_state": deep_input()})
    first = {"role": "user", "content": "hello"}
    headers = {"x-session-id": "deep"}
    resp = await inprocess_proxy.chat({"model": "gpt-4o", "messages": [first]}, headers=headers)
    assert resp.status_code == 200, resp.text
    message = resp.json()["choices"][0]["message"]
    assert same(message["vendor_state"], deep_input())
    logged = await session_messages(inprocess_proxy.http, "deep")
    assert [m["role"] for m in logged] == ["user", "assistant"] and same(logged[1]["vendor_state"], deep_input())
    again = await inprocess_proxy.chat({"model": "gpt-4o", "messages": [first, message, {"role": "user", "content": "so?"}]},
                                       headers=headers)
    assert again.status_code == 200, again.text
    assert len(await session_messages(inprocess_proxy.http, "deep", requests=2)) == 4
    assert (await inprocess_proxy.http.get("/sessions/deep")).json()["branch_count"] == 1


_CHUNK = b'data: {"id":"chatcmpl-deep","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":'


async def relayed_chat_stream(inprocess_proxy: InProcessProxy, fake_provider: FakeProvider, stream: list[bytes]) -> bytes:
    """The body the client gets for a streamed chat request (session ``deep``) the provider answers
    with the SSE chunks ``stream``, as bytes; its status 200."""
    fake_provider.state.fail_next.append(("sse", stream))
    async with inprocess_proxy.http.stream("POST", "/v1/chat/completions", headers={"x-session-id": "deep"},
                                           json={"model": "gpt-4o", "stream": True,
                                                 "messages": [{"role": "user", "content": "go"}]}) as resp:
        body = await resp.aread()
    assert resp.status_code == 200, body[-600:]
    return body


async def test_a_chat_stream_s_tool_call_arguments_sent_as_a_deep_value_are_logged(
        inprocess_proxy: InProcessProxy, fake_provider: FakeProvider) -> None:
    """Some servers send a tool call's ``arguments`` as a JSON value, not its text: the relay passes
    the chunks on as they came; the log keeps the arguments as that value's JSON text."""
    call = (b'{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":'
            + orjson.dumps({"tree": "T"}).replace(b'"T"', nested_text(DEPTH).encode()) + b"}}")
    stream = [
        _CHUNK + b'[{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}]}\n\n',
        _CHUNK + b'[{"index":0,"delta":{"tool_calls":[' + call + b']},"finish_reason":null}]}\n\n',
        _CHUNK + b'[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n',
        b"data: [DONE]\n\n",
    ]
    assert await relayed_chat_stream(inprocess_proxy, fake_provider, stream) == b"".join(stream)  # as it came
    logged = await session_messages(inprocess_proxy.http, "deep")
    calls = logged[1]["tool_calls"]
    assert calls[0]["function"]["arguments"] == '{"tree":' + nested_text(DEPTH) + "}"


async def test_the_read_api_serves_a_logged_turn_nested_deeper_than_its_json_writer_recurses(
        inprocess_proxy: InProcessProxy) -> None:
    """A logged turn nested 1,500 deep (a streamed tool input, parsed alone, may pass the 1,024
    levels a body holds by the levels around it; stored here through the app's store): its page
    of messages and the session's archive are served (before: the stdlib's writer raised
    ``RecursionError``, a 500; the archive's orjson calls cut its stream)."""
    http: httpx.AsyncClient = inprocess_proxy.http
    await inprocess_proxy.chat({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
                               headers={"x-session-id": "deep"})
    logged = await session_messages(http, "deep")
    state = inprocess_proxy.app.state.proxy
    session = await state.store.find_session("deep", state.auth.tenant(CLIENT_KEY))
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"tree": nested(1500)}}}
    turn = {"role": "assistant", "content": None, "tool_calls": [call], "state": nested(1500)}
    leaf = "f" * 64
    row = NewMessage(chain_hash=leaf, parent_hash=logged[-1]["id"], seq=2, role="assistant", message=turn)
    await state.store.append_messages(session.pk, [row], datetime.now(UTC))
    page = await http.get("/sessions/deep/messages", params={"leaf": leaf})
    assert page.status_code == 200, page.text
    served = page.content  # (read as text: no parser here reads 1,505 levels, orjson stops at 1,024)
    assert b'"state":' + nested_text(1500).encode() + b',"internal":false}' in served
    assert b'"arguments":{"tree":' + nested_text(1500).encode() + b"}" in served
    async with http.stream("GET", "/sessions/deep/archive", params={"leaf": leaf}) as archive:
        text = (await archive.aread()).decode()
    assert archive.status_code == 200 and '{"tree":' + nested_text(1500) + "}" in "".join(text.split())  # (wrapped)
