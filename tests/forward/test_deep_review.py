"""Adversarial review of the deep-values branch: replies and rounds nested past what Python's
``==`` and the stdlib's writer recurse (about 950 levels in a request's stack; orjson reads 1,024),
in places the deep fallbacks do not cover. In process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import orjson

from tests.forward.test_deep_replies import relayed_chat_stream
from tests.support.inprocess import (
    FakeProvider,
    InProcessProxy,
    session_messages,
    start_messages_inprocess,
    wait_session,
)
from tests.support.values import nested_text

DEPTH = 1015

_CHUNK = b'data: {"id":"chatcmpl-deep","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":'


async def test_a_chat_stream_text_chunk_with_a_deep_field_is_relayed_and_logged(
        inprocess_proxy: InProcessProxy, fake_provider: FakeProvider) -> None:
    """A text chunk carrying a field nested 1,015 deep (orjson reads it; 900 passed): the text template's probe
    compares the chunk's two parses with ``==``, which recurses as deep as the field."""
    deep = b',"x_state":' + nested_text(DEPTH).encode()
    stream = [
        _CHUNK + b'[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]' + deep + b"}\n\n",
        _CHUNK + b'[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]' + deep + b"}\n\n",
        _CHUNK + b'[{"index":0,"delta":{"content":"lo"},"finish_reason":null}]' + deep + b"}\n\n",
        _CHUNK + b'[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
        b"data: [DONE]\n\n",
    ]
    body = await relayed_chat_stream(inprocess_proxy, fake_provider, stream)
    assert body == b"".join(stream), body[-600:]
    logged = await session_messages(inprocess_proxy.http, "deep")
    assert logged[1]["content"] == "Hello"


def sse(name: str, data: bytes) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"


def messages_stream(deep: bytes) -> list[bytes]:
    start = {"type": "message_start", "message": {
        "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 1}}}
    delta = b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"%s"}' + deep + b"}"
    return [
        sse("message_start", orjson.dumps(start)),
        sse("content_block_start", b'{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}'),
        sse("content_block_delta", delta.replace(b"%s", b"Hel")),
        sse("content_block_delta", delta.replace(b"%s", b"lo")),
        sse("content_block_stop", b'{"type":"content_block_stop","index":0}'),
        sse("message_delta", b'{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
                             b'"usage":{"output_tokens":2}}'),
        sse("message_stop", b'{"type":"message_stop"}'),
    ]


async def request_body(receive: Any) -> bytes:
    """An ASGI request's whole body."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


class RawMessagesProvider:
    """An Anthropic upstream answering every request with the event stream ``events``, as bytes."""

    def __init__(self, events: list[bytes]) -> None:
        self.events = events
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.bodies.append(await request_body(receive))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for event in self.events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


async def test_a_messages_stream_text_delta_with_a_deep_field_is_relayed_and_logged(
        tmp_path: Path, sqlite_template: Path) -> None:
    """As the chat one: the Messages text template's probe compares two parses with ``==``."""
    shutil.copyfile(sqlite_template, tmp_path / "log.db")
    events = messages_stream(b',"x_state":' + nested_text(DEPTH).encode())
    provider = RawMessagesProvider(events)
    body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": True,
            "messages": [{"role": "user", "content": "go"}]}
    async with start_messages_inprocess(f"sqlite:///{tmp_path}/log.db", provider) as http:
        async with http.stream("POST", "/v1/messages", json=body, headers={"x-session-id": "deep"}) as resp:
            got = await resp.aread()
        assert resp.status_code == 200 and got == b"".join(events), got[-300:]
        logged = await session_messages(http, "deep")
    assert logged[1]["content"] == [{"type": "text", "text": "Hello"}]


class ScriptedMessagesProvider:
    """An Anthropic upstream answering each request with the next whole JSON body of ``replies``
    (bytes, as they are), the last one again once they run out."""

    def __init__(self, replies: list[bytes]) -> None:
        self.replies = replies
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.bodies.append(await request_body(receive))
        out = self.replies[min(len(self.bodies), len(self.replies)) - 1]
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out})


def whole(content: bytes, stop: str) -> bytes:
    return (b'{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":' + content
            + b',"stop_reason":"' + stop.encode() + b'","stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":2}}')


async def test_the_proxy_s_own_read_tool_called_with_a_deep_input_is_answered(
        tmp_path: Path, sqlite_template: Path) -> None:
    """The model calls the proxy's read tool (offered: a tool result was offloaded) with an
    ``input`` nested 1,000 deep: ``round_view`` walks it, then ``as_calls`` wrote it with the
    stdlib's ``json.dumps``, which recurses."""
    shutil.copyfile(sqlite_template, tmp_path / "log.db")
    call = (b'[{"type":"tool_use","id":"toolu_r1","name":"context_proxy_read","input":{"query":"x","deep":'
            + nested_text(1000).encode() + b"}}]")
    provider = ScriptedMessagesProvider([whole(call, "tool_use"), whole(b'[{"type":"text","text":"Done."}]', "end_turn")])
    big = "\n".join(f"line {i}: " + "word " * 20 for i in range(400))
    body = {"model": "claude-sonnet-4-5", "max_tokens": 64,
            "tools": [{"name": "read_file", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "go"},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file",
                                                            "input": {"path": "a"}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": big}]}]}
    async with start_messages_inprocess(f"sqlite:///{tmp_path}/log.db", provider, offload_tool_tokens=200) as http:
        resp = await http.post("/v1/messages", json=body, headers={"x-session-id": "deep"})
        assert b"context_proxy_read" in provider.bodies[0]  # (offered)
        assert resp.status_code == 200, resp.text[-300:]
        assert resp.json()["content"] == [{"type": "text", "text": "Done."}]


async def test_the_echo_of_a_served_round_nested_deeper_than_equality_recurses_is_forwarded(
        tmp_path: Path, sqlite_template: Path) -> None:
    """A served round whose shown block is nested 1,012 deep (a ``server_tool_use`` input, beside
    the proxy's read call): on the next request ``after_rounds`` compares the client's echo of it
    with the stored round by ``!=``, which recurses as deep (the budget's ``DeepBudgetExceeded``
    is caught there, ``RecursionError`` was not)."""
    shutil.copyfile(sqlite_template, tmp_path / "log.db")
    block = (b'{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{"q":'
             + nested_text(1012).encode() + b"}}")
    call = b'[' + block + b',{"type":"tool_use","id":"toolu_r1","name":"context_proxy_read","input":{"query":"x"}}]'
    provider = ScriptedMessagesProvider([whole(call, "tool_use"), whole(b'[{"type":"text","text":"Done."}]', "end_turn"),
                                         whole(b'[{"type":"text","text":"Fine."}]', "end_turn")])
    big = "\n".join(f"line {i}: " + "word " * 20 for i in range(400))
    turns = [{"role": "user", "content": "go"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file",
                                                "input": {"path": "a"}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": big}]}]
    body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "tools": [{"name": "read_file", "input_schema": {"type": "object"}}]}
    headers = {"x-session-id": "deep", "content-type": "application/json"}
    async with start_messages_inprocess(f"sqlite:///{tmp_path}/log.db", provider, offload_tool_tokens=200) as http:
        resp = await http.post("/v1/messages", json=body | {"messages": turns}, headers=headers)
        assert resp.status_code == 200, resp.text[-300:]
        assert b"server_tool_use" in resp.content and b"Done." in resp.content
        await wait_session(http, "deep", 1)
        echo = resp.content[resp.content.index(b'"content":') + 10:resp.content.index(b',"stop_reason"')]
        raw = json.dumps(body | {"messages": [*turns, {"role": "assistant", "content": "ECHO"},
                                              {"role": "user", "content": "and?"}]}).encode()
        raw = raw.replace(b'"ECHO"', echo)
        again = await http.post("/v1/messages", content=raw, headers=headers)
        assert again.status_code == 200, again.text[-300:]
        assert again.json()["content"] == [{"type": "text", "text": "Fine."}]
