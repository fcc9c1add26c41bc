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
stays ``null`` and ``""`` stays ``""`` (case 025). Arguments nested deeper than
``MAX_DEPTH`` are left as sent (the walk and the stdlib's writer recurse; a fixed bound keeps the
projection the same from request to request).

The defense reads no native key: it decides over the codec's parts (``TOOL_CALL`` parts, their
``ToolCall`` name and arguments) and rewrites through the codec, so chat ``tool_calls``, Messages
``tool_use`` blocks and Responses ``function_call`` items are truncated by the same code.
"""

from __future__ import annotations

import json
from typing import Any

from proxy.conversation.codec import UNCOUNTED, Codec
from proxy.conversation.model import ASSISTANT, CALL, TOOL_CALL, Item, Piece
from proxy.json_text import without_lone_surrogates

MARKER = "...(argument truncated)"
MAX_DEPTH = 254
"""Arguments nested deeper than this are not truncated (orjson's writing depth, ``proxy.json_depth``)."""
_CALLERS = frozenset({ASSISTANT, CALL})
"""Item kinds whose tool calls are truncated (a model turn, a call item of its own)."""


class TooDeep(Exception):
    """Arguments nested deeper than ``MAX_DEPTH`` (``shorten``): left as sent."""


def shorten(value: Any, max_chars: int, keep_chars: int, depth: int = 0) -> tuple[Any, bool]:
    """Shorten every string longer than ``max_chars`` inside ``value`` (nested dicts/lists too).

    Returns ``(new_value, changed)``; ``value`` is not mutated and is returned as is when unchanged.
    Raises ``TooDeep`` for a value nested deeper than ``MAX_DEPTH`` (``depth``: its own depth).
    """
    if depth > MAX_DEPTH:
        raise TooDeep
    if isinstance(value, str):
        if len(value) > max_chars:
            return value[:keep_chars] + MARKER, True
        return value, False
    if isinstance(value, dict):
        changed = False
        out: dict[str, Any] = {}
        for k, v in value.items():
            out[k], c = shorten(v, max_chars, keep_chars, depth + 1)
            changed = changed or c
        return (out, True) if changed else (value, False)
    if isinstance(value, list):
        items = [shorten(v, max_chars, keep_chars, depth + 1) for v in value]
        if any(c for _, c in items):
            return [v for v, _ in items], True
        return value, False
    return value, False


def truncate_arguments(arguments: str, max_chars: int, keep_chars: int) -> str:
    """Return ``arguments`` (a JSON string) with long string values shortened; the same object if unchanged.

    Valid JSON stays valid JSON with the same keys (a lone surrogate escape in it comes back as
    U+FFFD, ``proxy.json_text``); invalid JSON longer than ``max_chars`` is cut as a raw string to
    ``keep_chars`` plus the marker. Raises ``TooDeep`` for JSON nested deeper than ``MAX_DEPTH``.
    """
    if len(arguments) <= max_chars:
        return arguments  # no string inside can be longer than the whole
    try:
        parsed = json.loads(arguments)
    except RecursionError:  # (deeper than the stdlib's reader recurses: past ``MAX_DEPTH`` too)
        raise TooDeep from None
    except ValueError:
        return arguments[:keep_chars] + MARKER
    new, changed = shorten(parsed, max_chars, keep_chars)
    if not changed:
        return arguments
    return json.dumps(without_lone_surrogates(new), ensure_ascii=False)  # orjson writes the body: none may be left


def truncate_message(
    message: Piece, tools: frozenset[str], max_chars: int, keep_chars: int, *,
    item: Item, codec: Codec,
) -> Piece | None:
    """A copy of a model turn or call (``message``, a piece of ``codec``; ``item``: its item,
    ``codec.item(message)``) with truncated arguments of calls to ``tools``;
    ``None`` if unchanged.

    Decided over the codec's parts: only ``TOOL_CALL`` parts of an ``ASSISTANT`` or ``CALL`` item
    (never a ``sealed`` one) whose ``codec.tool_call`` names one of ``tools``; a JSON-text argument
    goes through ``truncate_arguments``, a JSON value through ``shorten`` (one nested deeper than
    ``MAX_DEPTH`` is kept as sent), and the part is rewritten with ``codec.with_arguments``/
    ``codec.with_parts``: ids, order, roles and every other part (text content ``None``/``""``
    included) are kept as sent.
    """
    if item.kind not in _CALLERS or item.sealed:
        return None
    new: dict[int, object] = {}
    for index, part in enumerate(codec.parts(message, UNCOUNTED)):
        if part.kind != TOOL_CALL:
            continue
        call = codec.tool_call(part)
        if call is None or not isinstance(call.name, str) or call.name not in tools:
            continue
        try:
            if isinstance(call.arguments, str):
                arguments: object = truncate_arguments(call.arguments, max_chars, keep_chars)
                changed = arguments is not call.arguments
            else:
                arguments, changed = shorten(call.arguments, max_chars, keep_chars)
        except TooDeep:
            continue
        if changed:
            new[index] = codec.with_arguments(part, arguments)
    return codec.with_parts(message, new) if new else None
