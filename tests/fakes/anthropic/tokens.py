"""Token counting of the fake Anthropic provider, and the prompt cut into cacheable segments.

The fake stands for the provider, so it counts independently of ``proxy.tokens``. Texts are
counted by ``tests.fakes.tokens.count_text_tokens``: tiktoken ``o200k_base`` when its file is in
``$TIKTOKEN_CACHE_DIR`` (``../shared/tiktoken``), else ``ceil(utf8_bytes / 4)``; never a
download. Claude's own tokenizer is not public, so any figure here is an estimate; what matters
is that usage, ``count_tokens``, the window checks and the cache all use the same one.

A prompt is cut into *segments*, in the order the API renders a prompt for caching
(https://platform.claude.com/docs/en/build-with-claude/prompt-caching: ``tools`` → ``system`` →
``messages``): one per tool, one per system block (a string system is one block), one per
content block of each message (a string content is one text block). A segment's tokens:

- tool: its definition as compact JSON (``cache_control`` left out);
- text: the text; ``tool_use``: name + compact JSON of ``input``; ``tool_result``: 3 + its
  content (a string, or the sum of its blocks);
- ``image`` / non-text ``document``: ``IMAGE_BLOCK_TOKENS`` (1,600: about the cost the vision
  docs give a 1.15-megapixel image, ``width × height / 750``); text document: its ``data``;
- ``thinking`` / ``redacted_thinking``: their text (``data`` by ``ceil(chars / 4)``) in the
  latest assistant turn, 0 in earlier turns (the extended-thinking docs: thinking blocks of
  previous turns are stripped from the context and not counted);
- any other block: its compact JSON.

Each message adds ``TOKENS_PER_MESSAGE`` (3) to its first segment, and a prompt costs
``REPLY_PRIMING_TOKENS`` (3) more, outside every segment. ``input_tokens`` of a request =
every segment + the priming. A segment's ``digest`` is sha256 of its canonical JSON (sorted
keys, ``cache_control`` and null values left out): what the cache compares.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from tests.fakes.tokens import count_text_tokens

IMAGE_BLOCK_TOKENS = 1_600
TOKENS_PER_MESSAGE = 3
REPLY_PRIMING_TOKENS = 3
TOOL_RESULT_FRAMING_TOKENS = 3


@dataclass(frozen=True)
class Segment:
    """One cacheable piece of the prompt: where it is, its digest, tokens, and breakpoint flag."""

    where: str
    digest: bytes
    tokens: int
    breakpoint: bool


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def canonical(block: Any) -> Any:
    """``block`` without ``cache_control`` and null-valued keys (at its top level)."""
    if isinstance(block, dict):
        return {k: v for k, v in block.items() if k != "cache_control" and v is not None}
    return block


def blocks_of(content: Any) -> list[Any]:
    """A message's content as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def block_tokens(block: Any, counts_thinking: bool) -> int:
    """Tokens of one content block (see the module docstring)."""
    if not isinstance(block, dict):
        return count_text_tokens(compact(block))
    kind = block.get("type")
    if kind == "text":
        return count_text_tokens(str(block.get("text", "")))
    if kind == "tool_use":
        return count_text_tokens(f"{block.get('name', '')}\n{compact(block.get('input'))}")
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, str):
            return TOOL_RESULT_FRAMING_TOKENS + count_text_tokens(content)
        return TOOL_RESULT_FRAMING_TOKENS + sum(block_tokens(b, counts_thinking) for b in blocks_of(content))
    if kind == "image":
        return IMAGE_BLOCK_TOKENS
    if kind == "document":
        source = block.get("source") or {}
        if isinstance(source, dict) and source.get("type") == "text":
            return count_text_tokens(str(source.get("data", "")))
        return IMAGE_BLOCK_TOKENS
    if kind == "thinking":
        return count_text_tokens(str(block.get("thinking", ""))) if counts_thinking else 0
    if kind == "redacted_thinking":
        return -(-len(str(block.get("data", ""))) // 4) if counts_thinking else 0
    return count_text_tokens(compact(canonical(block)))


def _segment(where: str, block: Any, tokens: int) -> Segment:
    digest = hashlib.sha256(compact(canonical(block)).encode()).digest()
    marked = isinstance(block, dict) and block.get("cache_control") is not None
    return Segment(where, digest, tokens, marked)


def prompt_segments(body: dict[str, Any]) -> list[Segment]:
    """The segments of a (validated) request body, in cache order."""
    out: list[Segment] = []
    for i, tool in enumerate(body.get("tools") or []):
        out.append(_segment(f"tools.{i}", tool, count_text_tokens(compact(canonical(tool)))))
    for i, block in enumerate(blocks_of(body.get("system"))):
        out.append(_segment(f"system.{i}", block, block_tokens(block, False)))
    messages = body.get("messages") or []
    latest_assistant = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    for i, message in enumerate(messages):
        for j, block in enumerate(blocks_of(message.get("content"))):
            framing = TOKENS_PER_MESSAGE if j == 0 else 0
            tokens = framing + block_tokens(block, i == latest_assistant)
            out.append(_segment(f"messages.{i}.content.{j}", block, tokens))
    return out


def count_input_tokens(segments: list[Segment]) -> int:
    """``input_tokens`` of a prompt before any cache: every segment + the reply priming."""
    return REPLY_PRIMING_TOKENS + sum(s.tokens for s in segments)


def output_tokens(content: list[dict[str, Any]]) -> int:
    """Tokens of a reply's blocks; at least 1 (the Usage docs: never 0, even for an empty reply)."""
    return max(1, sum(block_tokens(b, True) for b in content))
