"""The assistant reply of a chat completion stream, reassembled from its events (``ReplyAssembler``).

The proxy relays upstream bytes unchanged; ``proxy.forward.sse`` splits them into events and this
module rebuilds the reply the client saw from them (content, tool calls with their argument pieces,
refusal, reasoning content, finish reason, usage), to log it once the stream ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.forward.sse import SSEEvent, SSESplitter
from proxy.forward.text_template import TextTemplate, learn_chat
from proxy.json_depth import dumps
from proxy.json_text import parse_json

_CR = 13


def _seen_by_clients(event: SSEEvent) -> bool:
    """Whether a client reading the stream by the SSE rules sees this event: not one that is only
    llama.cpp's ``error:`` field (an unknown field, dropped by the SDKs), which then gets the
    proxy's own error event at the stream's end instead of none."""
    return any(line.startswith(b"data") for line in event.raw.split(b"\n"))


@dataclass(slots=True)
class _ToolCallAcc:
    id: str | None = None
    type: str = "function"
    name: str = ""
    arguments: list[str] = field(default_factory=list)


def _by_index(tools: dict[Any, _ToolCallAcc]) -> list[tuple[Any, _ToolCallAcc]]:
    """The tool calls in their ``index`` order; in the order they came when the indexes do not
    compare (a string beside an ``int``)."""
    try:
        return sorted(tools.items(), key=_first)
    except TypeError:
        return list(tools.items())


def _first(item: tuple[Any, _ToolCallAcc]) -> Any:
    return item[0]


class ReplyAssembler:
    """Rebuilds the assistant message of choice 0 from chat.completion.chunk events.

    ``message()`` returns it in OpenAI's shape (``role``, ``content`` — ``None`` when only tool
    calls came —, ``tool_calls``); ``finish_reason``, ``usage`` and ``done`` (``[DONE]`` seen) are
    attributes. Events that are not JSON chunks (errors, keep-alives) are recorded in ``errors``
    (the first ``MAX_ERRORS``); ``upstream_error`` says an error event came (``event: error``, or
    a payload with an ``error`` member).

    ``max_bytes``: once the events' data passed this many bytes, deltas are no longer kept (finish
    reason and usage still are): ``truncated`` is set and ``message()`` carries
    ``x_context_proxy: {"truncated": true}``. The relay is not affected (it never reads this).
    """

    MAX_ERRORS = 16

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.seen_bytes = 0
        self.truncated = False
        self._content: list[str] = []
        self._saw_content = False
        self._tools: dict[int, _ToolCallAcc] = {}
        self._extra: dict[str, Any] = {}
        self.role = "assistant"
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.chunks = 0
        self.errors: list[Any] = []
        self.upstream_error = False
        self.malformed = 0
        """Chunks whose shape the assembler could not read (relayed all the same)."""
        self.hidden_error = False
        """An error only in llama.cpp's ``error:`` field, which clients do not see (``_seen_by_clients``)."""
        self.template = TextTemplate()
        """The stream's text chunks (``proxy.forward.text_template``): learned from a chunk of text
        alone (``learn_chat``), then such chunks read by it (``add_data``), not parsed whole."""

    def add(self, event: SSEEvent) -> None:
        """Add one event (``add_events`` of it alone)."""
        self.add_events((event,))

    def add_events(self, events: Iterable[SSEEvent]) -> None:
        """Add events in their order: ``[DONE]`` sets ``done``; a JSON object without an ``error``
        member is a chunk (``add_chunk``); an error event, or text that is not JSON, is recorded in
        ``errors``; any other JSON value is ignored. Every event's data counts in ``seen_bytes``
        (the ``max_bytes`` bound). One pass for the usual events (plain ``data:`` chunks); the
        others go through ``_unusual``. ``template`` is learned from a chunk of text alone."""
        loads = orjson.loads
        template = self.template
        chunks: list[tuple[int, dict[str, Any]]] = []  # (``seen_bytes`` once the chunk was read, chunk)
        seen = self.seen_bytes
        for event in events:
            data = event.data
            seen += len(data)
            if event.event is None and data != b"[DONE]":
                try:
                    chunk = loads(data)
                except orjson.JSONDecodeError:
                    chunk = None
                if type(chunk) is dict and "error" not in chunk:
                    chunks.append((seen, chunk))
                    if template.learns and template.pre is None:
                        learn_chat(template, data, chunk)
                    continue
            if (chunk := self._unusual(event)) is not None:
                chunks.append((seen, chunk))
        self.seen_bytes = seen
        if chunks:
            self._add_chunks(chunks)

    def add_data(self, splitter: SSESplitter, data: bytes) -> None:
        """``add_events(splitter.feed(data))``: ``data`` the stream's next bytes. When the splitter
        holds nothing and ``data`` opens with chunks of text alone that fit ``template``, those
        are read by it (``TextTemplate.run``: their texts, as parsing each whole would give them)
        and only the rest is split."""
        template = self.template
        if template.pre is not None and splitter.idle and _CR not in data:
            run = template.run(data)
            if run is not None:
                texts, size = run
                seen = self.seen_bytes + size - template.frame * len(texts)
                if self.max_bytes is None or seen <= self.max_bytes:
                    self.seen_bytes = seen
                    self.chunks += len(texts)
                    if not self._saw_content and any(texts):
                        self._saw_content = True
                    self._content += texts
                    if size == len(data):
                        return
                    data = data[size:]
        self.add_events(splitter.feed(data))

    def add_read(self, events: Sequence[SSEEvent], parsed: Sequence[Any]) -> None:
        """``add_events(events)`` when ``parse_json`` read the data of the first ``len(parsed)``
        events already (``parsed[i]``: what it read of ``events[i]``, ``None`` if not JSON): their
        plain chunks are not parsed again."""
        chunks: list[tuple[int, dict[str, Any]]] = []
        seen = self.seen_bytes
        for event, chunk in zip(events, parsed, strict=False):  # (``parsed`` is not longer than ``events``)
            seen += len(event.data)
            plain = event.event is None and type(chunk) is dict and "error" not in chunk
            if plain and self.template.learns and self.template.pre is None:
                learn_chat(self.template, event.data, chunk)
            if plain or (chunk := self._unusual(event)) is not None:
                chunks.append((seen, chunk))
        self.seen_bytes = seen
        if chunks:
            self._add_chunks(chunks)
        if len(events) > len(parsed):
            self.add_events(events[len(parsed):])

    def _unusual(self, event: SSEEvent) -> dict[str, Any] | None:
        """An event that is not a plain chunk that orjson reads: ``[DONE]``, an error, text with a
        lone surrogate escape (the chunk it is, returned), not JSON, another JSON value."""
        data = event.data
        if data == b"[DONE]":
            self.done = True
            return None
        try:
            chunk = parse_json(data)  # orjson's reading, and a lone surrogate escape read (``proxy.json_text``)
        except orjson.JSONDecodeError:
            if event.event == "error":
                self._flag(event)
            self._error(data.decode("utf-8", "replace"))
            return None
        if not isinstance(chunk, dict):
            return None
        if event.event == "error" or "error" in chunk:
            self._flag(event)
            self._error(chunk.get("error", chunk))
            return None
        return chunk

    def _flag(self, event: SSEEvent) -> None:
        if _seen_by_clients(event):
            self.upstream_error = True
        else:
            self.hidden_error = True

    def _error(self, error: Any) -> None:
        if len(self.errors) < self.MAX_ERRORS:
            self.errors.append(error)

    def add_chunk(self, chunk: dict[str, Any]) -> None:
        """Add one parsed ``chat.completion.chunk``. A chunk of an unexpected shape (a delta that is
        a string, a tool call that is null, ...) is counted in ``malformed`` and never raises:
        observing a stream must not change it."""
        self._add_chunks(((self.seen_bytes, chunk),))

    def _add_chunks(self, chunks: Sequence[tuple[int, dict[str, Any]]]) -> None:
        """``add_chunk`` of each chunk, in one loop: ``(seen, chunk)``, ``seen`` the ``seen_bytes``
        its deltas are bounded by (``max_bytes``). A delta of text alone (the usual one) is taken
        in a few steps; any other goes through every rule."""
        max_bytes = self.max_bytes
        content = self._content
        self.chunks += len(chunks)
        for seen, chunk in chunks:
            try:
                usage = chunk.get("usage")
                if usage:
                    self.usage = usage
                for choice in chunk.get("choices") or ():
                    if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                        continue
                    finish_reason = choice.get("finish_reason")
                    if finish_reason:
                        self.finish_reason = finish_reason
                    delta = choice.get("delta") or {}
                    text = delta.get("content")
                    if max_bytes is not None and seen > max_bytes:
                        role = delta.get("role")
                        if role:
                            self.role = role
                        self.truncated = True
                        continue
                    if len(delta) == 1 and type(text) is str:  # text alone: no role, refusal or call
                        if text:
                            self._saw_content = True
                        content.append(text)
                        continue
                    role = delta.get("role")
                    if role:
                        self.role = role
                    if isinstance(text, str):
                        if text:
                            self._saw_content = True
                        content.append(text)
                    if "refusal" in delta or "reasoning_content" in delta:
                        self._add_extra(delta)
                    tool_calls = delta.get("tool_calls")
                    if tool_calls:
                        self._add_tool_calls(tool_calls)
            except (AttributeError, TypeError, ValueError):
                self.malformed += 1

    def _add_extra(self, delta: dict[str, Any]) -> None:
        for key in ("refusal", "reasoning_content"):
            if isinstance(delta.get(key), str) and delta[key]:
                self._extra[key] = self._extra.get(key, "") + delta[key]

    def _add_tool_calls(self, tool_calls: Any) -> None:
        for call in tool_calls:
            acc = self._tools.setdefault(call.get("index", len(self._tools)), _ToolCallAcc())
            if call.get("id"):
                acc.id = call["id"]
            if call.get("type"):
                acc.type = call["type"]
            fn = call.get("function") or {}
            if fn.get("name"):
                acc.name += fn["name"]
            if fn.get("arguments"):
                piece = fn["arguments"]  # (a string; anything else as its JSON text, as it came)
                acc.arguments.append(piece if isinstance(piece, str) else dumps(piece).decode())

    def reset_round(self) -> None:
        """Forget the tool calls and finish of a round the client did not see (keep the content)."""
        self._tools.clear()
        self.finish_reason = None
        self.done = False

    @property
    def empty(self) -> bool:
        """True when no content, no tool call and no finish reason arrived (an anomalous reply)."""
        return not self._saw_content and not self._tools and self.finish_reason is None

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": self.role}
        content = "".join(self._content)
        msg["content"] = content if (content or not self._tools) else None
        if self._tools:
            msg["tool_calls"] = [
                {"id": acc.id, "type": acc.type, "function": {"name": acc.name, "arguments": "".join(acc.arguments)}}
                for _, acc in _by_index(self._tools)
            ]
        msg.update(self._extra)
        if self.truncated:
            msg["x_context_proxy"] = {"truncated": True, "kept_bytes": self.max_bytes}
        return msg
