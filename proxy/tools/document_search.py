"""The read tool's search over one document, for the read API and the web viewer: a session's
archive (one branch) or one artifact, matches with their line numbers as the REST routes number
them (``GET /sessions/{id}/archive?offset=``, ``GET /artifacts/{id}?offset=``).

The search is ``proxy.tools.search.Searcher``, the one the read tool runs: words (a line matches
when it holds one; more words rank first) or an RE2 pattern, bounded in time
(``SEARCH_BUDGET_S``) and memory (the best ``offset + limit`` matches kept). The archive is read
from the store in pages and fed in batches (``feed_lines``, the read tool's too), so memory is
one batch whatever the session's size. A process runs ``Settings.read_api_max_concurrent_searches``
at once (``ProxyState.searches``); more wait their turn, so searches never hold more of the
default thread pool (which forwarding uses) than that.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.tools.archive import stream_archive_lines
from proxy.tools.search import Hit, Query, Searcher, compile_query

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Awaitable, Callable

    from proxy.admission import SearchSlots
    from storage.records import ArtifactRecord, SessionRecord
    from storage.store import Store

SEARCH_BATCH_LINES = 2000
"""Archive lines searched per batch (in a worker thread), so memory is about one batch."""


async def feed_lines(searcher: Searcher, source: int, reference: str, lines: AsyncGenerator[str, None]) -> None:
    """Feed ``lines`` (a document's, numbered from 0) to ``searcher`` as source ``source`` named
    ``reference``, in batches of ``SEARCH_BATCH_LINES`` each searched in a worker thread, holding
    one batch at a time; stops early when the searcher does (its time budget). Closes ``lines``."""
    batch: list[str] = []
    first = 0
    try:
        async for line in lines:
            batch.append(line)
            if len(batch) >= SEARCH_BATCH_LINES:
                if not await asyncio.to_thread(searcher.feed, source, reference, batch, first):
                    return
                first += len(batch)
                batch = []
    finally:
        await lines.aclose()
    if batch or not first:
        await asyncio.to_thread(searcher.feed, source, reference, batch, first)


class QueryRefused(ValueError):
    """The query cannot run: empty, too long, or a pattern RE2 refuses; ``str()`` says why."""


@dataclass(frozen=True, slots=True)
class Found:
    """A page of matches, best first: ``hits[i].line`` is a 0-based line number; ``total``:
    matching lines seen; ``stopped``: the time budget ran out before the end of the document."""

    hits: list[Hit]
    total: int
    stopped: bool


def _compiled(query: str, regex: bool) -> Query:
    compiled = compile_query(query, regex)
    if isinstance(compiled, str):
        raise QueryRefused(compiled.removeprefix("[context-proxy] "))
    return compiled


def _page(searcher: Searcher, offset: int, limit: int) -> Found:
    return Found(searcher.best()[offset : offset + limit], searcher.total, searcher.stopped)


async def search_archive(store: Store, session: SessionRecord, leaf: str | None, query: str, *,
                         slots: SearchSlots, regex: bool = False, offset: int = 0, limit: int = 20) -> Found:
    """Matches ``offset``..``offset+limit-1`` of ``query`` in the archive of ``session``'s branch
    ending at chain hash ``leaf`` (``None``: the newest branch). It runs holding one of ``slots``
    (``ProxyState.searches``: waits for one). Raises ``QueryRefused``."""
    compiled = _compiled(query, regex)
    async with slots.held():  # the time budget starts once it runs
        searcher = Searcher(compiled, offset + limit)
        stream = stream_archive_lines(store, session.session_id, session.pk, leaf)
        await feed_lines(searcher, 0, f"/sessions/{session.session_id}/archive", stream)
    return _page(searcher, offset, limit)


async def search_artifact(load: Callable[[], Awaitable[ArtifactRecord]], query: str, *, slots: SearchSlots,
                          regex: bool = False, offset: int = 0, limit: int = 20) -> Found:
    """Matches of ``query`` in the lines (``str.splitlines``, as ``GET /artifacts/{id}`` numbers
    them) of the artifact ``load`` reads, run holding one of ``slots`` as ``search_archive``: the
    artifact is read once the slot is held, so queued searches hold no content. Raises
    ``QueryRefused``, and what ``load`` raises."""
    compiled = _compiled(query, regex)
    async with slots.held():
        artifact = await load()
        searcher = Searcher(compiled, offset + limit)
        await asyncio.to_thread(searcher.feed, 0, artifact.id, artifact.content.splitlines())
    return _page(searcher, offset, limit)
