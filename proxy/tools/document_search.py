"""The read tool's search over one document, for the read API and the web viewer: a session's
archive (one branch) or one artifact, matches with their line numbers as the REST routes number
them (``GET /sessions/{id}/archive?offset=``, ``GET /artifacts/{id}?offset=``).

The search is ``proxy.tools.search.Searcher``, the one the read tool runs: words (a line matches
when it holds one; more words rank first) or an RE2 pattern, bounded in time
(``SEARCH_BUDGET_S``) and memory (the best ``offset + limit`` matches kept). The archive is read
from the store in pages and fed in batches (``proxy.tools.read_tool.SEARCH_BATCH_LINES``), so
memory is one batch whatever the session's size.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.tools.archive import stream_archive_lines
from proxy.tools.read_tool import SEARCH_BATCH_LINES
from proxy.tools.search import Hit, Searcher, compile_query

if TYPE_CHECKING:
    from storage.records import ArtifactRecord, SessionRecord
    from storage.store import Store


class QueryRefused(ValueError):
    """The query cannot run: empty, too long, or a pattern RE2 refuses; ``str()`` says why."""


@dataclass(frozen=True, slots=True)
class Found:
    """A page of matches, best first: ``hits[i].line`` is a 0-based line number; ``total``:
    matching lines seen; ``stopped``: the time budget ran out before the end of the document."""

    hits: list[Hit]
    total: int
    stopped: bool


def _searcher(query: str, regex: bool, offset: int, limit: int) -> Searcher:
    compiled = compile_query(query, regex)
    if isinstance(compiled, str):
        raise QueryRefused(compiled.removeprefix("[context-proxy] "))
    return Searcher(compiled, offset + limit)


def _page(searcher: Searcher, offset: int, limit: int) -> Found:
    return Found(searcher.best()[offset : offset + limit], searcher.total, searcher.stopped)


async def search_archive(store: Store, session: SessionRecord, leaf: str | None, query: str, *,
                         regex: bool = False, offset: int = 0, limit: int = 20) -> Found:
    """Matches ``offset``..``offset+limit-1`` of ``query`` in the archive of ``session``'s branch
    ending at chain hash ``leaf`` (``None``: the newest branch). Raises ``QueryRefused``."""
    searcher = _searcher(query, regex, offset, limit)
    reference = f"/sessions/{session.session_id}/archive"
    stream = stream_archive_lines(store, session.session_id, session.pk, leaf)
    batch: list[str] = []
    first = 0
    async with contextlib.aclosing(stream):
        async for line in stream:
            batch.append(line)
            if len(batch) >= SEARCH_BATCH_LINES:
                if not await asyncio.to_thread(searcher.feed, 0, reference, batch, first):
                    return _page(searcher, offset, limit)
                first += len(batch)
                batch = []
    await asyncio.to_thread(searcher.feed, 0, reference, batch, first)
    return _page(searcher, offset, limit)


async def search_artifact(artifact: ArtifactRecord, query: str, *, regex: bool = False, offset: int = 0,
                          limit: int = 20) -> Found:
    """Matches of ``query`` in ``artifact``'s lines (``str.splitlines``, as ``GET /artifacts/{id}``
    numbers them). Raises ``QueryRefused``."""
    searcher = _searcher(query, regex, offset, limit)
    await asyncio.to_thread(searcher.feed, 0, artifact.id, artifact.content.splitlines())
    return _page(searcher, offset, limit)
