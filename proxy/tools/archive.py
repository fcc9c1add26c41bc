"""The archive: a session's log as one Markdown document, paged by lines, that only ever grows.

It is a *view* of the log (DESIGN.md section 3), rendered on each read from the stored messages and
events, never a second copy. The document is the branch's messages in order (``seq``), each
rendered on its own, and one "## Compaction N" block per summary event, placed where the event
happened: after its cutoff message and after every message stored before it (``created_at``). The
block names the messages it summarized that no block above names (from the event's first summarized
message, its payload's ``first_hash``: leading system messages are kept, not summarized; a chained
compaction's from the one after the previous block's cutoff) and the line the first of them starts
at, then shows the
summary the model was given instead of them (``payload["summary"]``, fenced like message text).
So a later compaction, like a later message, appends lines: it never renumbers what was there
(the read tool and ``GET /sessions/{id}/archive?offset=`` name the same line numbers over time).
The header has no counts for the same reason.

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
from collections.abc import AsyncGenerator, Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from proxy.conversation.canonical import text_of
from storage.records import EventRecord, MessageRecord

if TYPE_CHECKING:
    from storage.store import Store

LINE_CHARS = 2000
"""Longest line of the document, in characters (the read tool's segment length, so that its line
numbers and the REST view's are the same)."""
INLINE_CHARS = 200
"""Longest inline value (a name, id, role), in characters of its JSON quoting; longer ones are cut
with a mark (the full value is in ``/sessions/{id}/messages``)."""
PAGE_CHARS = 1_000_000
"""Characters of messages aimed at per page read from the store while streaming: the next page's
message count is this over the last page's mean size, between ``MIN_PAGE_MESSAGES`` and
``PAGE_MESSAGES`` (so memory is about one page, whatever the messages' sizes)."""
MIN_PAGE_MESSAGES = 10
PAGE_MESSAGES = 500
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


def _span(text: str) -> str:
    """``text`` (one line) as a Markdown code span that nothing inside can close."""
    ticks = "`" * (max((len(m) for m in _BACKTICKS.findall(text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _escape_odd(text: str) -> str:
    """``text`` with line breaks and lone surrogates as ``\\uXXXX`` escapes (it stays one line)."""
    if _is_clean(text):
        return text.replace("\n", "\\n")
    return _ODD.sub(lambda m: "".join(f"\\u{ord(c):04x}" for c in m.group(0)), text.replace("\n", "\\n"))


def _inline(value: Any) -> str:
    """An untrusted value as a JSON-quoted code span on one line, cut at ``INLINE_CHARS``."""
    try:
        quoted = orjson.dumps(value).decode()
    except TypeError:  # orjson.JSONEncodeError: lone surrogates, odd types
        quoted = ascii(value)
    quoted = _escape_odd(quoted)
    if len(quoted) > INLINE_CHARS:
        quoted = f"{quoted[:INLINE_CHARS]}… ({len(quoted)} chars)"
    return _span(quoted)


_WRAP_CHARS = LINE_CHARS - 8  # room for the fence and its info string on a line of their own


def _wrapped(text: str) -> list[str]:
    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= _WRAP_CHARS:
            out.append(line)
        else:
            out.extend(line[i : i + _WRAP_CHARS] for i in range(0, len(line), _WRAP_CHARS))
    return out


def _block(text: str, info: str) -> Iterator[str]:
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
    head = f"### [{record.seq}] {role if role in ROLES else 'role ' + _inline(role)}"
    if record.internal:
        head += f" — {INTERNAL_MARK}"
    yield head
    fields = []
    if m.get("name"):
        fields.append(f"name {_inline(m['name'])}")
    if m.get("tool_call_id"):
        fields.append(f"answer to {_inline(m['tool_call_id'])}")
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
                yield f"**tool result** for {_inline(part.get('tool_use_id'))}:"
                yield ""
                yield from _nested(part["content"])
            elif (isinstance(part, dict) and not isinstance(part.get("text"), str)
                    and not isinstance(part.get("content"), str)):
                yield f"[{_inline(part.get('type', 'part'))} part: {len(orjson.dumps(part))} bytes]"
                yield ""
    text = text_of(content)
    if text:
        yield from _block(text, "text")
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
    yield f"**tool call** {_inline(call_id)} {_inline(name)}:"
    yield ""
    yield from _block(arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode(), "json")
    yield ""


def _nested(blocks: list[Any]) -> Iterator[str]:
    """The blocks of a Messages ``tool_result``: text as text, anything else by type and size."""
    for block in blocks:
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            yield from _block(block["text"], "text")
        else:
            kind = block.get("type", "part") if isinstance(block, dict) else "part"
            yield f"[{_inline(kind)} part: {len(orjson.dumps(block))} bytes]"
        yield ""


def _event_lines(n: int, event: EventRecord, first_seq: int, cutoff_seq: int, first_line: int | None) -> Iterator[str]:
    """A compaction's block: its heading, the messages it summarized (and the line they start at),
    then the summary the model was given instead of them, fenced (it is model-written text)."""
    yield f"## Compaction {n} — {event.created_at.isoformat()} (event `{event.id}`)"
    yield ""
    where = "" if first_line is None else f" (from line {first_line})"
    yield (f"Messages {first_seq} to {cutoff_seq} above{where} were summarized; "
           "the model was given this summary instead:")
    yield ""
    summary = event.payload.get("summary")
    if isinstance(summary, str):
        yield from _block(summary, "text")
    else:
        yield "(no summary text was recorded)"
    yield ""


def _first_hash(event: EventRecord) -> str:
    """The chain hash of the first message ``event`` summarized (``""``: not recorded)."""
    first = event.payload.get("first_hash")
    return first if isinstance(first, str) else ""


class ArchiveRenderer:
    """Renders the archive incrementally: ``head()``, then ``message(m)`` for each message of the
    branch in ``seq`` order, then ``tail()``. Holds the summary events only (not the messages)."""

    def __init__(self, session_id: str, events: Iterable[EventRecord]) -> None:
        self.session_id = session_id
        self._pending = sorted((e for e in events if e.kind == "summary"), key=lambda e: (e.created_at, e.id))
        self._seen: dict[str, int] = {}  # chain hash -> seq, for pending events' anchors and first messages only
        self._named = {e.anchor_hash for e in self._pending} | {_first_hash(e) for e in self._pending} - {""}
        self._count = 0
        self._next_first = 0  # the seq after the highest cutoff shown
        self._cutoffs: list[int] = []  # shown compactions' cutoffs, in the order shown
        self._line = 0  # the number of the next line (0-based, as ``?offset=`` counts)
        self._starts: dict[int, int] = {}  # seq -> the line its heading is on, for seq >= _next_first

    def _counted(self, lines: Iterable[str]) -> Iterator[str]:
        for line in lines:
            self._line += 1
            yield line

    def head(self) -> Iterator[str]:
        return self._counted(self._head())

    def _head(self) -> Iterator[str]:
        shown = _escape_odd(self.session_id)
        shown = shown if len(shown) <= INLINE_CHARS else f"{shown[:INLINE_CHARS]}… ({len(shown)} chars)"
        yield f"# Archive of session {_span(shown)}"
        yield ""
        yield ("The session's log in order; a compaction is recorded where it happened, after the messages it "
               "summarized. Lines keep their numbers as the session grows.")
        yield ""

    def _due(self, before: datetime | None) -> Iterator[str]:
        """Blocks of pending events whose anchor was rendered and that happened before ``before``
        (``None``: the end), in the order they happened. An event's place depends only on its
        anchor and on when the messages around it were stored, so nothing added later moves it."""
        kept: list[EventRecord] = []
        for event in self._pending:
            cutoff = self._seen.get(event.anchor_hash)
            if cutoff is None or (before is not None and event.created_at >= before):
                kept.append(event)
                continue
            self._count += 1
            first = self._first_summarized(cutoff, self._seen.get(_first_hash(event), -1))
            yield from self._counted(_event_lines(self._count, event, first, cutoff, self._starts.get(first)))
            self._cutoffs.append(cutoff)
            if cutoff >= self._next_first:
                self._next_first = cutoff + 1
                self._starts = {seq: line for seq, line in self._starts.items() if seq >= self._next_first}
        self._pending = kept

    def _first_summarized(self, cutoff: int, named: int) -> int:
        """The seq of the first message a compaction with this cutoff summarized that no block
        above names: the one after the previous shown compaction's cutoff; for a compaction made on
        another branch whose cutoff is in this one's shared start, before a cutoff shown already (it
        did not see that one), the one after the highest shown cutoff below its own (0 if none). Not
        before ``named``, the seq of the first message the event says it summarized (its payload's
        ``first_hash``; -1: not recorded or not seen): the leading system messages are kept, not
        summarized."""
        start = self._next_first if cutoff >= self._next_first else 1 + max(
            (c for c in self._cutoffs if c < cutoff), default=-1)
        return max(start, named) if named <= cutoff else start

    def message(self, record: MessageRecord) -> Iterator[str]:
        yield from self._due(record.created_at)
        self._starts[record.seq] = self._line
        yield from self._counted(message_lines(record))
        if record.chain_hash in self._named:
            self._seen[record.chain_hash] = record.seq

    def tail(self) -> Iterator[str]:
        """Events anchored in the branch not yet placed (those anchored elsewhere are not shown)."""
        yield from self._due(None)
        self._pending = []


def archive_lines(session_id: str, messages: Iterable[MessageRecord], events: Iterable[EventRecord]) -> Iterator[str]:
    """The archive's lines (without ``\\n``): ``messages`` are one branch, root first."""
    renderer = ArchiveRenderer(session_id, events)
    yield from renderer.head()
    for record in messages:
        yield from renderer.message(record)
    yield from renderer.tail()


def render_archive(session_id: str, messages: Sequence[MessageRecord], events: Sequence[EventRecord]) -> str:
    """Markdown of ``messages`` (one branch, root first) with the summary ``events`` placed where
    they happened; every line ends with ``\\n``. See the module docstring for the layout."""
    return "".join(line + "\n" for line in archive_lines(session_id, messages, events))


async def stream_archive_lines(
    store: Store, session_id: str, session_pk: int, leaf_hash: str | None, *, page_messages: int = PAGE_MESSAGES
) -> AsyncGenerator[str, None]:
    """The archive's lines for the branch ending at ``leaf_hash`` (a tip the caller resolved;
    ``None``: an empty session). The branch's message ids are read once, then the messages in
    pages by id of about ``PAGE_CHARS`` characters (at most ``page_messages`` messages), so memory
    is one page, not the session, and each page is one indexed query. Raises what ``Store`` raises."""
    renderer = ArchiveRenderer(session_id, await store.list_events(session_pk))
    for line in renderer.head():
        yield line
    ids = [] if leaf_hash is None else await store.branch_message_ids(session_pk, leaf_hash)
    start, size = 0, min(page_messages, MIN_PAGE_MESSAGES)
    while start < len(ids):
        page = await store.messages_by_ids(session_pk, ids[start : start + size])
        start += size
        chars = 0
        for record in page:
            for line in renderer.message(record):
                chars += len(line)
                yield line
        size = max(MIN_PAGE_MESSAGES, min(page_messages, PAGE_CHARS * len(page) // max(chars, 1)))
    for line in renderer.tail():
        yield line
