"""SSE splitting and reply reassembly (proxy/sse.py) on realistic chunkings."""

from __future__ import annotations

import orjson

from proxy.sse import ReplyAssembler, SSESplitter


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
