"""Tool-pair safety: where a history may be cut, and synthetic answers for dangling tool calls.

A strict provider (OpenAI, DeepSeek, Anthropic behind a bridge) rejects a request where a ``tool``
message does not answer a call of the nearest preceding assistant ``tool_calls`` message, or where
a call is not answered before the next non-tool message. Anthropic-style content blocks pair the
same way: a ``tool_use`` block in an assistant content list is answered by a ``tool_result`` block
in the next message (cases 001, 002, 004, 022).

A message whose role the proxy does not know (``proxy.conversation.canonical.is_known_role``: Llama's ``ipython``,
which answers a tool call; a vendor's own role) is opaque (issue 15): it may be an answer, a note
bound to the message before it, anything. So it is never separated from the message before it (a
kept tail never starts at it), and the calls of an assistant message it follows are never patched
(a synthetic "cancelled" answer could contradict the answer it carries; the provider judges them).
"""

from __future__ import annotations

from typing import Any

from proxy.conversation.canonical import is_known_role

CANCELLED_TEXT = "[context-proxy] This tool call was cancelled or its result is unavailable."
"""Content of the synthetic ``tool`` message that answers a dangling call (DESIGN.md section 2)."""

_ANSWER_ROLES = frozenset({"tool", "function"})


def has_tool_result_blocks(message: dict[str, Any]) -> bool:
    """True if ``message`` carries Anthropic ``tool_result`` blocks in a content list."""
    content = message.get("content")
    if not isinstance(content, list):
        return False
    return any(isinstance(p, dict) and p.get("type") == "tool_result" for p in content)


def _is_answer_role(message: dict[str, Any]) -> bool:
    role = message.get("role")
    return role.__class__ is str and role in _ANSWER_ROLES


def is_tool_answer(message: dict[str, Any]) -> bool:
    """True if ``message`` answers the calls of the message before it (``tool`` role or ``tool_result`` blocks)."""
    return _is_answer_role(message) or has_tool_result_blocks(message)


def binds_to_previous(message: dict[str, Any]) -> bool:
    """True if ``message`` may not be separated from the message before it: a tool answer, or a
    message with a role the proxy does not know (opaque: it may be an answer)."""
    return not is_known_role(message) or is_tool_answer(message)


def is_user_turn(message: dict[str, Any]) -> bool:
    """True for a ``user`` message written by the user (not a carrier of ``tool_result`` blocks)."""
    return message.get("role") == "user" and not has_tool_result_blocks(message)


def safe_start(messages: list[dict[str, Any]], start: int) -> int:
    """The largest index ``<= start`` where a kept tail may begin without splitting a tool-call pair.

    A tail may not begin on a tool answer (its call, parallel calls included, would be cut off) nor
    on a message with a role the proxy does not know (``binds_to_previous``). Returns 0 when no
    such index exists before ``start``.
    """
    while start > 0 and binds_to_previous(messages[start]):
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
    blocks are not patched here: their answer lives inside the next user message. Nor are the
    calls of a block that holds a message with a role the proxy does not know (Llama's
    ``ipython`` answers calls without a ``tool_call_id``): whether they are answered is the
    provider's to judge, and the block is forwarded as sent.
    """
    out: list[tuple[int, list[str]]] = []
    i, n = 0, len(messages)
    while i < n:
        ids = _call_ids(messages[i])
        i += 1
        if not ids:
            continue
        pending = list(ids)
        opaque = False
        while i < n and (_is_answer_role(messages[i]) or not is_known_role(messages[i])):
            if _is_answer_role(messages[i]):
                answered = messages[i].get("tool_call_id")
                if answered in pending:
                    pending.remove(answered)
            else:
                opaque = True
            i += 1
        if pending and not opaque:
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
