"""Server-sent events: split a byte stream into events, and reassemble the assistant reply.

The proxy relays upstream bytes unchanged; this module only *observes* them, to log the reply
(content, tool calls with their argument pieces, finish reason, usage) once the stream ends.
Event framing follows the WHATWG HTML "server-sent events" section: lines end at CRLF, LF or a
lone CR (also when a chunk boundary falls between the CR and the LF); events end at a blank line;
lines are ``field: value``; ``data`` lines of one event are joined with ``\\n``. One departure: an
``error:`` field (llama.cpp builds before mid-2025 wrote stream errors as ``error: {...}``, which
the rules would drop) is read as an ``error`` event with that data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.json_text import parse_json


@dataclass(slots=True)
class SSEEvent:
    """One event: ``event`` name (None = "message") and its joined ``data`` (bytes)."""

    event: str | None
    data: bytes
    raw: bytes = b""
    """The event's block as received (newlines normalized), without the blank line that ends it."""


class SSESplitter:
    """Incremental splitter: ``feed(chunk)`` returns the events completed by that chunk.

    Line ends are normalized to LF as they arrive; the search for an event's end resumes where the
    last one stopped and the buffer is cut once per chunk, so both an event that arrives in many
    small chunks and a chunk of many small events cost linear time. An event longer than
    ``MAX_EVENT_BYTES`` is not kept (``dropped`` counts them): the relay's bytes are the upstream's
    whatever the splitter keeps, and a hostile upstream cannot make it buffer without end.
    """

    MAX_EVENT_BYTES = 8 * 1024 * 1024

    def __init__(self) -> None:
        self._buf = bytearray()
        self._cr = False
        """The last chunk ended with a CR: an LF that opens the next one is the same line end."""
        self._skipping = False
        self.dropped = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if self._cr:
            self._cr = False
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]
        if b"\r" in chunk:
            self._cr = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf
        events: list[SSEEvent] = []
        if not buf:  # (the usual chunk: whole events, split; an event being skipped keeps a byte in ``buf``)
            *blocks, rest = chunk.split(b"\n\n")
            for block in blocks:
                if block.startswith(b"data: ") and b"\n" not in block:  # (``_parse_block``'s usual event)
                    events.append(SSEEvent(None, block[6:], block))
                elif (event := _parse_block(block)) is not None:
                    events.append(event)
            chunk = rest
        search = max(len(buf) - 1, 0)
        buf += chunk
        pos = 0
        while (end := buf.find(b"\n\n", search)) >= 0:
            block = bytes(buf[pos:end])
            pos = search = end + 2
            if self._skipping:  # the end of an event too long to keep
                self._skipping = False
                continue
            event = _parse_block(block)
            if event is not None:
                events.append(event)
        if pos:
            del buf[:pos]
        if len(buf) > self.MAX_EVENT_BYTES:
            del buf[:-1]  # (its last byte may open the blank line that ends the event)
            if not self._skipping:
                self._skipping = True
                self.dropped += 1
        return events

    def flush(self) -> list[SSEEvent]:
        """Events left in the buffer when the stream ends without a final blank line."""
        block = bytes(self._buf)
        self._buf.clear()
        if self._skipping:
            return []
        event = _parse_block(block.strip(b"\n"))
        return [event] if event is not None else []


def _parse_block(block: bytes) -> SSEEvent | None:
    if block.startswith(b"data: ") and b"\n" not in block:  # the usual event: one data line, no name
        return SSEEvent(None, block[6:], block)
    name: str | None = None
    data: list[bytes] = []
    for line in block.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        key, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if key == b"data":
            data.append(value)
        elif key == b"event":
            name = value.decode("utf-8", "replace")
        elif key == b"error":  # llama.cpp's older framing of an error (module docstring)
            name = name or "error"
            data.append(value)
    if not data and name is None:
        return None
    return SSEEvent(name, b"\n".join(data), block)


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

    def add(self, event: SSEEvent) -> None:
        self.seen_bytes += len(event.data)
        if event.data == b"[DONE]":
            self.done = True
            return
        data = event.data
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            try:  # orjson refused it: a lone surrogate escape is read all the same (``proxy.json_text``)
                chunk = parse_json(data)
            except orjson.JSONDecodeError:
                if event.event == "error":
                    self._flag(event)
                self._error(data.decode("utf-8", "replace"))
                return
        if not isinstance(chunk, dict):
            return
        if event.event == "error" or "error" in chunk:
            self._flag(event)
            self._error(chunk.get("error", chunk))
            return
        self.add_chunk(chunk)

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
        self.chunks += 1
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
                self._add_delta(choice.get("delta") or {})
        except (AttributeError, TypeError, ValueError):
            self.malformed += 1

    def _add_delta(self, delta: dict[str, Any]) -> None:
        role = delta.get("role")
        if role:
            self.role = role
        if self.max_bytes is not None and self.seen_bytes > self.max_bytes:
            self.truncated = True
            return
        text = delta.get("content")
        if isinstance(text, str):
            if text:
                self._saw_content = True
            self._content.append(text)
        if "refusal" in delta or "reasoning_content" in delta:
            for key in ("refusal", "reasoning_content"):
                if isinstance(delta.get(key), str) and delta[key]:
                    self._extra[key] = self._extra.get(key, "") + delta[key]
        tool_calls = delta.get("tool_calls")
        if tool_calls:
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
                    acc.arguments.append(fn["arguments"])

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
                for _, acc in sorted(self._tools.items())
            ]
        msg.update(self._extra)
        if self.truncated:
            msg["x_context_proxy"] = {"truncated": True, "kept_bytes": self.max_bytes}
        return msg
