"""Keeping the proxy's read tool away from a Messages client's stream (the strategy is
``proxy.tools.own_tools``'; the shapes ``proxy.conversation.messages_rounds``').

One ``RoundFilter`` per upstream stream of a request that offered the proxy's tool. Events of the
proxy's ``tool_use`` blocks (their ``content_block_start``, ``input_json_delta``s and
``content_block_stop``) are removed and their input reassembled; the other blocks are renumbered
from ``first_index`` (the blocks earlier rounds sent the client), so the client's SDK sees one
message with contiguous indexes; a later round's ``message_start`` is dropped (the client has one);
``message_delta`` and ``message_stop`` are held back for the relay to send, rewrite or drop at the
round's end. Untouched events are relayed as received; an event the filter cannot read is too.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from proxy.forward.sse import SSEEvent
from proxy.json_depth import dumps
from proxy.json_text import parse_json

PING = b'event: ping\ndata: {"type": "ping"}\n\n'
"""What keeps a stream alive while the proxy serves its own tool call (the API's own keep-alive)."""
HELD_MAX_EVENTS = 16
"""``message_delta``/``message_stop`` events of a round held at most (an upstream sends one of each)."""


@dataclass(slots=True)
class _Use:
    """One of the proxy's ``tool_use`` blocks, reassembled from its events."""

    block: dict[str, Any]
    json: list[str] = field(default_factory=list)

    def done(self) -> dict[str, Any]:
        text = "".join(self.json)
        if not text:
            return self.block
        try:
            parsed = parse_json(text)
        except ValueError:
            parsed = None
        return self.block | ({"input": parsed} if isinstance(parsed, dict) else {"input_json": text})


class RoundFilter:
    """Filters one round's events (module docstring). ``filter(event)`` returns the event to relay
    now (the same one when untouched, a rewritten one, or ``None``); after the round,
    ``own_uses`` holds the proxy's ``tool_use`` blocks, ``client_uses`` counts the client's,
    ``next_index`` is the next index of the client's message and ``held`` the end events."""

    def __init__(self, own: Collection[str], first_index: int, first_round: bool) -> None:
        self.own = own
        self.next_index = first_index
        self.first_round = first_round
        self.client_uses = 0
        self.held: list[SSEEvent] = []
        self._map: dict[int, int | None] = {}
        self._uses: dict[int, _Use] = {}

    @property
    def own_uses(self) -> list[dict[str, Any]]:
        return [self._uses[i].done() for i in sorted(self._uses)]

    def filter(self, event: SSEEvent) -> SSEEvent | None:
        try:
            data = parse_json(event.data) if event.data else None
        except ValueError:
            return event
        if not isinstance(data, dict):
            return event
        kind = data.get("type")
        if kind == "message_start":
            return event if self.first_round else None
        if kind in ("message_delta", "message_stop"):
            if len(self.held) >= HELD_MAX_EVENTS:  # a hostile upstream repeating them: the newest kept
                del self.held[0]
            self.held.append(event)
            return None
        index = data.get("index")
        if kind not in ("content_block_start", "content_block_delta", "content_block_stop") \
                or not isinstance(index, int) or isinstance(index, bool):
            return event
        if kind == "content_block_start" and index not in self._map:
            block = data.get("content_block")
            block = block if isinstance(block, dict) else {}
            if block.get("type") == "tool_use" and block.get("name") in self.own:
                self._map[index] = None
                self._uses[index] = _Use(dict(block))
            else:
                self._map[index] = self.next_index
                self.next_index += 1
                self.client_uses += block.get("type") == "tool_use"
        target = self._map.get(index, index)
        if target is None:
            delta = data.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("partial_json"), str):
                self._uses[index].json.append(delta["partial_json"])
            return None
        if target == index:
            return event
        return rewritten(event, data | {"index": target})


def rewritten(event: SSEEvent, data: dict[str, Any]) -> SSEEvent:
    """``event`` carrying ``data`` instead (its name kept)."""
    payload = dumps(data)
    head = b"event: " + event.event.encode() + b"\n" if event.event else b""
    return SSEEvent(event.event, payload, head + b"data: " + payload)


def ended_by_the_client(event: SSEEvent) -> SSEEvent:
    """A held ``message_delta`` whose ``stop_reason: "tool_use"`` ended the proxy's calls only, made
    ``end_turn`` (those calls were removed); any other event as it is."""
    try:
        data = parse_json(event.data)
    except ValueError:
        return event
    if not isinstance(data, dict) or data.get("type") != "message_delta":
        return event
    delta = data.get("delta")
    if not isinstance(delta, dict) or delta.get("stop_reason") != "tool_use":
        return event
    return rewritten(event, data | {"delta": delta | {"stop_reason": "end_turn"}})


def provider_error_event(data: bytes) -> bytes:
    """A later round's error answer (``data``, the provider's body) as the ``error`` event that
    ends the client's stream: the provider's envelope on one line, or an ``api_error`` carrying
    its text when it is not JSON."""
    try:
        parsed = parse_json(data)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or parsed.get("type") != "error":
        text = data[:2000].decode("utf-8", "replace")
        parsed = {"type": "error", "error": {"type": "api_error", "message": text}}
    return b"event: error\ndata: " + dumps(parsed) + b"\n\n"


def has_text(content: list[dict[str, Any]]) -> bool:
    """Does ``content`` carry text for the client (a non-empty ``text`` block)?"""
    return any(isinstance(b, dict) and b.get("type") == "text" and b.get("text") for b in content)
