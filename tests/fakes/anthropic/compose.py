"""From a scripted ``Reply`` to the Message the API would send for this request.

What the provider adds (``replies.py`` lists what a test writes):

- ``tool_use`` blocks get an ``id`` (``toolu_01`` + 22 characters) and ``input: {}`` when missing;
- ``thinking`` blocks get their ``signature``, ``redacted_thinking`` blocks their ``data``, each
  bound to the conversation before it (``thinking.py``);
- ``stop_sequences``: the first occurrence of any of them in a text block ends the reply there
  (the sequence itself left out, later blocks dropped), ``stop_reason`` ``stop_sequence`` and
  ``stop_sequence`` the matched string (``message.py``'s field docs);
- ``max_tokens``: blocks are kept while their output tokens fit; the text block that passes the
  budget is cut word by word to fit, other blocks are dropped; then ``stop_reason``
  ``max_tokens`` and ``output_tokens`` = ``max_tokens``. ``max_tokens: 0`` gives no content and 0
  output tokens (the param's docs: it only warms the cache);
- otherwise ``stop_reason`` is the reply's, else ``tool_use`` when it has a ``tool_use`` block,
  else ``end_turn``; ``output_tokens`` the reply's override or ``tokens.output_tokens``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tests.fakes.anthropic.replies import Reply
from tests.fakes.anthropic.thinking import ThinkingSigner, conversation_prefix
from tests.fakes.anthropic.tokens import block_tokens, output_tokens
from tests.fakes.anthropic.turns import merge_turns
from tests.fakes.anthropic.wire import make_id


@dataclass(frozen=True)
class Composed:
    content: list[dict[str, Any]]
    stop_reason: str
    stop_sequence: str | None
    output_tokens: int


def _reply_prefix(body: dict[str, Any], blocks_before: list[dict[str, Any]]) -> bytes:
    turns = merge_turns([*body["messages"], {"role": "assistant", "content": blocks_before}])
    last = len(turns) - 1
    return conversation_prefix(body.get("system"), turns, last, len(turns[last].blocks))


def _fill(body: dict[str, Any], reply: Reply, signer: ThinkingSigner) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = []
    for original in reply.content:
        block = dict(original)  # (only its own keys are set: a tool's input nested 600 deep is no recursion)
        kind = block.get("type")
        if kind == "tool_use":
            block.setdefault("id", make_id("toolu_01"))
            block.setdefault("input", {})
        elif kind == "thinking" and "signature" not in block:
            block["signature"] = signer.sign(block["thinking"], _reply_prefix(body, content))
        elif kind == "redacted_thinking" and "data" not in block:
            block["data"] = signer.redacted_data(_reply_prefix(body, content))
        content.append(block)
    return content


def _cut_at_stop_sequence(content: list[dict[str, Any]], sequences: list[str]) -> tuple[list[dict[str, Any]], str | None]:
    for index, block in enumerate(content):
        if block.get("type") != "text" or not sequences:
            continue
        hits = [(block["text"].find(s), s) for s in sequences if s and s in block["text"]]
        if hits:
            at, sequence = min(hits)
            return [*content[:index], {**block, "text": block["text"][:at]}], sequence
    return content, None


def _fit(block: dict[str, Any], budget: int) -> dict[str, Any] | None:
    if block.get("type") != "text":
        return None
    words = re.findall(r"\s*\S+", block["text"])
    while words and block_tokens({"type": "text", "text": "".join(words)}, True) > budget:
        words.pop()
    return {**block, "text": "".join(words)} if words else None


def compose(body: dict[str, Any], reply: Reply, signer: ThinkingSigner) -> Composed:
    """The content, stop reason, stop sequence and output tokens of the answer (module docstring)."""
    max_tokens = body["max_tokens"]
    if max_tokens == 0:
        return Composed([], "max_tokens", None, 0)
    content, sequence = _cut_at_stop_sequence(_fill(body, reply, signer), list(body.get("stop_sequences") or []))
    kept: list[dict[str, Any]] = []
    used = 0
    for block in content:
        cost = block_tokens(block, True)
        if used + cost > max_tokens:
            partial = _fit(block, max_tokens - used)
            if partial is not None:
                kept.append(partial)
            return Composed(kept, "max_tokens", None, max_tokens)
        kept.append(block)
        used += cost
    if sequence is not None:
        stop_reason = "stop_sequence"
    elif reply.stop_reason is not None:
        stop_reason = reply.stop_reason
    else:
        stop_reason = "tool_use" if any(b.get("type") == "tool_use" for b in kept) else "end_turn"
    counted = reply.output_tokens if reply.output_tokens is not None else output_tokens(kept)
    return Composed(kept, stop_reason, sequence, counted)
