"""``GET /sessions/{id}/artifacts`` reads no artifact's content on SQLite (issue 20: a 60 MB session
lists fast): the in-process tier's SQLite database (PostgreSQL keeps large values out of line, in
TOAST, so its rows hold the sizes without the content)."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from tests.support.inprocess import FakeProvider, InProcessProxy
from tests.test_read_artifacts import SETTINGS, offloading_session


@contextmanager
def statements() -> Iterator[list[tuple[str, Any]]]:
    seen: list[tuple[str, Any]] = []

    def note(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        seen.append((statement, parameters))

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", note)


async def test_the_list_reads_no_content_on_sqlite(inprocess_factory: Callable[..., Awaitable[InProcessProxy]],
                                                   fake_provider: FakeProvider, inprocess_database_url: str) -> None:
    """SQLite keeps the sizes after the content, in its overflow pages: the list's query is answered
    from the covering index ``ix_artifacts_session_list`` alone (both pages: first and after)."""
    proxy = await inprocess_factory(**SETTINGS)
    await offloading_session(proxy, fake_provider)
    with statements() as seen:
        first = (await proxy.http.get("/sessions/big/artifacts", params={"limit": 1})).json()
        await proxy.http.get("/sessions/big/artifacts", params={"limit": 1, "after": first["last_id"]})
    lists = [(s, p) for s, p in seen if "FROM artifacts" in s and "ORDER BY" in s]
    assert len(lists) == 2
    with sqlite3.connect(inprocess_database_url.removeprefix("sqlite:///")) as conn:
        for statement, parameters in lists:
            plan = " ".join(str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + statement, parameters))
            assert "COVERING INDEX ix_artifacts_session_list" in plan, plan
