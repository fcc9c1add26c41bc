"""SSE splitting and reply reassembly (proxy/forward/sse.py, proxy/forward/reply_assembler.py) on realistic chunkings."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.forward.reply_assembler import ReplyAssembler
from proxy.forward.sse import SSESplitter


def chunk(delta: dict, finish: str | None = None, usage: dict | None = None) -> bytes:
    body: dict = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        body = {"object": "chat.completion.chunk", "choices": [], "usage": usage}
    return b"data: " + orjson.dumps(body) + b"\n\n"


STREAM = b"".join([
    b": keep-alive\n\n",
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hel"}),
    chunk({"content": "lo"}),
    chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "read", "arguments": ""}}]}),
    chunk({"tool_calls": [{"index": 1, "id": "c2", "type": "function", "function": {"name": "write", "arguments": "{\"a\""}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"p\": 1}"}}]}),
    chunk({"tool_calls": [{"index": 1, "function": {"arguments": ": 2}"}}]}),
    chunk({}, finish="tool_calls"),
    chunk({}, usage={"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}),
    b"data: [DONE]\n\n",
])


def assemble(pieces: list[bytes]) -> ReplyAssembler:
    splitter, assembler = SSESplitter(), ReplyAssembler()
    for piece in pieces:
        for event in splitter.feed(piece):
            assembler.add(event)
    for event in splitter.flush():
        assembler.add(event)
    return assembler


def test_reassembles_content_parallel_calls_finish_and_usage_for_any_chunking() -> None:
    for size in (1, 7, 64, len(STREAM)):
        a = assemble([STREAM[i : i + size] for i in range(0, len(STREAM), size)])
        assert a.message() == {"role": "assistant", "content": "Hello", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{\"p\": 1}"}},
            {"id": "c2", "type": "function", "function": {"name": "write", "arguments": "{\"a\": 2}"}},
        ]}
        assert a.finish_reason == "tool_calls" and a.done and a.usage["total_tokens"] == 8


def test_crlf_framing_and_event_names() -> None:
    events = SSESplitter().feed(b"event: error\r\ndata: {\"error\": {\"message\": \"x\"}}\r\n\r\n")
    assert events[0].event == "error" and orjson.loads(events[0].data)["error"]["message"] == "x"


def test_tool_calls_only_reply_has_null_content_and_empty_stream_is_flagged() -> None:
    a = assemble([chunk({"role": "assistant"}), chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": "{}"}}]})])
    assert a.message()["content"] is None
    empty = assemble([chunk({"role": "assistant"}), b"data: [DONE]\n\n"])
    assert empty.empty and empty.done


def test_line_ends_split_between_chunks_and_lone_cr() -> None:
    """WHATWG: a line ends at CRLF, LF or CR; a CR at a chunk's end and the LF opening the next are
    one line end (else the blank line after an event is lost and two events run together)."""
    stream = b'data: {"a": 1}\r\n\r\ndata: [DONE]\r\n\r\n'
    for cut in range(1, len(stream)):
        splitter = SSESplitter()
        events = splitter.feed(stream[:cut]) + splitter.feed(stream[cut:]) + splitter.flush()
        assert [e.data for e in events] == [b'{"a": 1}', b"[DONE]"], cut
    events = SSESplitter().feed(b"data: x\r\rdata: y\r\n\n: c\n\ndata: z\n\n")
    assert [e.data for e in events] == [b"x", b"y", b"z"]
    splitter = SSESplitter()
    assert splitter.feed(b"data: a\r") == [] and splitter.feed(b"\n") == [] and [e.data for e in splitter.feed(b"\n")] == [b"a"]
    splitter = SSESplitter()  # (an empty chunk between the CR and the LF: nothing)
    assert splitter.feed(b"event: e\r") == splitter.feed(b"") == [] and not splitter.idle
    assert [(e.event, e.data) for e in splitter.feed(b"\ndata: a\r\n\r\n")] == [("e", b"a")]


def test_an_error_field_is_read_as_an_error_event() -> None:
    """llama.cpp before mid-2025 wrote ``error: {...}``: the SSE rules would drop it."""
    (event,) = SSESplitter().feed(b'error: {"code": 500, "message": "x"}\n\n')
    assert event.event == "error" and orjson.loads(event.data)["code"] == 500
    a = assemble([b'error: {"code": 500, "message": "x"}\n\n', b"data: [DONE]\n\n"])
    assert a.hidden_error and not a.upstream_error and a.errors == [{"code": 500, "message": "x"}] and a.empty


def test_an_error_only_in_the_error_field_is_not_one_clients_saw() -> None:
    """llama.cpp's older ``error: {...}`` is an unknown SSE field to the SDKs: the assembler records
    it, but not as an error the client was told of, so the relay still ends with its own error event."""
    field_only = SSESplitter().feed(b'error: {"code":500,"message":"boom"}\n\n')
    in_data = SSESplitter().feed(b'data: {"error":{"message":"boom"}}\n\n')
    a = ReplyAssembler()
    a.add(field_only[0])
    assert a.errors and a.hidden_error and not a.upstream_error
    a.add(in_data[0])
    assert a.upstream_error


def test_an_event_too_long_to_keep_is_dropped_and_the_next_one_is_read(monkeypatch: Any) -> None:
    monkeypatch.setattr(SSESplitter, "MAX_EVENT_BYTES", 64)
    s = SSESplitter()
    assert s.feed(b"data: " + b"x" * 50) == [] and s.feed(b"y" * 50) == []
    assert len(s._buf) <= 64 and s.dropped == 1
    (event,) = s.feed(b"z\n\ndata: {\"ok\": 1}\n\n")
    assert orjson.loads(event.data) == {"ok": 1}


def test_tool_calls_of_odd_indexes_or_arguments_are_logged_not_raised() -> None:
    """Tool-call pieces whose indexes do not compare (a string beside a number) or whose arguments
    are not a string still give a message (review: ``message()`` raised ``TypeError`` and the
    streamed request was never logged): the calls in the order they came, arguments as their JSON
    text."""
    from proxy.forward.sse import SSEEvent

    def fed(calls: list[dict[str, Any]]) -> ReplyAssembler:
        a = ReplyAssembler()
        a.add(SSEEvent(None, orjson.dumps({"choices": [{"index": 0, "delta": {"tool_calls": calls}}]})))
        return a

    mixed = fed([{"index": "0", "function": {"name": "f"}}, {"function": {"name": "g", "arguments": "{}"}}])
    assert [c["function"] for c in mixed.message()["tool_calls"]] == [{"name": "f", "arguments": ""},
                                                                       {"name": "g", "arguments": "{}"}]
    number = fed([{"index": 0, "function": {"name": "f", "arguments": 5}}])
    assert number.message()["tool_calls"][0]["function"] == {"name": "f", "arguments": "5"}
    parts = fed([{"index": 1, "function": {"name": "b", "arguments": {"x": [1]}}}, {"index": 0, "function": {"name": "a"}}])
    assert [c["function"]["name"] for c in parts.message()["tool_calls"]] == ["a", "b"]  # index order, as before
    assert parts.message()["tool_calls"][1]["function"]["arguments"] == '{"x":[1]}'
