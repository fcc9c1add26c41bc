"""What the scripted model answers: ``Reply`` and the block helpers a test builds it from.

A test scripts the fake with ``state.script`` (a queue: each request pops one entry, a
``Reply`` or a ``Responder``) or ``state.responder`` (asked when the queue is empty). A
``Responder`` is ``(request: ReceivedRequest) -> Reply``: it decides from the parsed body.

Blocks are written in the wire shape of the SDK's response types
(``anthropic/types/text_block.py``, ``tool_use_block.py``, ``thinking_block.py``,
``redacted_thinking_block.py``)::

    text("Hello")                       {"type": "text", "text": "Hello"}
    tool_use("get_weather", {"city": "Paris"}, id="toolu_01...")
    thinking("Let me think")            {"type": "thinking", "thinking": ..., "signature": <filled by the fake>}
    redacted_thinking()                 {"type": "redacted_thinking", "data": <filled by the fake>}

The fake fills what only the provider can make: ``signature`` of thinking blocks, ``data`` of
redacted ones (both HMACs, ``thinking.py``) and missing tool ids (``toolu_01`` + 22 characters).
``stop_reason`` defaults to ``tool_use`` when the reply has a ``tool_use`` block, else
``end_turn``; ``max_tokens`` and ``stop_sequence`` are decided by the fake from the request.
``output_tokens`` overrides the counted figure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Block = dict[str, Any]


@dataclass
class Reply:
    """One scripted assistant message: its content blocks and optional overrides."""

    content: list[Block] = field(default_factory=list)
    stop_reason: str | None = None
    output_tokens: int | None = None


Responder = Callable[[Any], Reply]
"""``(ReceivedRequest) -> Reply``."""


def text(value: str) -> Block:
    return {"type": "text", "text": value}


def tool_use(name: str, input: dict[str, Any], id: str | None = None) -> Block:
    block: Block = {"type": "tool_use", "name": name, "input": input}
    if id is not None:
        block["id"] = id
    return block


def thinking(value: str) -> Block:
    return {"type": "thinking", "thinking": value}


def redacted_thinking() -> Block:
    return {"type": "redacted_thinking"}


def reply(*blocks: Block | str, stop_reason: str | None = None) -> Reply:
    """A ``Reply`` of ``blocks``; a plain string is a text block."""
    return Reply([text(b) if isinstance(b, str) else b for b in blocks], stop_reason=stop_reason)


def last_user_text(body: Any) -> str:
    """The text of the last user turn's text blocks (``""`` when there is none)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    for message in reversed(messages or []):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def strings(value: Any) -> list[str]:
    """Every string of a JSON value, in order (what a scripted model reads of a prompt: texts, tool
    inputs and results, the system)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    return []


def echo_responder(request: Any) -> Reply:
    """The default model: ``OK: `` and the first 40 characters of the last user text."""
    return reply("OK: " + " ".join(last_user_text(request.json).split())[:40])
