"""The proxy's own tools: search and read back offloaded or summarized content, and (opt-in) compact.

Behind a proxy the model has no tool that reaches the proxy's storage, so a stub that names an
artifact would be a dead end. When a forwarded request carries a stub or a summary, the proxy
appends one function tool of its own after the client's tools (same position and form every
time, so the prompt prefix stays cacheable) and serves calls to it itself, from the database.

A call searches (``query``: words, or a pattern with ``regex``; see ``proxy.tools.search``) all
the stored items the request names, or one (``reference``), or reads one by lines
(``reference`` with ``offset``/``limit``). References are accepted as the model sees them: an
artifact id (``art_…``), its read URL (``/artifacts/art_…?offset=…``), or the archive URL
(``/sessions/{id}/archive``, the id percent-encoded as the summary names it, or raw).

Scope: a reference is served only if it appears in the request the model was given (so ids
cannot be guessed) and belongs to the current session: the archive is this session's only; an
artifact is served when it was stored for this session, or when the client's messages of this
request hold its very content (ids are content-addressed per tenant, so content that another
session of the tenant offloaded first is stored under that session). An id of another session
that text in the conversation merely names reads nothing, unless the setting
``read_tool_scope`` is ``tenant`` (any artifact of the tenant that the request names).

The tools' schemas and a call's argument checks are ``proxy.tools.schemas``'; this module serves calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.conversation.canonical import text_of
from proxy.defenses.hints import archive_url
from proxy.tools.archive import stream_archive_lines
from proxy.tools.document_search import feed_lines
from proxy.tools.schemas import ReadRequest, parse_arguments
from proxy.tools.search import (
    MAX_SEARCH_OFFSET,
    SEARCH_BUDGET_S,
    Searcher,
    split_lines,
)
from storage.records import ArtifactRecord, SessionRecord
from storage.store import Store

ARTIFACT_RE = re.compile(r"\bart_[0-9a-f]{32}\b")
ARCHIVE_RE = re.compile(r"/sessions/([^/\s`'\"?]+)/archive")
"""Any archive URL (to tell whether a request names stored content at all); which session's
archive a request may read is decided by exact match with the current session's (``archive_urls``)."""
MAX_SEARCH_ITEMS = 64
"""Artifacts one search without a reference reads at most (the most recently named)."""



def archive_urls(session_id: str) -> tuple[str, ...]:
    """The forms of the session's archive URL the model may see or pass: encoded, then raw."""
    encoded, raw = archive_url(session_id), f"/sessions/{session_id}/archive"
    return (encoded,) if encoded == raw else (encoded, raw)


def references_in(messages: Sequence[dict[str, Any]]) -> tuple[set[str], set[str]]:
    """Artifact ids and archive session ids named anywhere in ``messages``' text."""
    artifacts, archives = ordered_references(messages)
    return set(artifacts), set(archives)


def ordered_references(messages: Sequence[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Artifact ids and archive session ids named in ``messages``' text, each once, in the order
    they are first named (oldest first)."""
    artifacts: dict[str, None] = {}
    archives: dict[str, None] = {}
    for m in messages:
        text = text_of(m.get("content"))
        if "art_" in text:
            artifacts.update(dict.fromkeys(ARTIFACT_RE.findall(text)))
        if "/archive" in text:
            archives.update(dict.fromkeys(ARCHIVE_RE.findall(text)))
    return list(artifacts), list(archives)


@dataclass(frozen=True, slots=True)
class Visible:
    """What one read may serve. ``artifacts``: ids the request names, oldest first; ``archives``:
    archive session ids it names; ``client``: the client's messages (an artifact of another
    session is this session's too when one of them holds its very content); ``scope``:
    ``session`` or ``tenant`` (setting ``read_tool_scope``)."""

    artifacts: tuple[str, ...] = ()
    archives: frozenset[str] = frozenset()
    client: Sequence[dict[str, Any]] = ()
    scope: str = "session"

    def holds(self, content: str) -> bool:
        """Does a message of the client's hold ``content`` (a text, a part's text or data URL)?"""
        return any(text == content for text in _texts(self.client, len(content)))


def _texts(messages: Sequence[dict[str, Any]], size: int) -> Iterator[str]:
    """The texts of ``messages`` (strings, parts' text/content, media URLs) of length ``size``."""
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            if len(content) == size:
                yield content
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    continue
                media = part.get("image_url")
                url = media.get("url") if isinstance(media, dict) else None
                for text in (part.get("text"), part.get("content"), url):
                    if isinstance(text, str) and len(text) == size:
                        yield text


def visible_in(forwarded: Sequence[dict[str, Any]], client: Sequence[dict[str, Any]], scope: str,
               session_id: str) -> Visible:
    """``Visible`` for a request of session ``session_id`` that forwarded ``forwarded`` (internal
    rounds included) for the client's ``client`` messages. The archive is visible when a message
    names this session's archive URL exactly (``archive_urls``: any session id, quotes, spaces
    and ``%`` included)."""
    artifacts, _ = ordered_references(forwarded)
    urls = archive_urls(session_id)
    named = any(url in text for m in forwarded for text in (text_of(m.get("content")),) if "/archive" in text
                for url in urls)
    return Visible(tuple(artifacts), frozenset({session_id} if named else ()), client, scope)


def _slice(lines: Sequence[str], total: int | None, offset: int, max_chars: int, what: str, more: bool = False) -> str:
    """Lines ``offset``.. of a document (``lines``: those asked for; ``total``: its line count,
    or ``None`` when not counted, then ``more``: lines follow), at most ``max_chars`` characters."""
    body = "\n".join(lines)
    room = max(0, max_chars - len(what) - 120)  # the head line's own length, at most
    if len(body) > room:
        body = body[:room]
        shown = body.count("\n") + 1
        note = f"(cut at {room} characters; continue with offset={offset + shown - 1})"
    else:
        shown = len(lines)
        follows = more if total is None else offset + shown < total
        note = f"continue with offset={offset + shown}" if follows else "end of content"
    of = f" of {total}" if total is not None else ""
    head = f"[context-proxy] {what}, lines {offset}-{offset + max(shown, 1) - 1}{of} ({note}):"
    return (head + "\n" + body)[:max_chars]


UNKNOWN = ("[context-proxy] Unknown reference; pass an artifact id (art_…) or the archive URL named in this "
           "conversation.")


class _Loader:
    """Loads what a read may serve (``Visible``), for the current session only (module docstring)."""

    def __init__(self, store: Store, tenant: str, session: SessionRecord, visible: Visible) -> None:
        self.store, self.tenant, self.session, self.visible = store, tenant, session, visible

    async def artifact(self, art_id: str) -> ArtifactRecord | None:
        if art_id not in self.visible.artifacts:
            return None
        record = await self.store.get_artifact(art_id, self.tenant)
        if record is None:
            return None
        v = self.visible
        if v.scope == "tenant" or record.session_pk == self.session.pk or v.holds(record.content):
            return record
        return None

    def _archive_stream(self) -> AsyncGenerator[str, None]:
        store, session = self.store, self.session

        async def lines() -> AsyncGenerator[str, None]:
            leaf = await store.branch_leaf(session.pk, None)
            stream = stream_archive_lines(store, session.session_id, session.pk, leaf.chain_hash if leaf else None)
            async with contextlib.aclosing(stream):
                async for line in stream:
                    yield line
        return lines()

    async def archive_lines(self, offset: int, limit: int) -> tuple[list[str], bool]:
        """``(lines offset..offset+limit-1 of the session's archive, more lines follow)``: the
        rendering ``GET /sessions/{id}/archive`` serves, read in pages from the store and no
        further than the line after the last asked for."""
        kept: list[str] = []
        n = 0
        stream = self._archive_stream()
        try:
            async for line in stream:
                if n >= offset + limit:
                    return kept, True
                if n >= offset:
                    kept.append(line)
                n += 1
        finally:
            await stream.aclose()
        return kept, False

    async def search_archive(self, searcher: Searcher, source: int) -> None:
        """Feed the archive's lines to ``searcher`` (``feed_lines``)."""
        await feed_lines(searcher, source, self.archive_ref, self._archive_stream())

    def archive_named(self) -> bool:
        return self.session.session_id in self.visible.archives

    def is_archive(self, ref: str) -> bool:
        """Is ``ref`` this session's archive URL (encoded or raw, possibly with ``?…`` after it)?"""
        return any(ref == url or ref.startswith(url + "?") for url in archive_urls(self.session.session_id))

    @property
    def archive_ref(self) -> str:
        return archive_url(self.session.session_id)


async def serve_read(
    store: Store,
    tenant: str,
    session: SessionRecord,
    arguments: str,
    visible: Visible,
    max_chars: int,
    deadline: float | None = None,
) -> str:
    """The tool result for one call (at most ``max_chars`` characters): search matches, the
    requested lines, or a short explanation. References outside ``visible`` or the session read
    nothing (the same answer as a missing id, so ids cannot be probed). ``deadline``: monotonic
    time a search stops at (default ``SEARCH_BUDGET_S`` from now; a round shares one)."""
    request = parse_arguments(arguments)
    if isinstance(request, str):
        return request
    loader = _Loader(store, tenant, session, visible)
    ref = request.reference
    deadline = time.monotonic() + SEARCH_BUDGET_S if deadline is None else deadline
    if ref is None:
        assert request.query is not None
        return await _search_all(loader, request, max_chars, deadline)
    art = ARTIFACT_RE.search(ref)
    if art is not None:
        record = await loader.artifact(art.group(0))
        if record is None:
            return f"[context-proxy] Nothing stored under {art.group(0)} for this conversation."
        lines = split_lines(record.content)
        if request.query is not None:
            searcher = _searcher(request, deadline)
            await asyncio.to_thread(searcher.feed, 0, record.id, lines)
            return searcher.render(request.offset, request.limit, max_chars)
        part = lines[request.offset : request.offset + request.limit]
        return _slice(part, len(lines), request.offset, max_chars, f"artifact {record.id}")
    if loader.is_archive(ref) and loader.archive_named():
        if request.query is not None:
            searcher = _searcher(request, deadline)
            await loader.search_archive(searcher, 0)
            return searcher.render(request.offset, request.limit, max_chars)
        part, more = await loader.archive_lines(request.offset, request.limit)
        return _slice(part, None, request.offset, max_chars, f"archive {loader.archive_ref}", more)
    return UNKNOWN


def _searcher(request: ReadRequest, deadline: float) -> Searcher:
    assert request.query is not None
    return Searcher(request.query, min(request.offset, MAX_SEARCH_OFFSET) + request.limit, deadline)


async def _search_all(loader: _Loader, request: ReadRequest, max_chars: int, deadline: float) -> str:
    """A query over everything the request names: the archive (oldest), then the artifacts in
    the order they are named (the last named ranks as the most recent), one item in memory at a
    time besides the best matches kept."""
    searcher = _searcher(request, deadline)
    source = 0
    if loader.archive_named():
        await loader.search_archive(searcher, source)
        source += 1
    for art_id in loader.visible.artifacts[-MAX_SEARCH_ITEMS:]:
        if searcher.stopped:
            break
        record = await loader.artifact(art_id)
        if record is not None:
            await asyncio.to_thread(_feed_text, searcher, source, record.id, record.content)
            source += 1
            del record
    if not source:
        return "[context-proxy] Nothing stored for this conversation to search."
    return searcher.render(request.offset, request.limit, max_chars)


def _feed_text(searcher: Searcher, source: int, reference: str, content: str) -> None:
    searcher.feed(source, reference, split_lines(content))
