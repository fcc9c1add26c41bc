"""Anthropic wire shapes the fake sends: ids, the Message object, and the stream's events.

Message (``anthropic/types/message.py``; https://platform.claude.com/docs/en/api/messages)::

    {"id": "msg_01...", "type": "message", "role": "assistant", "model": ..., "content": [blocks],
     "stop_reason": "end_turn" | "tool_use" | "max_tokens" | "stop_sequence", "stop_sequence": str | None,
     "usage": {"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens",
               "cache_creation": {"ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens"},
               "service_tier": "standard"}}

Stream (https://platform.claude.com/docs/en/build-with-claude/streaming, "Event types"; the
SDK's ``raw_*_event.py`` types), each event ``event: NAME\\ndata: JSON\\n\\n``:

1. ``message_start``: the message with ``content: []``, ``stop_reason: null`` and the usage
   (input figures final, ``output_tokens`` 1, as the docs' example);
2. one ``ping`` (the docs' example sends it right after ``message_start``);
3. per block ``content_block_start`` (text ``""``; ``tool_use`` with ``input: {}``; thinking
   with ``thinking: ""`` and ``signature: ""``; ``redacted_thinking`` whole), its deltas
   (``text_delta`` in pieces of about three words; ``input_json_delta`` ``partial_json`` in
   ``JSON_PIECE_CHARS`` pieces, the first ``""`` as the docs show; ``thinking_delta`` pieces then
   one ``signature_delta`` just before the stop, as ``signature_delta.py`` says; none for
   redacted thinking), then ``content_block_stop``;
4. ``message_delta`` (``stop_reason``, ``stop_sequence``; ``usage.output_tokens``, cumulative);
5. ``message_stop``.

An in-stream error is ``event: error`` with the error envelope (streaming docs, "Error events").
"""

from __future__ import annotations

import json
import re
import secrets
import string
from typing import Any

from tests.fakes.anthropic.cache import CacheUsage

JSON_PIECE_CHARS = 10
_ALPHABET = string.ascii_letters + string.digits


def make_id(prefix: str) -> str:
    """``msg_01`` / ``toolu_01`` / ``req_011C`` + 22 base62 characters (the API's look)."""
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(22))


def usage_object(cache: CacheUsage, output_tokens: int, ttl: str = "5m") -> dict[str, Any]:
    created = cache.cache_creation_input_tokens
    return {
        "input_tokens": cache.input_tokens,
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": cache.cache_read_input_tokens,
        "output_tokens": output_tokens,
        "cache_creation": {"ephemeral_5m_input_tokens": 0 if ttl == "1h" else created,
                           "ephemeral_1h_input_tokens": created if ttl == "1h" else 0},
        "service_tier": "standard",
    }


def message_object(message_id: str, model: str, content: list[dict[str, Any]], stop_reason: str | None,
                   stop_sequence: str | None, usage: dict[str, Any]) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}


def text_pieces(text: str) -> list[str]:
    """``text`` in pieces of about three words (whitespace kept); one piece for a short text."""
    words = re.findall(r"\s*\S+\s*", text) or ([text] if text else [])
    return ["".join(words[i:i + 3]) for i in range(0, len(words), 3)]


def _block_events(index: int, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    kind = block.get("type")
    def delta(d: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}
    events: list[tuple[str, dict[str, Any]]] = []
    if kind == "text":
        start: dict[str, Any] = {"type": "text", "text": ""}
        events = [delta({"type": "text_delta", "text": p}) for p in text_pieces(block["text"])]
    elif kind == "tool_use":
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        arguments = json.dumps(block.get("input", {}), separators=(",", ":"))
        pieces = [""] + [arguments[i:i + JSON_PIECE_CHARS] for i in range(0, len(arguments), JSON_PIECE_CHARS)]
        events = [delta({"type": "input_json_delta", "partial_json": p}) for p in pieces]
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        events = [delta({"type": "thinking_delta", "thinking": p}) for p in text_pieces(block["thinking"])]
        events.append(delta({"type": "signature_delta", "signature": block["signature"]}))
    else:  # redacted_thinking and any block sent whole
        start = block
    head = ("content_block_start", {"type": "content_block_start", "index": index, "content_block": start})
    stop = ("content_block_stop", {"type": "content_block_stop", "index": index})
    return [head, *events, stop]


def stream_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The (event name, data) sequence of a streamed ``message`` (see the module docstring)."""
    start_usage = {**message["usage"], "output_tokens": 1}
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None, "usage": start_usage}
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start}),
                                                 ("ping", {"type": "ping"})]
    for index, block in enumerate(message["content"]):
        events += _block_events(index, block)
    events.append(("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
                                     "usage": {"output_tokens": message["usage"]["output_tokens"]}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def sse_event(name: str, data: Any) -> bytes:
    """One server-sent event: ``event: NAME\\ndata: JSON\\n\\n``."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
