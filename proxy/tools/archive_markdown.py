"""Markdown for the archive (``proxy.tools.archive``) that untrusted text cannot give structure to.

Untrusted text (message content, names, roles, ids, tool names and arguments) cannot create
structure: block text is fenced with more backticks than any run inside it and indented two
spaces (so no untrusted line starts at column 0, even for a reader that does not parse
Markdown), inline values are JSON-quoted in code spans, and headings and the "internal (served
by context-proxy)" marker come only from our data. Lines are separated by ``\\n`` only (other line
breaks ``str.splitlines`` knows become ``\\n``; lone surrogates become ``\\udXXX``), and no line is longer than
``LINE_CHARS`` characters (longer content lines continue on the next line), so splitting by
``\\n`` and by ``str.splitlines`` gives the same numbering.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from proxy.conversation.canonical import text_of
from proxy.json_depth import dumps
from storage.records import MessageRecord

LINE_CHARS = 2000
"""Longest line of the document, in characters (the read tool's segment length, so that its line
numbers and the REST view's are the same)."""
INLINE_CHARS = 200
"""Longest inline value (a name, id, role), in characters of its JSON quoting; longer ones are cut
with a mark (the full value is in ``/sessions/{id}/messages``)."""
BLOCK_INDENT = "  "
"""Every line of a fenced block starts with this: lines at column 0 are all ours."""
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
INTERNAL_MARK = "internal (served by context-proxy)"

_ODD = re.compile("\r\n|[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]|[\ud800-\udfff]")
_BACKTICKS = re.compile("`+")


def _fix(match: re.Match[str]) -> str:
    char = match.group(0)
    return f"\\u{ord(char):04x}" if "\ud800" <= char <= "\udfff" else "\n"


_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def _is_clean(text: str) -> bool:
    """No line break but ``\\n`` and no lone surrogate (fast: no regex over clean text)."""
    if any(c in text for c in _BREAKS):
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _clean(text: str) -> str:
    """``text`` with every line break as ``\\n`` and lone surrogates as visible escapes."""
    return text if _is_clean(text) else _ODD.sub(_fix, text)


def code_span(text: str) -> str:
    """``text`` (one line) as a Markdown code span that nothing inside can close."""
    ticks = "`" * (max((len(m) for m in _BACKTICKS.findall(text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def one_line(text: str) -> str:
    """``text`` with line breaks and lone surrogates as ``\\uXXXX`` escapes (it stays one line)."""
    if _is_clean(text):
        return text.replace("\n", "\\n")
    return _ODD.sub(lambda m: "".join(f"\\u{ord(c):04x}" for c in m.group(0)), text.replace("\n", "\\n"))


def inline_value(value: Any) -> str:
    """An untrusted value as a JSON-quoted code span on one line, cut at ``INLINE_CHARS``."""
    try:
        quoted = dumps(value).decode()
    except TypeError:  # orjson.JSONEncodeError: lone surrogates, odd types
        quoted = ascii(value)
    quoted = one_line(quoted)
    if len(quoted) > INLINE_CHARS:
        quoted = f"{quoted[:INLINE_CHARS]}… ({len(quoted)} chars)"
    return code_span(quoted)


_WRAP_CHARS = LINE_CHARS - 8  # room for the fence and its info string on a line of their own


def _wrapped(text: str) -> list[str]:
    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= _WRAP_CHARS:
            out.append(line)
        else:
            out.extend(line[i : i + _WRAP_CHARS] for i in range(0, len(line), _WRAP_CHARS))
    return out


def fenced(text: str, info: str) -> Iterator[str]:
    """``text`` as a fenced block: cleaned, long lines continued on the next line, fenced with
    more backticks than any line inside holds (so no line inside can close it), fence and lines
    indented by ``BLOCK_INDENT`` (Markdown strips it again: CommonMark removes a fence's own
    indentation from its lines), so no untrusted line starts at column 0."""
    lines = _wrapped(_clean(text))
    longest = max((len(m) for line in lines if "`" in line for m in _BACKTICKS.findall(line)), default=0)
    fence = "`" * max(3, 1 + longest)
    yield BLOCK_INDENT + fence + info
    for line in lines:
        yield BLOCK_INDENT + line
    yield BLOCK_INDENT + fence


def message_lines(record: MessageRecord) -> Iterator[str]:
    """The lines of one message: a ``### [seq] role`` heading, then its fields, content and tool
    calls, then a blank line. A function of the record alone (where it falls changes nothing)."""
    m: dict[str, Any] = record.message
    role = m.get("role")
    head = f"### [{record.seq}] {role if role in ROLES else 'role ' + inline_value(role)}"
    if record.internal:
        head += f" — {INTERNAL_MARK}"
    yield head
    fields = []
    if m.get("name"):
        fields.append(f"name {inline_value(m['name'])}")
    if m.get("tool_call_id"):
        fields.append(f"answer to {inline_value(m['tool_call_id'])}")
    if fields:
        yield " · ".join(fields)
    yield ""
    content = m.get("content")
    blocks_used: list[dict[str, Any]] = []  # Anthropic's tool_use blocks, shown as tool calls below
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "tool_use":
                blocks_used.append(part)
            elif isinstance(part, dict) and part.get("type") == "tool_result" and isinstance(part.get("content"), list):
                yield f"**tool result** for {inline_value(part.get('tool_use_id'))}:"
                yield ""
                yield from _nested(part["content"])
            elif (isinstance(part, dict) and not isinstance(part.get("text"), str)
                    and not isinstance(part.get("content"), str)):
                yield f"[{inline_value(part.get('type', 'part'))} part: {len(dumps(part))} bytes]"
                yield ""
    text = text_of(content)
    if text:
        yield from fenced(text, "text")
        yield ""
    calls = m.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        call = call if isinstance(call, dict) else {}
        fn = call["function"] if isinstance(call.get("function"), dict) else {}
        yield from _call_lines(call.get("id"), fn.get("name"), fn.get("arguments", ""))
    for block in blocks_used:
        yield from _call_lines(block.get("id"), block.get("name"), block.get("input", {}))


def _call_lines(call_id: Any, name: Any, arguments: Any) -> Iterator[str]:
    """A tool call: chat's ``tool_calls`` entry, or a Messages ``tool_use`` block (``input``)."""
    yield f"**tool call** {inline_value(call_id)} {inline_value(name)}:"
    yield ""
    yield from fenced(arguments if isinstance(arguments, str) else dumps(arguments).decode(), "json")
    yield ""


def _nested(blocks: list[Any]) -> Iterator[str]:
    """The blocks of a Messages ``tool_result``: text as text, anything else by type and size."""
    for block in blocks:
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            yield from fenced(block["text"], "text")
        else:
            kind = block.get("type", "part") if isinstance(block, dict) else "part"
            yield f"[{inline_value(kind)} part: {len(dumps(block))} bytes]"
        yield ""
