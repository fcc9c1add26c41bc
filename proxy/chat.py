"""Wire shapes of OpenAI chat completions, the canonical form of a message, and chain hashes.

Wire shapes are ``TypedDict``s over plain dicts, so unknown fields survive untouched: the proxy
never parses a client's body into a model that drops fields.

The canonical form (used only for hashing, never forwarded) ignores what SDKs add or drop when
they echo an assistant reply back: ``None`` versus absent, ``refusal: null``, empty
``annotations``/``tool_calls`` lists, the streaming-only ``index`` of a tool call, and an
assistant's ``content`` of ``None`` versus ``""`` (both mean "no text"). So the reply the proxy
logs and the client's echo of it hash the same.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal, NotRequired, TypedDict

import orjson


class FunctionCall(TypedDict):
    name: str
    arguments: str


class ToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: FunctionCall


class Message(TypedDict, total=False):
    role: str
    content: Any  # str | list[content part] | None
    name: str
    tool_calls: list[ToolCall]
    tool_call_id: str


class ChatRequest(TypedDict, total=False):
    model: str
    messages: list[Message]
    tools: list[dict[str, Any]]
    tool_choice: Any
    stream: bool
    stream_options: dict[str, Any]
    max_tokens: int
    max_completion_tokens: int
    n: NotRequired[int]


ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
"""Roles a chat-completions message may carry (OpenAI's API reference)."""

_EMPTY_DROPPED = frozenset({"tool_calls", "annotations", "audio", "refusal", "function_call", "reasoning_content"})


def _canonical_tool_call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    fn = call.get("function")
    if "index" not in call and None not in call.values() and (not isinstance(fn, dict) or None not in fn.values()):
        return call  # already canonical (the common case: no copy)
    out = {k: v for k, v in call.items() if v is not None and k != "index"}
    fn = out.get("function")
    if isinstance(fn, dict):
        out["function"] = {k: v for k, v in fn.items() if v is not None}
    return out


def _already_canonical(message: dict[str, Any], role: Any) -> bool:
    """True when ``canonical`` would change nothing (checked without copying)."""
    for key, value in message.items():
        if value is None or (key in _EMPTY_DROPPED and not value):
            return False
        if key == "tool_calls" and not (isinstance(value, list) and all(_canonical_tool_call(c) is c for c in value)):
            return False
        if key == "content" and role == "assistant" and value == "":
            return False
    return True


def canonical(message: dict[str, Any]) -> dict[str, Any]:
    """Return the canonical form of ``message`` (the input itself when already canonical; never mutated).

    Rules: drop keys whose value is ``None``; drop empty ``tool_calls``/``annotations``/``audio``/
    ``refusal``/``function_call``; for assistant messages treat ``content`` ``""`` as absent;
    drop ``index`` inside tool calls.
    """
    role = message.get("role")
    if _already_canonical(message, role):
        return message
    out: dict[str, Any] = {}
    for key, value in message.items():
        if value is None:
            continue
        if key in _EMPTY_DROPPED and not value:
            continue
        if key == "content" and role == "assistant" and value == "":
            continue
        if key == "tool_calls" and isinstance(value, list):
            value = [_canonical_tool_call(c) for c in value]
        out[key] = value
    return out


def canonical_bytes(message: dict[str, Any]) -> bytes:
    """Canonical JSON bytes of ``message``: sorted keys, compact, UTF-8."""
    return orjson.dumps(canonical(message), option=orjson.OPT_SORT_KEYS)


def message_digest(message: dict[str, Any]) -> str:
    """Hex SHA-256 of the canonical bytes: identifies a message's content regardless of position."""
    return hashlib.sha256(canonical_bytes(message)).hexdigest()


def chain_hash(parent_hash: str | None, digest: str) -> str:
    """Hex SHA-256 over the parent's chain hash and this message's digest.

    Identifies a message together with everything before it, so an event anchored on a chain
    hash applies exactly to requests whose history contains that prefix.
    """
    return hashlib.sha256(f"{parent_hash or ''}:{digest}".encode()).hexdigest()


def digests_and_chain(messages: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Return ``(digests, chain_hashes)`` for ``messages``, one of each per message."""
    digests: list[str] = []
    chain: list[str] = []
    parent: str | None = None
    for message in messages:
        d = message_digest(message)
        parent = chain_hash(parent, d)
        digests.append(d)
        chain.append(parent)
    return digests, chain


def text_of(content: Any) -> str:
    """The text of a message's ``content``: a string as is; text parts of a list joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif isinstance(part.get("content"), str):
                    parts.append(part["content"])
        return "\n".join(parts)
    return str(content)
