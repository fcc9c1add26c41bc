"""The proxy's own tool rounds in Anthropic Messages terms (pure: no I/O).

A round the proxy served inside one request is two turns the client never sees: the assistant turn
as the provider sent it (its thinking, its text, its ``tool_use`` blocks of the proxy's tool) and a
user turn of ``tool_result`` blocks. The client is sent what every round showed it, in order: the
blocks of each round's assistant turn but the proxy's ``tool_use`` blocks, then the last round's
answer, as one assistant message (``merged``). The log keeps the rounds as internal messages and
that merged message as the reply; on a later request the rounds are put back where they ran
(``proxy.forward.session_log.SessionLog.expand_internal``) and the client's echo of the merged
message loses the blocks the rounds already carry (``after_rounds``), so the provider sees each
block once, after the very prefix it was made over (a thinking block's signature binds it there).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

from proxy.conversation.messages_codec import hash_view
from proxy.json_depth import DeepBudgetExceeded, dumps

Block = dict[str, Any]


def split_uses(content: Any, own: Collection[str]) -> tuple[list[Block], int]:
    """``(own tool_use blocks, number of the client's tool_use blocks)`` of an assistant ``content``."""
    mine: list[Block] = []
    theirs = 0
    for block in content if isinstance(content, list) else ():
        if isinstance(block, dict) and block.get("type") == "tool_use":
            if block.get("name") in own:
                mine.append(block)
            else:
                theirs += 1
    return mine, theirs


def as_calls(uses: Sequence[Block]) -> list[dict[str, Any]]:
    """``tool_use`` blocks as the chat-shaped calls ``ToolRounds.serve`` answers
    (``{"id", "type": "function", "function": {"name", "arguments": JSON text}}``)."""
    out = []
    for block in uses:
        raw = block.get("input_json")  # (a streamed input that did not parse: passed on as its text)
        arguments = raw if isinstance(raw, str) else _json_text(block.get("input", {}))
        out.append({"id": block.get("id"), "type": "function",
                    "function": {"name": block.get("name"), "arguments": arguments}})
    return out


def _json_text(value: Any) -> str:
    """``json.dumps(value)``; one nested deeper than the stdlib's writer recurses (a model's input
    1,000 deep, which orjson reads), as orjson's compact text (``proxy.json_depth``): the same value."""
    try:
        return json.dumps(value)
    except RecursionError:
        return dumps(value).decode()


def without(content: Any, uses: Sequence[Block]) -> list[Block]:
    """``content`` without the blocks ``uses`` (by identity: blocks of that very list)."""
    drop = {id(b) for b in uses}
    return [b for b in content if id(b) not in drop] if isinstance(content, list) else []


def shown(run: Sequence[dict[str, Any]]) -> list[Block]:
    """The blocks the client was shown of ``run`` (internal turns, in order): each assistant turn's
    blocks but its ``tool_use`` blocks that a ``tool_result`` of the run answers."""
    answered = set()
    for m in run:
        content = m.get("content")
        if m.get("role") == "user" and isinstance(content, list):
            answered |= {b.get("tool_use_id") for b in content
                         if isinstance(b, dict) and b.get("type") == "tool_result"}
    out: list[Block] = []
    for m in run:
        if m.get("role") != "assistant" or not isinstance(m.get("content"), list):
            continue
        out += [b for b in m["content"]
                if not (isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id") in answered)]
    return out


def merged(run: Sequence[dict[str, Any]], content: list[Block]) -> list[Block]:
    """The content the client is sent after the rounds ``run``: what they showed, then ``content``."""
    return [*shown(run), *content]


def after_rounds(run: Sequence[dict[str, Any]], message: dict[str, Any]) -> dict[str, Any]:
    """The client's ``message`` that followed the internal turns ``run``, as the provider is sent it
    after them: an assistant turn that starts with the blocks the rounds showed (``shown``, compared
    as ``hash_view`` reads them) without those; any other message (the client edited it, or it is
    not the reply) as it came."""
    content = message.get("content")
    if message.get("role") != "assistant" or not isinstance(content, list):
        return message
    prefix = shown(run)
    n = len(prefix)
    if not prefix or len(content) <= n:
        return message
    try:
        if hash_view({"content": content[:n]}) != hash_view({"content": prefix}):
            return message
    except (DeepBudgetExceeded, RecursionError):  # rounds nested deeper than the request's budget walks, or
        return message  # than ``!=`` recurses (about 950 levels; orjson reads 1,024): not compared
    return {**message, "content": content[n:]}
