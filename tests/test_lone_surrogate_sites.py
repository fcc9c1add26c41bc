"""Every place the proxy reads a client's or the provider's JSON takes a lone surrogate escape
(valid JSON text; ``proxy.json_text``): the request, a reply, a chunk, an error, a tool call."""

from __future__ import annotations

import json

import orjson

from proxy.compaction.overflow import classify_stream_event
from proxy.conversation.chat_request import parse_chat_request
from proxy.defenses.truncate_args import MARKER, truncate_arguments
from proxy.forward.reply_assembler import ReplyAssembler
from proxy.forward.rounds import reply_of as _reply_of
from proxy.forward.sse import SSEEvent
from proxy.forward.streaming import provider_error_event
from proxy.forward.tool_rounds import ToolRounds
from proxy.tools.schemas import parse_arguments

LONE = b"half \\ud83d here"
READ = "half \ufffd here"


def test_request_with_a_lone_surrogate_is_parsed() -> None:
    body = parse_chat_request(b'{"model":"gpt-4o","messages":[{"role":"user","content":"' + LONE + b'","\\udc00":1}]}')
    assert body["messages"][0] == {"role": "user", "content": READ, "\ufffd": 1}


def test_reply_with_a_lone_surrogate_is_usable() -> None:
    data = b'{"choices":[{"message":{"role":"assistant","content":"' + LONE + b'"},"finish_reason":"stop"}],"usage":{"total_tokens":3}}'
    assert _reply_of(data) == ({"role": "assistant", "content": READ}, {"total_tokens": 3}, "stop")


def test_streamed_chunk_with_a_lone_surrogate_is_content_not_an_error() -> None:
    assembler = ReplyAssembler()
    assembler.add(SSEEvent(None, b'{"choices":[{"index":0,"delta":{"role":"assistant","content":"' + LONE + b'"}}]}'))
    assert assembler.errors == [] and not assembler.upstream_error
    assert assembler.message()["content"] == READ


def test_mixed_reply_with_a_lone_surrogate_is_stripped_of_the_proxy_s_calls() -> None:
    data = (b'{"choices":[{"index":0,"message":{"role":"assistant","content":"' + LONE + b'","tool_calls":['
            b'{"id":"a","type":"function","function":{"name":"context_proxy_read","arguments":"{}"}},'
            b'{"id":"b","type":"function","function":{"name":"theirs","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}')
    reply, _, _ = _reply_of(data)
    assert reply is not None
    theirs = [reply["tool_calls"][1]]
    out, kept = ToolRounds.strip(None, data, reply, theirs)  # type: ignore[arg-type]  (uses no state)
    assert orjson.loads(out)["choices"][0]["message"] == {"role": "assistant", "content": READ, "tool_calls": theirs}
    assert kept["tool_calls"] == theirs


def test_provider_error_with_a_lone_surrogate_is_relayed_as_it_came() -> None:
    body = b'{"error":{"message":"' + LONE + b'","type":"server_error"}}'
    assert provider_error_event(body) == b"data: " + body + b"\n\n"


def test_stream_overflow_event_with_a_lone_surrogate_is_recognized() -> None:
    event = (b'{"error":{"message":"This model\'s maximum context length is 8192 tokens. However, your messages resulted in '
             b'9000 tokens. ' + LONE + b'","type":"invalid_request_error","code":"context_length_exceeded"}}')
    overflow = classify_stream_event(event)
    assert overflow is not None and overflow.limit_tokens == 8192


def test_read_tool_arguments_with_a_lone_surrogate_are_read() -> None:
    request = parse_arguments('{"reference":"art_1","query":"' + LONE.decode() + '"}')
    assert not isinstance(request, str)
    assert request.reference == "art_1"


def test_truncated_arguments_with_a_lone_surrogate_can_be_forwarded() -> None:
    arguments = '{"path":"\\ud800' + "x" * 5000 + '","n":18446744073709551617}'
    out = truncate_arguments(arguments, 1000, 100)
    assert out != arguments and MARKER in out
    orjson.dumps({"arguments": out})  # the body is written with orjson: it once refused this (a 500)
    assert json.loads(out) == {"path": "\ufffd" + "x" * 99 + MARKER, "n": 18446744073709551617}
