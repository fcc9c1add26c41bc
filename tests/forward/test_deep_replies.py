"""A reply the provider nested deeper than the proxy's recursive helpers go (orjson writes 254
levels; the stdlib's writer recurses about 1,000): logged as it came and readable through the
read API. In process, against the strict fake, on SQLite.

Before: a chat stream's tool call whose ``arguments`` came as a JSON value that deep was logged
without them; a logged turn that deep could not be read back (a 500, a cut archive)."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import orjson

from storage.records import NewMessage
from tests.support.inprocess import (
    CLIENT_KEY,
    FakeProvider,
    InProcessProxy,
    session_messages,
)
from tests.support.values import nested, nested_text

DEPTH = 600

_CHUNK = b'data: {"id":"chatcmpl-deep","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":'


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
    fake_provider.state.fail_next.append(("sse", stream))
    async with inprocess_proxy.http.stream("POST", "/v1/chat/completions", headers={"x-session-id": "deep"},
                                           json={"model": "gpt-4o", "stream": True,
                                                 "messages": [{"role": "user", "content": "go"}]}) as resp:
        body = await resp.aread()
    assert resp.status_code == 200 and body == b"".join(stream)  # relayed as it came
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
