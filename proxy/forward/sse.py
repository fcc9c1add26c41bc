"""Server-sent events: split a byte stream into events (``SSESplitter``, ``SSEEvent``).

The proxy relays upstream bytes unchanged; this module only *observes* them: it splits them into
events, from which ``proxy.forward.reply_assembler`` rebuilds the reply to log once the stream ends.
Event framing follows the WHATWG HTML "server-sent events" section: lines end at CRLF, LF or a
lone CR (also when a chunk boundary falls between the CR and the LF); events end at a blank line;
lines are ``field: value``; ``data`` lines of one event are joined with ``\\n``. One departure: an
``error:`` field (llama.cpp builds before mid-2025 wrote stream errors as ``error: {...}``, which
the rules would drop) is read as an ``error`` event with that data.
"""

from __future__ import annotations

from dataclasses import dataclass


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
        if self._cr and chunk:  # (an empty chunk between a CR and its LF changes nothing)
            self._cr = False
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]
        if _CR in chunk:
            self._cr = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf
        events: list[SSEEvent] = []
        if not buf:  # (the usual chunk: whole events, split; an event being skipped keeps a byte in ``buf``)
            *blocks, rest = chunk.split(b"\n\n")
            for block in blocks:
                data = block.removeprefix(b"data: ")
                if len(data) < len(block) and _LF not in data:  # (``_parse_block``'s usual event)
                    events.append(SSEEvent(None, data, block))
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

    @property
    def idle(self) -> bool:
        """Nothing is held: the next bytes fed start an event (as at a stream's start)."""
        return not self._buf and not self._cr

    def flush(self) -> list[SSEEvent]:
        """Events left in the buffer when the stream ends without a final blank line."""
        if not self._buf:  # (the usual end: nothing left; an event being skipped keeps a byte)
            return []
        block = bytes(self._buf)
        self._buf.clear()
        if self._skipping:
            return []
        event = _parse_block(block.strip(b"\n"))
        return [event] if event is not None else []


_LF, _CR = 10, 13
"""Line-end bytes as integers: ``10 in data`` is a byte search, where ``b"\\n" in data`` first tries
its argument as an integer and formats a ``TypeError`` (about 2,000 instructions a test)."""


def _parse_block(block: bytes) -> SSEEvent | None:
    """The event of one block (``_parse_lines``), its two usual shapes read without the line loop."""
    value = block.removeprefix(b"data: ")
    if len(value) < len(block) and _LF not in value:  # the usual event: one data line, no name
        return SSEEvent(None, value, block)
    if block.startswith(b"event: "):  # Anthropic's every event: a name line, then one data line
        end = block.find(_LF)
        if end > 0 and block.startswith(b"data: ", end + 1) and block.find(_LF, end + 1) < 0:
            return SSEEvent(block[7:end].decode("utf-8", "replace"), block[end + 7:], block)
    return _parse_lines(block)


def _parse_lines(block: bytes) -> SSEEvent | None:
    """The event of one block by the SSE rules (module docstring); ``None`` for a block without
    ``data`` or ``event`` (comments only, unknown fields)."""
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
