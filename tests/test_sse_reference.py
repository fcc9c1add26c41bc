"""The incremental SSE splitter and the reply assembler against plain references, on random streams.

``SSESplitter.feed`` takes a chunk of whole events by a split (its usual case) and anything else by
its incremental search; the events must be those of the stream read whole, line ends normalized
first (``_reference_events``), whatever the chunking. ``ReplyAssembler`` must rebuild what a plain
reading of the chunks gives (``_ReferenceAssembler``: the rules of ``proxy.forward.reply_assembler`` written
the long way), malformed shapes included.
"""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest

from proxy.forward import sse
from proxy.forward.reply_assembler import ReplyAssembler
from proxy.forward.sse import SSEEvent, SSESplitter
from proxy.json_text import without_lone_surrogates


def _reference_events(stream: bytes) -> list[tuple[str | None, bytes, bytes]]:
    """The events of a whole stream by the rules of ``proxy.forward.sse``'s docstring."""
    text = stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    blocks = text.split(b"\n\n")
    tail = blocks.pop()  # (no blank line after it: what ``flush`` reads)
    out = []
    for block in [*blocks, tail.strip(b"\n")]:
        name: str | None = None
        data: list[bytes] = []
        for line in block.split(b"\n"):
            if not line or line.startswith(b":"):
                continue
            key, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if key == b"data":
                data.append(value)
            elif key == b"event":
                name = value.decode("utf-8", "replace")
            elif key == b"error":
                name = name or "error"
                data.append(value)
        if data or name is not None:
            out.append((name, b"\n".join(data), block))
    return out


def _random_stream(rng: random.Random) -> bytes:
    lines: list[bytes] = []
    for _ in range(rng.randint(0, 12)):
        kind = rng.random()
        if kind < 0.6:
            lines.append(b"data: " + orjson.dumps({"choices": [{"delta": {"content": rng.choice("ab\u00e9:")}}]}))
        elif kind < 0.7:
            lines += [b"event: " + rng.choice([b"error", b"ping", b""]), b"data:" + rng.choice([b"x", b" y", b""])]
        elif kind < 0.8:
            lines += [b"data: one", b"data: two"]
        elif kind < 0.85:
            lines.append(b": keep-alive")
        elif kind < 0.9:
            lines.append(b"error: {\"message\": \"boom\"}")
        else:
            lines.append(rng.choice([b"data: [DONE]", b"retry: 10", b"data", b"id: 1"]))
        if rng.random() < 0.8:
            lines.append(b"")  # the blank line that ends an event
    end = rng.choice([b"\n", b"\r\n", b"\r"])
    return end.join(lines) + (end if rng.random() < 0.5 else b"")


def _chunked(stream: bytes, rng: random.Random) -> list[bytes]:
    how = rng.random()
    if how < 0.3:
        return [stream]
    if how < 0.4:
        return [stream[i:i + 1] for i in range(len(stream))]
    cuts = sorted(rng.sample(range(len(stream) + 1), min(len(stream) + 1, rng.randint(1, 6))))
    return [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]


def _split(chunks: list[bytes]) -> list[tuple[str | None, bytes, bytes]]:
    splitter = SSESplitter()
    events = [e for chunk in chunks for e in splitter.feed(chunk)] + splitter.flush()
    return [(e.event, e.data, e.raw) for e in events]


def test_any_chunking_of_a_random_stream_gives_the_whole_stream_s_events() -> None:
    rng = random.Random(2126)
    for _ in range(3000):
        stream = _random_stream(rng)
        assert _split(_chunked(stream, rng)) == _reference_events(stream), stream


def _parsed_blocks(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The blocks the block parser (``sse._parse_block``) is handed from now on."""
    calls: list[bytes] = []
    parse = sse._parse_block

    def counted(block: bytes) -> SSEEvent | None:
        calls.append(block)
        return parse(block)

    monkeypatch.setattr(sse, "_parse_block", counted)
    return calls


def test_a_chunk_of_whole_plain_events_is_split_without_the_line_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _parsed_blocks(monkeypatch)
    chunk = b"data: {\"a\":1}\n\ndata: [DONE]\n\nevent: ping\ndata: x\n\n"
    events = SSESplitter().feed(chunk)
    assert [(e.event, e.data) for e in events] == [(None, b'{"a":1}'), (None, b"[DONE]"), ("ping", b"x")]
    assert calls == [b"event: ping\ndata: x"]  # only the named event went through the line parser


def test_a_named_event_of_one_data_line_is_read_without_the_line_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anthropic's every event (``event: NAME`` then one ``data:`` line) is read by
    ``_parse_block`` itself; any other shape still goes through ``_parse_lines``, and both read a
    block alike."""
    rng = random.Random(2127)
    names = [b"", b"ping", b" lead", b"a:b", b"message_start", b"\xff\xfe", b"error"]
    datas = [b"", b"x", b" y", b'{"type":"ping"}', b"data: z", b"\xc3\xa9"]
    blocks = [b"event: " + n + b"\ndata: " + d for n in names for d in datas]
    odd = [b"event: a\ndata: x\ndata: y", b"event: a\ndata:x", b"event:a\ndata: x", b"event: a\n: c\ndata: x",
           b"event: a\nid: 1", b"event: a", b"event: a\ndata: x\n", b"event: a\nerror: x"]
    for _ in range(500):
        odd.append(b"\n".join(rng.choice([b"event: e", b"data: d", b"data:", b": c", b"id: 1", b"event:"])
                               for _ in range(rng.randint(1, 4))))
    for block in blocks + odd:
        assert sse._parse_block(block) == sse._parse_lines(block), block
    loop: list[bytes] = []
    parse_lines = sse._parse_lines
    monkeypatch.setattr(sse, "_parse_lines", lambda block: loop.append(block) or parse_lines(block))
    stream = b"".join(block + b"\n\n" for block in blocks)
    assert _split([stream]) == _reference_events(stream) and loop == []
    assert _split([b"event: a\ndata: x\ndata: y\n\n"]) == [("a", b"x\ny", b"event: a\ndata: x\ndata: y")]
    assert loop == [b"event: a\ndata: x\ndata: y"]


def _refused(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # (as orjson refuses it)


def test_a_stream_that_ended_with_its_blank_line_is_flushed_without_the_line_parser(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``flush`` of an empty buffer (the usual end) gives nothing, as the line parser would of
    nothing; a buffer with an unterminated event still goes through it."""
    parse = sse._parse_block
    calls = _parsed_blocks(monkeypatch)
    splitter = SSESplitter()
    assert splitter.feed(b"data: [DONE]\n\n") and calls == []
    assert splitter.flush() == [] and parse(b"") is None and calls == []
    splitter.feed(b"data: x\n")
    assert [(e.event, e.data) for e in splitter.flush()] == [(None, b"x")] and calls == [b"data: x"]


class _ReferenceAssembler:
    """The reply rebuilt from parsed chunks the long way (choice 0's deltas, in order)."""

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes, self.seen = max_bytes, 0
        self.role, self.saw = "assistant", False
        self.content: list[str] = []
        self.extra: dict[str, str] = {}
        self.tools: dict[Any, dict[str, Any]] = {}
        self.finish: Any = None
        self.usage: Any = None
        self.malformed = self.chunks = 0
        self.truncated = self.done = self.flagged = False
        self.errors: list[Any] = []

    def _error(self, name: str | None, error: Any) -> None:
        self.flagged = self.flagged or name == "error"
        if len(self.errors) < ReplyAssembler.MAX_ERRORS:
            self.errors.append(error)

    def add(self, data: bytes, name: str | None = None) -> None:
        self.seen += len(data)
        if data == b"[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data, parse_constant=_refused)  # (lone surrogates kept, then replaced)
        except ValueError:
            self._error(name, data.decode("utf-8", "replace"))
            return
        chunk = without_lone_surrogates(chunk)
        if not isinstance(chunk, dict):
            return
        if name == "error" or "error" in chunk:
            self._error("error", chunk.get("error", chunk))
            return
        self.chunks += 1
        try:
            if chunk.get("usage"):
                self.usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    continue
                if choice.get("finish_reason"):
                    self.finish = choice["finish_reason"]
                self._delta(choice.get("delta") or {})
        except (AttributeError, TypeError, ValueError):
            self.malformed += 1

    def _delta(self, delta: Any) -> None:
        if delta.get("role"):
            self.role = delta["role"]
        if self.max_bytes is not None and self.seen > self.max_bytes:
            self.truncated = True
            return
        if isinstance(delta.get("content"), str):
            self.saw = self.saw or bool(delta["content"])
            self.content.append(delta["content"])
        for key in ("refusal", "reasoning_content"):
            if isinstance(delta.get(key), str) and delta[key]:
                self.extra[key] = self.extra.get(key, "") + delta[key]
        for call in delta.get("tool_calls") or ():
            acc = self.tools.setdefault(call.get("index", len(self.tools)), {"id": None, "type": "function",
                                                                              "name": "", "args": []})
            if call.get("id"):
                acc["id"] = call["id"]
            if call.get("type"):
                acc["type"] = call["type"]
            fn = call.get("function") or {}
            if fn.get("name"):
                acc["name"] += fn["name"]
            if fn.get("arguments"):
                acc["args"].append(fn["arguments"])

    def state(self) -> tuple[Any, ...]:
        tools = [(i, t["id"], t["type"], t["name"], "".join(t["args"])) for i, t in sorted(self.tools.items())]
        return (self.role, "".join(self.content), self.saw, self.extra, tools, self.finish, self.usage,
                self.malformed, self.chunks, self.truncated, self.done, self.errors, self.flagged, self.seen)


def _random_chunk(rng: random.Random) -> Any:
    def some(*values: Any) -> Any:
        return rng.choice(values)

    delta: Any = {}
    for key, values in (("role", ("assistant", "", None, 3)), ("content", ("hi ", "", None, 7, ["x"])),
                        ("refusal", ("no", "", None)), ("reasoning_content", ("think", None, 1)),
                        ("tool_calls", (None, [], "bad", [None], [{"index": 0, "id": "c1", "type": "function",
                                                                   "function": {"name": "f", "arguments": "{\"a\""}}],
                                        [{"index": 1, "function": {"arguments": ":1}"}}], [{"function": None}]))):
        if rng.random() < 0.4:
            delta[key] = some(*values)
    if rng.random() < 0.05:
        delta = some("text", None, [], 0)
    choice: Any = {"index": some(0, 0, 0, 1, None), "delta": delta, "finish_reason": some(None, None, "stop", "")}
    if rng.random() < 0.05:
        choice = some("c", None, 1)
    chunk: Any = {"choices": some([choice], [choice], [], None, "x", [choice, choice])}
    if rng.random() < 0.2:
        chunk["usage"] = some({"prompt_tokens": 1}, None, {})
    if rng.random() < 0.02:
        chunk = some([1], "s", {"error": {"message": "x"}})
    return chunk


def _random_event(rng: random.Random) -> SSEEvent:
    """A plain chunk mostly; else ``[DONE]``, an error (named, in a chunk, llama.cpp's field), text
    that is not JSON, a lone surrogate escape, another JSON value, a named event."""
    kind = rng.random()
    if kind < 0.75:
        return SSEEvent(None, orjson.dumps(_random_chunk(rng)))
    data = rng.choice([b"[DONE]", b"not json", b"[1, 2]", b"3", b'{"error": {"message": "x"}}', b"",
                       b'{"choices":[{"index":0,"delta":{"content":"half \\ud83d"}}]}', b'{"choices": [], "x": NaN}'])
    name = rng.choice([None, None, "error", "ping"])
    raw = (b"event: " + name.encode() + b"\n" if name else b"") + b"data: " + data
    if name == "error" and rng.random() < 0.3:
        raw = b"error: " + data  # llama.cpp's older field: not seen by clients
    return SSEEvent(name, data, raw)


@pytest.mark.parametrize("max_bytes", [None, 400])
def test_the_assembler_rebuilds_what_a_plain_reading_of_the_chunks_gives(max_bytes: int | None) -> None:
    """Events added one by one and in batches of any size (``add_events``: one pass for plain chunks)
    give what the reference reads, event by event."""
    rng = random.Random(32)
    for _ in range(1500):
        events = [_random_event(rng) for _ in range(rng.randint(1, 8))]
        fast, reference = ReplyAssembler(max_bytes), _ReferenceAssembler(max_bytes)
        if rng.random() < 0.3:
            for event in events:
                fast.add(event)
        else:
            cut = rng.randint(0, len(events))
            fast.add_events(events[:cut])
            fast.add_events(iter(events[cut:]))
        for event in events:
            reference.add(event.data, event.event)
        tools = [(i, t.id, t.type, t.name, "".join(t.arguments)) for i, t in sorted(fast._tools.items())]
        assert (fast.role, "".join(fast._content), fast._saw_content, fast._extra, tools, fast.finish_reason,
                fast.usage, fast.malformed, fast.chunks, fast.truncated, fast.done, fast.errors,
                fast.upstream_error or fast.hidden_error, fast.seen_bytes) == reference.state(), events


def test_plain_chunks_are_assembled_without_the_unusual_events_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``add_events`` reads a plain ``data:`` chunk in its one pass; only ``[DONE]``, errors and the
    like go through ``_unusual``, and the reply is the same either way."""
    calls: list[bytes] = []
    unusual = ReplyAssembler._unusual

    def counted(self: ReplyAssembler, event: SSEEvent) -> Any:
        calls.append(event.data)
        return unusual(self, event)

    monkeypatch.setattr(ReplyAssembler, "_unusual", counted)
    chunks = [b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
              b'{"choices":[{"index":0,"delta":{"content":"Hi"}}]}',
              b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"total_tokens":3}}']
    batched = ReplyAssembler()
    batched.add_events([SSEEvent(None, c) for c in chunks] + [SSEEvent(None, b"[DONE]")])
    assert calls == [b"[DONE]"]
    unusual_ones = ReplyAssembler()  # the same chunks as named events: all through ``_unusual``
    unusual_ones.add_events([SSEEvent("message", c) for c in chunks] + [SSEEvent(None, b"[DONE]")])
    assert calls == [b"[DONE]", *chunks, b"[DONE]"]
    for a in (batched, unusual_ones):
        assert (a.message(), a.finish_reason, a.usage, a.done, a.chunks) == (
            {"role": "assistant", "content": "Hi"}, "stop", {"total_tokens": 3}, True, 3)


class _ReadDict(dict):  # type: ignore[type-arg]
    """A delta recording the members the assembler reads of it."""

    read: list[str]

    def get(self, key: str, default: Any = None) -> Any:
        self.read.append(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.read.append(str(key))
        return super().__contains__(key)


def test_a_delta_of_text_alone_is_read_in_one_step_and_assembled_as_any_other() -> None:
    """The usual delta (``{"content": text}``) is taken without looking for a role, a refusal or
    tool calls; one with more members goes through every rule; the reply is the reference's."""
    for delta, read in (({"content": "Hi"}, ["content"]),
                        ({"content": "Hi", "role": "assistant"}, ["content", "role", "refusal", "reasoning_content",
                                                                  "tool_calls"])):
        recorded = _ReadDict(delta)
        recorded.read = []
        fast, reference = ReplyAssembler(), _ReferenceAssembler(None)
        fast.add_chunk({"choices": [{"index": 0, "delta": recorded}]})
        reference.add(orjson.dumps({"choices": [{"index": 0, "delta": delta}]}))
        assert recorded.read == read
        assert (fast.role, "".join(fast._content), fast._saw_content, fast.chunks) == (
            reference.role, "".join(reference.content), reference.saw, reference.chunks)
