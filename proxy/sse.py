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
    last one stopped, so an event that arrives in many small chunks costs linear time.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._cr = False
        """The last chunk ended with a CR: an LF that opens the next one is the same line end."""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if self._cr:
            self._cr = False
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]
        if b"\r" in chunk:
            self._cr = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        start = max(len(self._buf) - 1, 0)
        self._buf += chunk
        events: list[SSEEvent] = []
        while True:
            end = self._buf.find(b"\n\n", start)
            if end < 0:
                return events
            block, self._buf = self._buf[:end], self._buf[end + 2 :]
            start = 0
            event = _parse_block(block)
            if event is not None:
                events.append(event)

    def flush(self) -> list[SSEEvent]:
        """Events left in the buffer when the stream ends without a final blank line."""
        block, self._buf = self._buf, b""
        event = _parse_block(block.strip(b"\n"))
        return [event] if event is not None else []


def _parse_block(block: bytes) -> SSEEvent | None:
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
    """

    MAX_ERRORS = 16

    def __init__(self) -> None:
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

    def add(self, event: SSEEvent) -> None:
        if event.data == b"[DONE]":
            self.done = True
            return
        try:
            chunk = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            self.upstream_error = self.upstream_error or event.event == "error"
            self._error(event.data.decode("utf-8", "replace"))
            return
        if not isinstance(chunk, dict):
            return
        if event.event == "error" or "error" in chunk:
            self.upstream_error = True
            self._error(chunk.get("error", chunk))
            return
        self.add_chunk(chunk)

    def _error(self, error: Any) -> None:
        if len(self.errors) < self.MAX_ERRORS:
            self.errors.append(error)

    def add_chunk(self, chunk: dict[str, Any]) -> None:
        """Add one parsed ``chat.completion.chunk``."""
        self.chunks += 1
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            self._add_delta(choice.get("delta") or {})

    def _add_delta(self, delta: dict[str, Any]) -> None:
        if delta.get("role"):
            self.role = delta["role"]
        text = delta.get("content")
        if isinstance(text, str):
            self._saw_content = self._saw_content or bool(text)
            self._content.append(text)
        for key in ("refusal", "reasoning_content"):
            if delta.get(key):
                self._extra[key] = self._extra.get(key, "") + delta[key]
        for call in delta.get("tool_calls") or ():
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
        return msg
