"""Tool-pair safety: where a history may be cut, and synthetic answers for dangling tool calls.

A strict provider (OpenAI, DeepSeek, Anthropic behind a bridge) rejects a request where a ``tool``
message does not answer a call of the nearest preceding assistant ``tool_calls`` message, or where
a call is not answered before the next non-tool message. Anthropic-style content blocks pair the
same way: a ``tool_use`` block in an assistant content list is answered by a ``tool_result`` block
in the next message (cases 001, 002, 004, 022).
"""

from __future__ import annotations

from typing import Any

CANCELLED_TEXT = "[context-proxy] This tool call was cancelled or its result is unavailable."
"""Content of the synthetic ``tool`` message that answers a dangling call (DESIGN.md section 2)."""

_ANSWER_ROLES = frozenset({"tool", "function"})


def has_tool_result_blocks(message: dict[str, Any]) -> bool:
    """True if ``message`` carries Anthropic ``tool_result`` blocks in a content list."""
    content = message.get("content")
    if not isinstance(content, list):
        return False
    return any(isinstance(p, dict) and p.get("type") == "tool_result" for p in content)


def is_tool_answer(message: dict[str, Any]) -> bool:
    """True if ``message`` answers the calls of the message before it (``tool`` role or ``tool_result`` blocks)."""
    return message.get("role") in _ANSWER_ROLES or has_tool_result_blocks(message)


def is_user_turn(message: dict[str, Any]) -> bool:
    """True for a ``user`` message written by the user (not a carrier of ``tool_result`` blocks)."""
    return message.get("role") == "user" and not has_tool_result_blocks(message)


def safe_start(messages: list[dict[str, Any]], start: int) -> int:
    """The largest index ``<= start`` where a kept tail may begin without splitting a tool-call pair.

    A tail may not begin on a tool answer: its call (parallel calls included) would be cut off.
    Returns 0 when no such index exists before ``start``.
    """
    while start > 0 and is_tool_answer(messages[start]):
        start -= 1
    return start


def _call_ids(message: dict[str, Any]) -> list[str]:
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or not isinstance(calls, list):
        return []
    return [c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)]


def dangling_calls(messages: list[dict[str, Any]]) -> list[tuple[int, list[str]]]:
    """Unanswered ``tool_calls``: ``(insert_at, [tool_call_id, ...])`` pairs, in order.

    ``insert_at`` is the index of the first message after the block of ``tool`` messages that
    follows the calling assistant message (where the synthetic answers go). Anthropic ``tool_use``
    blocks are not patched here: their answer lives inside the next user message.
    """
    out: list[tuple[int, list[str]]] = []
    i, n = 0, len(messages)
    while i < n:
        ids = _call_ids(messages[i])
        i += 1
        if not ids:
            continue
        pending = list(ids)
        while i < n and messages[i].get("role") in _ANSWER_ROLES:
            answered = messages[i].get("tool_call_id")
            if answered in pending:
                pending.remove(answered)
            i += 1
        if pending:
            out.append((i, pending))
    return out


def patch_dangling(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Return ``messages`` with a synthetic ``tool`` answer after each dangling call, or ``None`` if none dangle.

    The input list is not mutated; unchanged messages are shared.
    """
    found = dangling_calls(messages)
    if not found:
        return None
    out: list[dict[str, Any]] = []
    prev = 0
    for insert_at, ids in found:
        out.extend(messages[prev:insert_at])
        out.extend({"role": "tool", "tool_call_id": cid, "content": CANCELLED_TEXT} for cid in ids)
        prev = insert_at
    out.extend(messages[prev:])
    return out
