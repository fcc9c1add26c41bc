"""Alembic migrations applied in code (storage/migrate.py) on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from storage.engine import create_engine
from storage.errors import StorageUnavailable
from storage.migrate import MIGRATIONS_DIR, upgrade
from storage.tables import metadata

TABLES = {"sessions", "messages", "events", "artifacts", "requests", "learned_limits"}
HEAD = "0007"
"""The newest revision."""


async def _inspect(url: str) -> tuple[set[str], str | None, list[Any]]:
    engine = create_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:

            def look(sync: sa.Connection) -> tuple[set[str], str | None, list[Any]]:
                tables = set(sa.inspect(sync).get_table_names())
                context = MigrationContext.configure(sync, opts={"compare_type": True})
                revision = context.get_current_revision()
                return tables, revision, compare_metadata(context, metadata) if revision else []

            return await conn.run_sync(look)
    finally:
        await engine.dispose()


async def test_upgrade_creates_schema_and_is_idempotent(empty_database_url: str) -> None:
    assert await _inspect(empty_database_url) == (set(), None, [])
    await upgrade(empty_database_url)
    tables, revision, diff = await _inspect(empty_database_url)
    assert tables >= TABLES and revision == HEAD
    assert diff == []  # storage/tables.py describes exactly what the migrations create
    await upgrade(empty_database_url)
    assert await _inspect(empty_database_url) == (tables, HEAD, [])


async def test_concurrent_upgrades_both_succeed(empty_database_url: str) -> None:
    await asyncio.gather(*(upgrade(empty_database_url) for _ in range(3)))
    tables, revision, _ = await _inspect(empty_database_url)
    assert tables >= TABLES and revision == HEAD


async def test_upgrade_of_unreachable_database_raises_unavailable() -> None:
    with pytest.raises(StorageUnavailable):
        await upgrade("postgresql://nobody@127.0.0.1:1/none")


def test_migration_scripts_ship_without_alembic_ini() -> None:
    assert (MIGRATIONS_DIR / "env.py").is_file()
    assert (MIGRATIONS_DIR / "versions" / "0001_initial.py").is_file()


async def test_0004_widens_the_token_columns_of_an_existing_database(empty_database_url: str) -> None:
    """A database at 0003 keeps its rows and then stores token counts beyond 32 bits (a client's
    ``max_tokens`` of 3e9 overflowed PostgreSQL's ``INTEGER``: issue 16, item 11)."""
    from datetime import UTC, datetime

    from storage.records import EventRecord, RequestRecord, SessionRecord
    from storage.store import Store

    now = datetime(2026, 1, 1, tzinfo=UTC)
    await upgrade(empty_database_url, "0003")
    engine = create_engine(empty_database_url, pool_size=1)
    try:  # (the rows as revision 0003 has them: the current Store writes 0005's and 0007's columns)
        async with engine.begin() as conn:
            pk = (await conn.execute(sa.text(
                "INSERT INTO sessions (session_id, tenant, created_at, updated_at) VALUES ('old', 't', :n, :n) RETURNING pk"),
                {"n": now})).scalar_one()
            await conn.execute(sa.text(
                "INSERT INTO requests (id, session_pk, model, status, latency_ms, stream, added_messages, tokens_client,"
                " tokens_forwarded, defenses, event_ids, created_at)"
                " VALUES ('r1', :p, 'm', 200, 1.0, false, 0, :t, :t, '[]', '[]', :n)"), {"p": pk, "t": 2**31 - 1, "n": now})
    finally:
        await engine.dispose()
    session = SessionRecord(pk=pk, session_id="old", tenant="t", created_at=now, updated_at=now)

    def record(i: int, tokens: int) -> RequestRecord:
        return RequestRecord(id=f"r{i}", session_pk=session.pk, model="m", status=200, latency_ms=1.0, stream=False,
                             usage=None, added_messages=0, first_added_seq=None, tokens_client=tokens,
                             tokens_forwarded=tokens, created_at=now)
    await upgrade(empty_database_url)
    assert (await _inspect(empty_database_url))[1:] == (HEAD, [])
    store = await Store.open(empty_database_url, pool_size=2)
    try:
        await store.add_request(record(2, 3_000_000_000))
        await store.add_event(EventRecord(id="e", session_pk=session.pk, kind="summary", anchor_hash="a" * 64,
                                          payload={}, tokens_before=3_000_000_000, tokens_after=2**33, created_at=now))
        assert await store.set_learned_window("t", "u", "m", 5_000_000_000, "overflow", now, None)
        rows, _ = await store.list_requests(session.pk, 10, None)
        assert [r.tokens_client for r in rows] == [2**31 - 1, 3_000_000_000]
        assert [(e.tokens_before, e.tokens_after) for e in await store.list_events(session.pk)] == [(3_000_000_000, 2**33)]
        limit = await store.get_learned_limit("t", "u", "m")
        assert limit is not None and limit.context_window_tokens == 5_000_000_000
        assert (await store.session_summary(session)).tokens_client_total == 2**31 - 1 + 3_000_000_000
    finally:
        await store.close()


async def test_0004_escapes_the_older_text_values_that_hold_the_escape_mark(empty_database_url: str) -> None:
    """Values stored before text was escaped that hold U+0010 (the mark of an escaped value) read
    back and are found as written after 0004: a session id, a model, an artifact's id and its
    content (on SQLite compressed, as the proxy wrote large ones), on both databases."""
    import zlib
    from datetime import UTC, datetime

    from storage.store import Store

    now = datetime(2026, 1, 1, tzinfo=UTC)
    content = ("\x10 old content " * 100) + "\x10"
    await upgrade(empty_database_url, "0003")
    engine = create_engine(empty_database_url, pool_size=1)
    try:
        async with engine.begin() as conn:
            pk = (await conn.execute(sa.text(
                "INSERT INTO sessions (session_id, tenant, created_at, updated_at) VALUES (:s, :t, :n, :n) RETURNING pk"),
                {"s": "a\x10b", "t": "t", "n": now})).scalar_one()
            await conn.execute(sa.text(
                "INSERT INTO requests (id, session_pk, model, status, latency_ms, stream, added_messages, defenses,"
                " event_ids, created_at) VALUES (:i, :p, :m, 200, 1.0, false, 0, '[]', '[]', :n)"),
                {"i": "r1", "p": pk, "m": "\x10a\x10b", "n": now})
            stored: str | bytes = content
            if conn.dialect.name == "sqlite":
                stored = zlib.compress(content.encode(), 1)
            await conn.execute(sa.text(
                "INSERT INTO artifacts (tenant, id, session_pk, media_type, content, size_bytes, line_count, created_at)"
                " VALUES ('t', :i, :p, 'text/plain', :c, 1, 1, :n)"), {"i": "\x10art", "p": pk, "c": stored, "n": now})
    finally:
        await engine.dispose()
    await upgrade(empty_database_url)
    store = await Store.open(empty_database_url, pool_size=2)
    try:
        session = await store.find_session("a\x10b", "t")
        assert session is not None and session.pk == pk
        assert (await store.get_or_create_session("t", "a\x10b", now)).pk == pk  # no second session
        rows, _ = await store.list_requests(pk, 10, None)
        assert [r.model for r in rows] == ["\x10a\x10b"]
        artifact = await store.get_artifact("\x10art", "t")
        assert artifact is not None and artifact.content == content
    finally:
        await store.close()


async def test_0005_records_the_api_of_a_session_and_old_ones_are_chat(empty_database_url: str) -> None:
    """A session written before 0005 (and one an older replica writes during a rolling upgrade, which
    names no ``api``) reads as a chat session; a new one keeps the API it was created with."""
    from datetime import UTC, datetime

    from storage.store import Store

    now = datetime(2026, 1, 1, tzinfo=UTC)
    await upgrade(empty_database_url, "0004")
    engine = create_engine(empty_database_url, pool_size=1)
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.text("INSERT INTO sessions (session_id, tenant, created_at, updated_at)"
                                       " VALUES ('before', 't', :n, :n)"), {"n": now})
        await upgrade(empty_database_url)
        async with engine.begin() as conn:  # an older replica's insert, after the upgrade
            await conn.execute(sa.text("INSERT INTO sessions (session_id, tenant, created_at, updated_at)"
                                       " VALUES ('older', 't', :n, :n)"), {"n": now})
    finally:
        await engine.dispose()
    assert (await _inspect(empty_database_url))[1:] == (HEAD, [])
    store = await Store.open(empty_database_url, pool_size=2)
    try:
        for session_id in ("before", "older"):
            found = await store.find_session(session_id, "t")
            assert found is not None and found.api == "chat"
        created = await store.get_or_create_session("t", "new", now, "messages")
        assert created.api == "messages"
        assert (await store.get_or_create_session("t", "new", now)).api == "messages"  # kept, not reset
        assert (await store.get_or_create_session("t", "before", now, "messages")).api == "chat"
    finally:
        await store.close()


async def test_0006_records_the_message_of_an_artifact_and_old_ones_have_none(empty_database_url: str) -> None:
    """An artifact written before 0006 reads with no message (``None``: not recorded); a new one
    keeps its message's chain hash; a session's list is served by the new index; the downgrade
    drops the column and the index, and the rows read back as 0005 wrote them."""
    from datetime import UTC, datetime

    from storage.records import ArtifactRecord
    from storage.store import Store

    now = datetime(2026, 1, 1, tzinfo=UTC)
    insert = ("INSERT INTO artifacts (tenant, id, session_pk, media_type, content, size_bytes, line_count, created_at)"
              " VALUES ('t', :id, :pk, 'text/plain', 'old content', 11, 1, :n)")
    pk = await _rows_across_an_upgrade(empty_database_url, "0005", insert, ("art_before", "art_older"), now)
    store = await Store.open(empty_database_url, pool_size=2)
    try:
        await store.put_artifacts([ArtifactRecord("art_new", "t", pk, "text/plain", "new", 3, 1, now, "ab" * 32)])
        listed, more = await store.list_session_artifacts(pk, 10, None)
        assert sorted((a.id, a.message_hash) for a in listed) == [("art_before", None), ("art_new", "ab" * 32),
                                                                  ("art_older", None)] and not more
        assert (await store.get_artifact("art_new", "t")).message_hash == "ab" * 32  # type: ignore[union-attr]
    finally:
        await store.close()
    columns, indexes, rows = await _after_downgrade(empty_database_url, "0005", "artifacts",
                                                    "SELECT id, content FROM artifacts ORDER BY id")
    assert "message_hash" not in columns and "ix_artifacts_session_list" not in indexes
    assert rows == [("art_before", "old content"), ("art_new", "new"), ("art_older", "old content")]


async def test_0007_records_overflow_retries_and_old_requests_have_none(empty_database_url: str) -> None:
    """A request written before 0007 (and one an older replica writes during a rolling upgrade, which
    names no ``overflow_retries``) reads 0; a new one keeps its count; the downgrade drops the
    column and the rows read back as 0006 wrote them."""
    from datetime import UTC, datetime

    from storage.records import RequestRecord
    from storage.store import Store

    now = datetime(2026, 1, 1, tzinfo=UTC)
    insert = ("INSERT INTO requests (id, session_pk, status, latency_ms, stream, added_messages, defenses, event_ids,"
              " created_at) VALUES (:id, :pk, 200, 1.0, false, 1, '[]', '[]', :n)")
    pk = await _rows_across_an_upgrade(empty_database_url, "0006", insert, ("req_before", "req_older"), now)
    store = await Store.open(empty_database_url, pool_size=2)
    try:
        await store.add_request(RequestRecord("req_new", pk, "m", 200, 1.0, False, None, 1, 0, 10, 5,
                                              created_at=now, overflow_retries=2))
        listed, _ = await store.list_requests(pk, 10, None)
        assert sorted((r.id, r.overflow_retries) for r in listed) == [("req_before", 0), ("req_new", 2), ("req_older", 0)]
    finally:
        await store.close()
    columns, _, rows = await _after_downgrade(empty_database_url, "0006", "requests",
                                              "SELECT id, status FROM requests ORDER BY id")
    assert "overflow_retries" not in columns
    assert rows == [("req_before", 200), ("req_new", 200), ("req_older", 200)]


async def _rows_across_an_upgrade(url: str, before: str, insert: str, ids: tuple[str, str], now: object) -> int:
    """At revision ``before``: a session, and ``insert`` (SQL with ``:id``, ``:pk``, ``:n``) run as
    ``ids[0]``; then the upgrade to head, and ``insert`` again as ``ids[1]`` (an older replica's
    insert during a rolling upgrade). Returns the session's pk; checks the database is at head."""
    await upgrade(url, before)
    engine = create_engine(url, pool_size=1)
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.text("INSERT INTO sessions (session_id, tenant, created_at, updated_at)"
                                       " VALUES ('s', 't', :n, :n)"), {"n": now})
            pk: int = (await conn.execute(sa.text("SELECT pk FROM sessions"))).scalar_one()
            await conn.execute(sa.text(insert), {"id": ids[0], "pk": pk, "n": now})
        await upgrade(url)
        async with engine.begin() as conn:  # an older replica's insert, after the upgrade
            await conn.execute(sa.text(insert), {"id": ids[1], "pk": pk, "n": now})
    finally:
        await engine.dispose()
    assert (await _inspect(url))[1:] == (HEAD, [])
    return pk


async def _after_downgrade(url: str, revision: str, table: str, select: str) -> tuple[set[str], set[str], list[tuple]]:
    """Downgrade to ``revision``; then ``table``'s column names, index names, and ``select``'s rows."""
    from tests.storage.test_layout import downgrade

    await downgrade(url, revision)
    engine = create_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:
            columns = await conn.run_sync(lambda sync: {c["name"] for c in sa.inspect(sync).get_columns(table)})
            indexes = await conn.run_sync(lambda sync: {i["name"] for i in sa.inspect(sync).get_indexes(table)})
            rows = [tuple(r) for r in (await conn.execute(sa.text(select))).all()]
    finally:
        await engine.dispose()
    return columns, indexes, rows


async def test_0006_upgrades_a_database_holding_a_media_type_past_rfc_6838s_bound(empty_database_url: str) -> None:
    """An artifact stored before the proxy bounded media types, with a 3,000-character one (a client
    names it), does not stop the upgrade (PostgreSQL refuses an index row past 2,704 bytes, and 0006
    indexes ``media_type``): it reads back as ``application/octet-stream``, its content unchanged."""
    from datetime import UTC, datetime

    from storage.store import Store

    now = datetime(2026, 1, 1, tzinfo=UTC)
    long_type = "image/" + "".join(chr(0x61 + (i * 7919) % 26) for i in range(3000))
    await upgrade(empty_database_url, "0005")
    engine = create_engine(empty_database_url, pool_size=1)
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.text("INSERT INTO sessions (session_id, tenant, created_at, updated_at)"
                                       " VALUES ('s', 't', :n, :n)"), {"n": now})
            pk = (await conn.execute(sa.text("SELECT pk FROM sessions"))).scalar_one()
            await conn.execute(sa.text(
                "INSERT INTO artifacts (tenant, id, session_pk, media_type, content, size_bytes, line_count, created_at)"
                " VALUES ('t', 'art_long', :pk, :mt, 'x', 1, 1, :n)"), {"pk": pk, "mt": long_type, "n": now})
    finally:
        await engine.dispose()
    await upgrade(empty_database_url)
    assert (await _inspect(empty_database_url))[1:] == (HEAD, [])
    store = await Store.open(empty_database_url, pool_size=2)
    try:
        artifact = await store.get_artifact("art_long", "t")
        assert artifact is not None and artifact.media_type == "application/octet-stream" and artifact.content == "x"
    finally:
        await store.close()
