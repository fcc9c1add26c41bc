"""The archive: a session's log as one Markdown document, paged by lines, that only ever grows.

It is a *view* of the log (DESIGN.md section 3), rendered on each read from the stored messages and
events, never a second copy. The document is the branch's messages in order (``seq``), each
rendered on its own, and one "## Compaction N" block per summary event, placed where the event
happened: after its cutoff message and after every message stored before it (``created_at``). The
block names the messages it summarized that no block above names (from the event's first summarized
message, its payload's ``first_hash``: leading system messages are kept, not summarized; a chained
compaction's from the one after the previous block's cutoff) and the line the first of them starts
at, then shows the summary the model was given instead of them (``payload["summary"]``, fenced like
message text).
So a later compaction, like a later message, appends lines: it never renumbers what was there
(the read tool and ``GET /sessions/{id}/archive?offset=`` name the same line numbers over time).
The header has no counts for the same reason.

How untrusted text is kept from making structure (fences, code spans, line breaks, line length)
is ``proxy.tools.archive_markdown``'s.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from proxy.tools.archive_markdown import INLINE_CHARS, code_span, fenced, message_lines, one_line
from storage.records import EventRecord, MessageRecord

if TYPE_CHECKING:
    from storage.store import Store

PAGE_CHARS = 1_000_000
"""Characters of messages aimed at per page read from the store while streaming: the next page's
message count is this over the last page's mean size, between ``MIN_PAGE_MESSAGES`` and
``PAGE_MESSAGES`` (so memory is about one page, whatever the messages' sizes)."""
MIN_PAGE_MESSAGES = 10
PAGE_MESSAGES = 500


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
        yield from fenced(summary, "text")
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
        shown = one_line(self.session_id)
        shown = shown if len(shown) <= INLINE_CHARS else f"{shown[:INLINE_CHARS]}… ({len(shown)} chars)"
        yield f"# Archive of session {code_span(shown)}"
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
