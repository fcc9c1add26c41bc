"""Token accounting of the fake upstream: model names, windows and prompt token counts.

The fake counts independently of ``proxy.tokens.counter`` (it stands for the provider, so it must not
agree with the proxy by construction). Rule, documented once here:

``count_prompt_tokens(body)`` = 3 tokens of reply priming
  + for each message: 3 framing tokens + tokens of its text
  + tokens of the ``tools`` array serialized as compact JSON.

A message's text is: string ``content``; each ``text`` part of a content list; 765 tokens per
``image_url`` part whatever its size or base64 length (OpenAI's cost of a 512x512 high-detail
tile set, the figure case 019 uses); Anthropic ``tool_use`` blocks as name + JSON input and
``tool_result`` blocks by their content; ``name``; each tool call's ``function.name`` and
``function.arguments``. Tokens are tiktoken ``o200k_base`` (GPT-4o and later).

Without the encoding file (a public clone: no ``../shared/tiktoken``, no ``$TIKTOKEN_CACHE_DIR``
holding it) the fake never downloads: it counts ``ceil(utf8_bytes / 4)`` tokens a text, the
estimate the proxy documents for the same case (``encoding()`` is None then). Tests whose
expected numbers are exact tiktoken counts skip then (``tests.support.shared``).
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from typing import Any

IMAGE_PART_TOKENS = 765
"""Tokens charged per ``image_url`` content part (case 019)."""
TOKENS_PER_MESSAGE = 3
TOKENS_PER_REPLY = 3
DEFAULT_WINDOW_TOKENS = 131_072

_FAKE_MODEL = re.compile(r"^fake-(\d+)(k?)(?:-(.+))?$")


FALLBACK_BYTES_PER_TOKEN = 4
"""Without the encoding file a text costs ``ceil(utf8_bytes / 4)`` tokens."""


@lru_cache(maxsize=1)
def encoding() -> Any:
    """The o200k_base encoding, loaded once, or None when its file is not at hand.

    Looked up in ``tests.support.shared.tiktoken_cache_dir()`` (``$TIKTOKEN_CACHE_DIR``, else
    ``../shared/tiktoken``) and loaded only when the file is there and intact: tiktoken would
    download it otherwise (and hang on a machine without network).
    """
    from tests.support.shared import has_exact_encoding, tiktoken_cache_dir

    cache_dir = tiktoken_cache_dir()
    if not has_exact_encoding("o200k_base", cache_dir):
        return None
    import tiktoken

    previous = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = cache_dir
    try:
        return tiktoken.get_encoding("o200k_base")
    finally:
        if previous is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = previous


def count_text_tokens(text: str) -> int:
    """Tokens of ``text`` in o200k_base (no framing); the byte estimate without the file."""
    if not text:
        return 0
    enc = encoding()
    if enc is None:
        return -(-len(text.encode("utf-8", "surrogatepass")) // FALLBACK_BYTES_PER_TOKEN)
    return len(enc.encode(text, disallowed_special=()))


def parse_fake_model(model: str) -> tuple[int, str] | None:
    """``fake-<window>-<style>`` -> ``(window_tokens, style)``; None for other names.

    ``<window>`` is ``2k`` (2,048), ``4k``, ..., ``128k`` (131,072) or a plain integer; the
    style is everything after the second dash (``fake-2k-llamacpp-2025-midstream``) and
    defaults to ``openai`` when missing.
    """
    match = _FAKE_MODEL.match(model)
    if match is None:
        return None
    number, kilo, style = match.groups()
    window_tokens = int(number) * (1024 if kilo else 1)
    return window_tokens, style or "openai"


def _part_text(part: Any) -> tuple[str, int]:
    """(text, extra_tokens) of one content part or block."""
    if isinstance(part, str):
        return part, 0
    if not isinstance(part, dict):
        return "", 0
    kind = part.get("type")
    if kind == "image_url" or kind == "image":
        return "", IMAGE_PART_TOKENS
    if kind == "tool_use":
        return f"{part.get('name', '')}\n{json_values_text(part.get('input'))}", 0
    if kind == "tool_result":
        return content_text(part.get("content")), 0
    for key in ("text", "refusal"):
        if isinstance(part.get(key), str):
            return part[key], 0
    return "", 0


def content_text(content: Any) -> str:
    """Text of a ``content`` value: a string, or the texts of its parts joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(t for t, _ in map(_part_text, content) if t)
    return ""


def json_values_text(value: Any) -> str:
    """Every string found inside a JSON value (or JSON-encoded string), one per line.

    Tool-call arguments are JSON strings: a ``FACT:`` line inside an argument is escaped
    (``\\n``), so it is searched in the decoded values as well.
    """
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        if isinstance(decoded, str):
            return decoded
        value = decoded
    out: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, dict):
            for item in node.values():
                walk(item)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(value)
    return "\n".join(out)


def message_text(message: dict[str, Any]) -> str:
    """All text the model sees in one message: content, name, tool-call names and arguments.

    Arguments appear raw and, when they are JSON, as their decoded string values too.
    """
    pieces = [content_text(message.get("content"))]
    if isinstance(message.get("name"), str):
        pieces.append(message["name"])
    for call in message.get("tool_calls") or []:
        function = (call or {}).get("function") or {}
        arguments = function.get("arguments")
        pieces.append(str(function.get("name") or ""))
        if isinstance(arguments, str):
            pieces.append(arguments)
            decoded = json_values_text(arguments)
            if decoded != arguments:
                pieces.append(decoded)
    return "\n".join(p for p in pieces if p)


def count_message_tokens(message: dict[str, Any]) -> int:
    """3 framing tokens + content/name/tool-call tokens + 765 per image part."""
    n = TOKENS_PER_MESSAGE
    content = message.get("content")
    if isinstance(content, str):
        n += count_text_tokens(content)
    elif isinstance(content, list):
        for part in content:
            text, extra = _part_text(part)
            n += count_text_tokens(text) + extra
    if isinstance(message.get("name"), str):
        n += count_text_tokens(message["name"])
    for call in message.get("tool_calls") or []:
        function = (call or {}).get("function") or {}
        n += count_text_tokens(str(function.get("name") or ""))
        n += count_text_tokens(str(function.get("arguments") or ""))
    return n


def count_tools_tokens(tools: Any) -> int:
    """Tokens of the ``tools`` array as compact JSON (0 when absent)."""
    if not tools:
        return 0
    return count_text_tokens(json.dumps(tools, separators=(",", ":"), ensure_ascii=False))


def count_prompt_tokens(body: dict[str, Any]) -> int:
    """Prompt tokens of a chat-completions body as this fake provider charges them.

    See the module docstring for the rule. Non-dict messages count their framing only.
    """
    messages = body.get("messages") or []
    total = TOKENS_PER_REPLY + count_tools_tokens(body.get("tools"))
    for message in messages:
        total += count_message_tokens(message) if isinstance(message, dict) else TOKENS_PER_MESSAGE
    return total


def requested_output_tokens(body: dict[str, Any]) -> int:
    """``max_tokens`` or ``max_completion_tokens`` (0 when neither is an integer)."""
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0
