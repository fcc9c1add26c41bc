"""proxy/forward/messages_sse.py: a Messages stream's reply reassembled from its events, fed in
chunks of every size; bounded; odd events skipped, never raised."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.forward.messages_sse import MessagesAssembler
from proxy.forward.sse import SSESplitter
from proxy.json_text import parse_json
from tests.fakes.anthropic import reply, text, thinking, tool_use
from tests.fakes.anthropic.cache import CacheUsage
from tests.fakes.anthropic.compose import compose
from tests.fakes.anthropic.thinking import ThinkingSigner
from tests.fakes.anthropic.wire import message_object, sse_event, stream_events, usage_object


def stream_of(message: dict[str, Any]) -> bytes:
    return b"".join(sse_event(name, data) for name, data in stream_events(message))


def assembled(raw: bytes, size: int, max_bytes: int = 1 << 20) -> MessagesAssembler:
    splitter, assembler = SSESplitter(), MessagesAssembler(max_bytes)
    for i in range(0, len(raw), size):
        for event in splitter.feed(raw[i:i + size]):
            assembler.add(event)
    for event in splitter.flush():
        assembler.add(event)
    return assembler


def a_message() -> dict[str, Any]:
    body: Any = {"model": "m", "max_tokens": 512, "messages": [{"role": "user", "content": "hi"}],
                 "thinking": {"type": "enabled", "budget_tokens": 256}}
    composed = compose(body, reply(thinking("Think first."), text("Héllo, wörld " * 20),
                                   tool_use("lookup", {"q": "a \"quoted\" value", "n": [1, 2]}, id="toolu_01a")),
                       ThinkingSigner())
    usage = usage_object(CacheUsage(10, 0, 0), composed.output_tokens, "5m")
    return message_object("msg_01x", "m", composed.content, composed.stop_reason, None, usage)


def test_the_reply_is_the_message_content_whatever_the_chunking() -> None:
    message = a_message()
    raw = stream_of(message)
    for size in (1, 7, 64, len(raw)):
        a = assembled(raw, size)
        assert a.done and not a.upstream_error and not a.truncated
        assert a.message() == {"role": "assistant", "content": message["content"]}
        assert a.stop_reason == "tool_use" and a.usage is not None
        assert a.usage["output_tokens"] == message["usage"]["output_tokens"]


def test_an_error_event_a_cut_stream_and_the_bound() -> None:
    message = a_message()
    events = stream_events(message)
    cut = b"".join(sse_event(n, d) for n, d in events[:4])
    a = assembled(cut, 5)
    assert not a.done and not a.empty  # as far as it came
    error = cut + sse_event("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    assert assembled(error, 9).upstream_error
    small = assembled(stream_of(message), 50, max_bytes=200)
    assert small.truncated and len(json.dumps(small.message())) < 2000
    # past the bound the content stops, the end of the message is still read
    assert small.done and small.stop_reason == "tool_use" and small.usage is not None
    assert small.usage["output_tokens"] == message["usage"]["output_tokens"]


def test_a_signature_is_replaced_not_appended() -> None:
    raw = b"".join(sse_event(n, d) for n, d in [
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "signature_delta", "signature": "first"}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "signature_delta", "signature": "second"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0})])
    assert assembled(raw, 13).message()["content"] == [{"type": "thinking", "thinking": "", "signature": "second"}]


def test_odd_events_are_skipped() -> None:
    raw = (b"event: content_block_delta\ndata: {\"index\": 3, \"delta\": {\"type\": \"text_delta\", \"text\": \"x\"}}\n\n"
           b"event: message_start\ndata: not json\n\n"
           b"event: content_block_start\ndata: {\"index\": \"0\", \"content_block\": {}}\n\n"
           b"event: content_block_start\ndata: {\"index\": 0, \"content_block\": {\"type\": \"tool_use\", \"id\": \"t\","
           b" \"name\": \"n\", \"input\": {}}}\n\n"
           b"event: content_block_delta\ndata: {\"index\": 0, \"delta\": {\"type\": \"input_json_delta\","
           b" \"partial_json\": \"{\\\"a\\\": \"}}\n\n"
           b"event: content_block_stop\ndata: {\"index\": 0}\n\n"
           b"event: brand_new_event\ndata: {\"x\": 1}\n\n")
    a = assembled(raw, 11)
    assert a.message() == {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "n", "input": {}, "input_json": "{\"a\": "}]}


def test_events_are_read_by_orjson_and_only_what_it_refuses_by_parse_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shortcut (``orjson.loads`` on each event) is taken for every event it reads; a text delta
    with a lone surrogate escape (a model cut mid-character) goes through ``parse_json``, as it did
    before the shortcut: U+FFFD in the reply; what neither reads is skipped."""
    from proxy.forward import messages_sse

    fallbacks: list[Any] = []

    def counted(data: Any) -> Any:
        fallbacks.append(data)
        return parse_json(data)

    monkeypatch.setattr(messages_sse, "parse_json", counted)
    message = a_message()
    assert assembled(stream_of(message), 64).message() == {"role": "assistant", "content": message["content"]}
    assert [f for f in fallbacks if isinstance(f, bytes)] == []  # every event read by orjson itself
    fallbacks.clear()  # (a tool_use block's joined input is parsed by parse_json at its end)
    raw = b"".join(sse_event(n, d) for n, d in [
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}})])
    raw += (b"event: content_block_delta\ndata: {\"type\": \"content_block_delta\", \"index\": 0,"
            b" \"delta\": {\"type\": \"text_delta\", \"text\": \"half \\ud83d\"}}\n\n"
            b"event: content_block_delta\ndata: {\"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": \"x\"\n\n"
            b"data: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": \"text_delta\","
            b" \"text\": \"!\"}}\n\n")
    a = assembled(raw, 1 << 10)
    assert a.message()["content"] == [{"type": "text", "text": "half \ufffd!"}]  # the nameless event too
    assert len(fallbacks) == 2  # the escape, and the event that is no JSON


def test_a_nameless_content_event_past_the_bound_is_not_read() -> None:
    start = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "y" * 40}}
    raw = b"data: " + json.dumps(start).encode() + b"\n\n" + (b"data: " + json.dumps(delta).encode() + b"\n\n") * 3
    a = assembled(raw, 1 << 10, max_bytes=len(json.dumps(start)) + len(json.dumps(delta)) + 5)
    assert a.truncated and a.message()["content"] == [{"type": "text", "text": "y" * 40}]
    raw = b"data: " + json.dumps(delta).encode() + b"\n\n" + b"data: " + json.dumps(start).encode() + b"\n\n"
    late_start = assembled(raw, 1 << 10, max_bytes=len(json.dumps(delta)) + 5)
    assert late_start.truncated and late_start.empty


def test_events_whose_type_is_not_a_string_are_skipped_not_raised() -> None:
    """A delta whose ``type`` (or a nameless event whose ``type``) is a list or an object is skipped
    (review: the list raised ``TypeError`` from the delta lookup, the client's stream was cut and the
    reply lost); the rest of the message is read as it came."""
    message = a_message()
    odd = (b"event: content_block_delta\ndata: {\"index\": 1, \"delta\": {\"type\": [\"text_delta\"], \"text\": \"x\"}}\n\n"
           b"event: content_block_delta\ndata: {\"index\": 1, \"delta\": {\"type\": {\"a\": 1}, \"text\": \"x\"}}\n\n"
           b"data: {\"type\": []}\n\n"
           b"data: {\"type\": {\"k\": \"content_block_delta\"}, \"index\": 1, \"delta\": {\"type\": \"text_delta\"}}\n\n")
    events = list(stream_events(message))
    at = 1 + next(i for i, (name, data) in enumerate(events) if name == "content_block_start" and data["index"] == 1)
    raw = b"".join(sse_event(name, data) for name, data in events[:at]) + odd \
        + b"".join(sse_event(name, data) for name, data in events[at:])
    assert assembled(raw, 7).message() == assembled(stream_of(message), 7).message()


def _by_concatenation(events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The blocks as the assembler built them before its text was joined once: each text or
    thinking delta added to its block's field with ``+`` (quadratic on a long reply), the field
    set where the first delta sets it; ``signature_delta`` replaces, ``citations_delta`` appends."""
    blocks: dict[int, dict[str, Any]] = {}
    for name, data in events:
        if name == "content_block_start":
            blocks[data["index"]] = dict(data["content_block"])
        elif name == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            if delta["type"] in ("text_delta", "thinking_delta"):
                field = "text" if delta["type"] == "text_delta" else "thinking"
                before = block.get(field)
                block[field] = (before if isinstance(before, str) else "") + delta[field]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "citations_delta":
                block["citations"] = [*block.get("citations", []), delta["citation"]]
    return [blocks[i] for i in sorted(blocks)]


def test_a_long_reply_of_many_deltas_is_the_concatenation_of_its_pieces() -> None:
    """A reply of 20,000 deltas (text, thinking with its signature, a citation between text deltas,
    a block with no text field at its start, a field that was not a string, a block replaced at
    its index, the reply read half-way): the same blocks, keys in the same order, as adding each
    delta with ``+``; and the text is kept as pieces until ``message()`` joins them."""
    def delta(index: int, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": body}

    def start(index: int, block: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}

    words = [f"wörd{i} " if i % 7 else "\"q\"\n" for i in range(10_000)]
    events = [("message_start", {"type": "message_start", "message": {"role": "assistant", "content": [],
                                                                       "usage": {"input_tokens": 3}}}),
              start(0, {"type": "thinking", "thinking": ""}),
              *(delta(0, {"type": "thinking_delta", "thinking": w}) for w in words[:3000]),
              delta(0, {"type": "signature_delta", "signature": "sig"}),
              start(1, {"type": "text", "text": "Lead: "}),
              *(delta(1, {"type": "text_delta", "text": w}) for w in words[:5000]),
              delta(1, {"type": "citations_delta", "citation": {"type": "char_location", "cited_text": "x"}}),
              *(delta(1, {"type": "text_delta", "text": w}) for w in words[5000:]),
              start(2, {"type": "text", "citations": []}),  # no text field: it comes after ``citations``
              *(delta(2, {"type": "text_delta", "text": w}) for w in words[:4000]),
              start(3, {"type": "text", "text": None}),
              *(delta(3, {"type": "text_delta", "text": w}) for w in words[:2000]),
              start(3, {"type": "text", "text": "again "}),  # the block at 3 replaced
              *(delta(3, {"type": "text_delta", "text": w}) for w in words[:1000])]
    raw = b"".join(sse_event(name, data) for name, data in events)
    assert len([e for e in events if e[0] == "content_block_delta"]) > 20_000
    half = raw.index(b"\n\n", raw.index(b"citations_delta")) + 2  # read after the citation
    splitter, a = SSESplitter(), MessagesAssembler(1 << 30)
    for event in splitter.feed(raw[:half]):
        a.add(event)
    midway = a.message()["content"]
    assert [b.get("text") for b in midway[1:]] == ["Lead: " + "".join(words[:5000])]
    assert len(a._text[1][2]) == 1  # joined once, for the read: the deltas after it are added to the join
    for event in splitter.feed(raw[half:]):
        a.add(event)
    assert len(a._text[1][2]) == 1 + len(words) - 5000  # pieces, not a string copied at each delta
    content = a.message()["content"]
    assert content == _by_concatenation(events)
    assert [list(b) for b in content] == [list(b) for b in _by_concatenation(events)]
    assert list(content[2]) == ["type", "citations", "text"]
    assert content[1]["text"] == "Lead: " + "".join(words)
    assert content[3]["text"] == "again " + "".join(words[:1000])
