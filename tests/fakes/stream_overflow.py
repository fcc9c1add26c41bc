"""How the fake upstream delivers an overflow inside an HTTP 200 event stream (stream styles).

A style whose ``delivery`` is ``stream_error`` or ``sse_error`` (``styles.py``) answers a streamed
request that overflows with HTTP 200 and an error event:

- ``llamacpp-stream`` (case 014's ``llamacpp-2025-midstream``): ``data: {"error": {...}}`` first,
  then ``data: [DONE]``: llama.cpp's server (2025 builds) writes the error from its result loop's
  error callback, then ``[DONE]`` on its OpenAI-compatible routes, whatever happened;
- ``openai-midstream``: OpenAI's first chunk (a role-only delta), then ``data: {"error": {...}}``
  in OpenAI's envelope, and the stream ends without ``[DONE]`` (what an independent provider
  played in issue 15; the openai SDK raises on such an event);
- ``sse-error``: ``event: error`` with the envelope as its data, no ``[DONE]``.

Framing modifiers, appended with ``+`` (``fake-2k-llamacpp-stream+role+crlf``), vary what a parser
must survive; each is allowed by the SSE rules or seen in a server's source:

- ``role``: OpenAI's role-only first chunk before the error;
- ``comment``: an SSE comment first (``: keep-alive``; OpenRouter sends processing comments);
- ``crlf``: CRLF line ends, each event sent in two parts split between a CR and its LF;
- ``cr``: lone CR line ends;
- ``errorfield``: llama.cpp's framing before mid-2025, ``error: {...}`` (the bare error object in
  an ``error`` field, which the SSE rules drop);
- ``done`` / ``nodone``: with / without ``data: [DONE]`` after the error;
- ``unterminated``: the error event is the last bytes, without its closing blank line (no
  ``[DONE]``).
"""

from __future__ import annotations

import json
from typing import Any

from tests.fakes.styles import OverflowStyle
from tests.fakes.wire import SSE_DONE, sse_data

FRAMINGS = frozenset({"role", "comment", "crlf", "cr", "errorfield", "done", "nodone", "unterminated"})
PART_GAP_S = 0.02
"""Pause between the parts of a ``crlf`` event, so they reach the client as separate reads."""


def overflow_frames(style: OverflowStyle, error: Any, first_chunk: dict[str, Any]) -> tuple[list[bytes], float]:
    """``(parts, gap_s)``: the body parts of the 200 stream carrying ``error`` (the style's JSON
    error body) and the pause to make between them."""
    framing = style.framing
    events: list[bytes] = []
    if "comment" in framing:
        events.append(b": keep-alive\n\n")
    if style.role_first or "role" in framing:
        events.append(sse_data(first_chunk))
    if "errorfield" in framing:
        inner = error.get("error", error) if isinstance(error, dict) else error
        events.append(b"error: " + json.dumps(inner, separators=(",", ":")).encode() + b"\n\n")
    else:
        events.append((b"event: error\n" if style.delivery == "sse_error" else b"") + sse_data(error))
    if (style.done_after or "done" in framing) and not framing & {"nodone", "unterminated"}:
        events.append(SSE_DONE)
    if "unterminated" in framing:
        events[-1] = events[-1][:-1]  # one line end left: the event is never closed
    if "crlf" in framing:
        parts = []
        for event in events:
            event = event.replace(b"\n", b"\r\n")
            cut = event.rfind(b"\r") + 1  # between the last CR and its LF
            parts += [event[:cut], event[cut:]]
        return parts, PART_GAP_S
    if "cr" in framing:
        return [e.replace(b"\n", b"\r") for e in events], 0.0
    return events, 0.0
