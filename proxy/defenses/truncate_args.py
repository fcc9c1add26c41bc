"""Defense 1: truncate long string arguments of older calls to file-writing tools.

DESIGN.md section 2: in older assistant ``tool_calls`` of the configured tools (``write_file``,
``edit_file``), a string argument longer than ``truncate_args_max_chars`` (2,000) keeps its first
``truncate_args_keep_chars`` (20) characters plus ``...(argument truncated)``. The log keeps the
original.

``function.arguments`` stays valid JSON with the same keys: string values *inside* the JSON are
shortened, then the object is serialized again (``json.dumps``, ``ensure_ascii=False``, key order
preserved). Arguments that are not valid JSON (some models emit broken JSON) are cut as a raw
string, since there is no structure to keep. Anthropic ``tool_use`` blocks (``input`` object) of the
same tools are shortened the same way. The message's ``content`` is never touched, so ``null``
stays ``null`` and ``""`` stays ``""`` (case 025).
"""

from __future__ import annotations

import json
from typing import Any

from proxy.json_text import without_lone_surrogates

MARKER = "...(argument truncated)"


def shorten(value: Any, max_chars: int, keep_chars: int) -> tuple[Any, bool]:
    """Shorten every string longer than ``max_chars`` inside ``value`` (nested dicts/lists too).

    Returns ``(new_value, changed)``; ``value`` is not mutated and is returned as is when unchanged.
    """
    if isinstance(value, str):
        if len(value) > max_chars:
            return value[:keep_chars] + MARKER, True
        return value, False
    if isinstance(value, dict):
        changed = False
        out: dict[str, Any] = {}
        for k, v in value.items():
            out[k], c = shorten(v, max_chars, keep_chars)
            changed = changed or c
        return (out, True) if changed else (value, False)
    if isinstance(value, list):
        items = [shorten(v, max_chars, keep_chars) for v in value]
        if any(c for _, c in items):
            return [v for v, _ in items], True
        return value, False
    return value, False


def truncate_arguments(arguments: str, max_chars: int, keep_chars: int) -> str:
    """Return ``arguments`` (a JSON string) with long string values shortened; the same object if unchanged.

    Valid JSON stays valid JSON with the same keys (a lone surrogate escape in it comes back as
    U+FFFD, ``proxy.json_text``); invalid JSON longer than ``max_chars`` is cut as a raw string to
    ``keep_chars`` plus the marker.
    """
    if len(arguments) <= max_chars:
        return arguments  # no string inside can be longer than the whole
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments[:keep_chars] + MARKER
    new, changed = shorten(parsed, max_chars, keep_chars)
    if not changed:
        return arguments
    return json.dumps(without_lone_surrogates(new), ensure_ascii=False)  # orjson writes the body: none may be left


def truncate_message(
    message: dict[str, Any], tools: frozenset[str], max_chars: int, keep_chars: int
) -> dict[str, Any] | None:
    """A copy of an assistant ``message`` with truncated arguments of calls to ``tools``; ``None`` if unchanged.

    Only ``tool_calls[*].function.arguments`` and ``tool_use`` blocks' ``input`` change; ids,
    order, roles and ``content`` (``None``/``""``/text) are kept as sent.
    """
    if message.get("role") != "assistant":
        return None
    out: dict[str, Any] | None = None
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        new_calls: list[Any] = []
        changed = False
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else None
            if isinstance(fn, dict) and isinstance(args, str) and fn.get("name") in tools:
                new_args = truncate_arguments(args, max_chars, keep_chars)
                if new_args is not args:
                    call = {**call, "function": {**fn, "arguments": new_args}}
                    changed = True
            new_calls.append(call)
        if changed:
            out = {**message, "tool_calls": new_calls}
    content = message.get("content")
    if isinstance(content, list):
        new_parts: list[Any] = []
        changed = False
        for part in content:
            if isinstance(part, dict) and part.get("type") == "tool_use" and part.get("name") in tools:
                new_input, c = shorten(part.get("input"), max_chars, keep_chars)
                if c:
                    part = {**part, "input": new_input}
                    changed = True
            new_parts.append(part)
        if changed:
            out = {**(out or message), "content": new_parts}
    return out
