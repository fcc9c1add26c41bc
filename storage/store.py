"""``Store``: the async storage API of the proxy (log, events, artifacts, requests, limits, reads).

Storage inserts what it is given (ids and times come from the caller) and returns frozen records
from ``storage.records``. Every method runs one short transaction; there is no global lock.
Concurrent writers are safe by constraint, not by locking: inserts use ``ON CONFLICT DO
NOTHING`` on the natural keys, so racing appends or compactions converge on one row.
Every SQLAlchemy/driver error is raised as ``StorageError`` or ``StorageUnavailable``.

On a SQLite file, the hot-path methods run through ``storage.sqlite.file.SqliteFile`` (small
transactions inline on the event loop's thread, others on store threads), and the end-of-request
write is deferred and batched there (``storage.sqlite.end_write``); the read API's queries and
PostgreSQL use the async engine. See ``Store._transact`` and ``Store.append_and_record``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from storage.artifacts import INSERT_BATCH_ROWS, ArtifactQueries
from storage.engine import create_engine
from storage.errors import (
    FOREIGN_ERRORS,
    MissingRow,
    StorageError,
    StorageUnavailable,
    translate_error,
)
from storage.learned_limits import LearnedLimitQueries
from storage.locks import CompactionLocks
from storage.read_api import ReadQueries
from storage.records import (
    EventRecord,
    MessageRecord,
    NewMessage,
    RequestRecord,
    SessionRecord,
)
from storage.refused import RefusedRequestQueries, tracked
from storage.rows import RecordItem, added_counts, message_rows, record_item, request_values
from storage.session_order import SessionOrder
from storage.sqlite.end_write import SqliteEndWrite
from storage.sqlite.file import SqliteFile, small_rows
from storage.tables import (
    events,
    messages,
    requests,
    sessions,
)
from storage.values import TOKENS_MAX, clamp_count

log = logging.getLogger("context_proxy.storage")

PREFIX_TAIL = 64
"""``stored_prefix_len`` checks the last this-many hashes in one query before binary searching."""


def _later(column: sa.ColumnElement[Any], now: datetime | sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """``max(column, now)``, portable: a timestamp never moves back when clocks interleave."""
    return sa.case((column < now, now), else_=column)


T = TypeVar("T")

_PING_ERRORS: tuple[type[BaseException], ...] = (*FOREIGN_ERRORS, TimeoutError)

CLOSE_WAIT_S = 5.0
"""How long ``close`` waits for end-of-request writes still running in tasks (a database that
does not answer must not hold a shutdown up for ever)."""


class Store(LearnedLimitQueries, RefusedRequestQueries, ReadQueries, CompactionLocks, ArtifactQueries):
    """Async storage over one engine (SQLite or PostgreSQL). Create with ``await Store.open(url)``."""

    def __init__(self, engine: AsyncEngine, sqlite_file: SqliteFile | None = None, *,
                 lock_connections: int = 10) -> None:
        self._engine = engine
        self._lock_slots = asyncio.Semaphore(lock_connections)
        """Compaction locks held at once (each holds a pooled connection for a summary's seconds:
        unbounded, many sessions compacting together would take the whole pool from requests)."""
        self._dialect = engine.dialect.name
        self._sqlite = sqlite_file
        # hot-path statements built once: executed with parameters, they compile once per engine
        # (a statement built per call with its values inside is compiled again each time)
        self._bump_session = (
            sa.update(sessions)
            .where(sessions.c.pk == sa.bindparam("b_pk"))
            .values(updated_at=_later(sessions.c.updated_at, sa.bindparam("b_now", type_=sessions.c.updated_at.type)))
        )
        self._insert_message = (
            self._insert(messages)
            .on_conflict_do_nothing(index_elements=[messages.c.session_pk, messages.c.chain_hash])
            .returning(messages.c.id)
        )
        self._insert_request = sa.insert(requests)
        self._end_write: SqliteEndWrite | None = None
        """On a SQLite file: the end-of-request write, deferred and run on the driver."""
        if sqlite_file is not None:
            insert_message = self._insert(messages).on_conflict_do_nothing(
                index_elements=[messages.c.session_pk, messages.c.chain_hash])
            self._end_write = SqliteEndWrite(sqlite_file, self._bump_session, insert_message, self._insert_request)
        self._writes: set[asyncio.Task[int]] = set()
        """End-of-request writes running in tasks (``append_and_record``), awaited by ``close``."""
        self._order = SessionOrder() if sqlite_file is None else None
        """A session's operations in order (``SessionOrder``: PostgreSQL, SQLite in memory; a SQLite
        file orders its own)."""

    @classmethod
    async def open(cls, database_url: str, *, pool_size: int = 20) -> Store:
        """Open a store on ``database_url`` (as users write it); does not migrate
        (``storage.migrate.upgrade`` does). Connections are made lazily."""
        return cls(create_engine(database_url, pool_size=pool_size), SqliteFile.open(database_url),
                   lock_connections=max(1, pool_size // 2))

    async def close(self) -> None:
        """Finish queued writes (those running in tasks: for at most ``CLOSE_WAIT_S``; the
        proxy's log writer has drained them before), then close every pooled connection."""
        if self._writes:
            await asyncio.wait(list(self._writes), timeout=CLOSE_WAIT_S)
        if self._sqlite is not None:
            await self._sqlite.close()
        await self._engine.dispose()

    async def reset_pool(self) -> None:
        """Drop every pooled connection (after the server restarted they are all dead); the
        engine stays usable and opens fresh ones."""
        if self._sqlite is not None:
            self._sqlite.dispose()
        await self._engine.dispose()

    async def _transact(self, operation: str, fn: Callable[[sa.Connection], T], *, write: bool = True,
                        small: bool = True) -> T:
        """Run ``fn(connection)`` in one transaction (committed if ``write``) and return its result.

        SQLite file: through ``SqliteFile.run`` (inline on the event loop's thread when ``small``
        and unlocked, else on a store thread). Else (PostgreSQL, SQLite in memory): the async
        engine through ``run_sync``. Foreign errors become ``StorageError``s either way.
        """
        if self._sqlite is not None:
            return await self._sqlite.run(operation, fn, write=write, small=small)
        if write:
            async with self._begin(operation) as conn:
                return await conn.run_sync(fn)
        async with self._read(operation) as conn:
            return await conn.run_sync(fn)

    async def _in_order(self, session_pk: int, op: Callable[[], Awaitable[T]]) -> T:
        """``op()`` once this process's operations of the session started before it have ended
        (``SessionOrder``; a SQLite file: at once)."""
        order = self._order
        if order is None:
            return await op()
        before, mine = order.enter(session_pk)
        try:
            await order.wait(before)
            return await op()
        finally:
            order.leave(before, mine)

    def _flush(self) -> None:
        """Commit deferred writes before anything else reads or writes (order, read-your-writes)."""
        if self._sqlite is not None:
            self._sqlite.batch.flush()

    async def ping(self, timeout_s: float = 5.0) -> bool:
        """True iff ``SELECT 1`` succeeds within ``timeout_s``; never raises."""
        try:
            async with asyncio.timeout(timeout_s), self._engine.connect() as conn:
                await conn.execute(sa.text("SELECT 1"))
            return True
        except _PING_ERRORS:
            return False

    @asynccontextmanager
    async def _begin(self, operation: str) -> AsyncIterator[AsyncConnection]:
        """One transaction, committed on exit; foreign errors become ``StorageError``s."""
        self._flush()
        try:
            async with self._engine.begin() as conn:
                yield conn
        except FOREIGN_ERRORS as exc:
            raise translate_error(exc, operation) from exc

    @asynccontextmanager
    async def _read(self, operation: str) -> AsyncIterator[AsyncConnection]:
        self._flush()
        try:
            async with self._engine.connect() as conn:
                yield conn
        except FOREIGN_ERRORS as exc:
            raise translate_error(exc, operation) from exc

    def _insert(self, table: sa.Table) -> Any:
        """The dialect's INSERT construct (it has ``on_conflict_do_nothing/do_update``)."""
        return (postgresql.insert if self._dialect == "postgresql" else sqlite.insert)(table)

    # --- sessions and the log -------------------------------------------------------------

    async def get_or_create_session(self, tenant: str, session_id: str, now: datetime,
                                    api: str = "chat") -> SessionRecord:
        """The session ``(tenant, session_id)``, created if missing (speaking ``api``: ``chat`` or
        ``messages``; an existing session keeps its own); ``updated_at`` becomes ``now`` (never
        earlier than it was). Race-safe: concurrent calls return the same row."""
        bump = (
            sa.update(sessions)
            .where(sessions.c.tenant == tenant, sessions.c.session_id == session_id)
            .values(updated_at=_later(sessions.c.updated_at, now))
            .returning(*sessions.c)
        )
        insert = self._insert(sessions).values(tenant=tenant, session_id=session_id, created_at=now, updated_at=now,
                                               api=api)
        upsert = insert.on_conflict_do_update(
            index_elements=[sessions.c.tenant, sessions.c.session_id],
            set_={"updated_at": _later(sessions.c.updated_at, now)},
        ).returning(*sessions.c)
        def run(conn: sa.Connection) -> SessionRecord:
            row = conn.execute(bump).first() or conn.execute(upsert).one()
            return SessionRecord(**row._mapping)

        return await self._transact("get_or_create_session", run)

    async def stored_prefix_len(self, session_pk: int, chain_hashes: list[str]) -> int:
        """How many leading ``chain_hashes`` are stored in the session (0..len).

        Relies on the log being prefix-closed (a message is stored only with or after its
        parent). Sees every write of the session this process started before it
        (``SessionOrder``; a SQLite file flushes its queued writes first). Cost: one point
        lookup when all are stored; else one ``IN`` query over the last ``PREFIX_TAIL``; else a
        binary search of point lookups (about 13 for 5,000).
        """
        n = len(chain_hashes)
        if n == 0:
            return 0
        base = sa.select(messages.c.chain_hash).where(messages.c.session_pk == session_pk)

        def run(conn: sa.Connection) -> int:
            def stored(i: int) -> bool:
                return conn.execute(base.where(messages.c.chain_hash == chain_hashes[i])).first() is not None

            if stored(n - 1):
                return n
            start = max(0, n - 1 - PREFIX_TAIL)
            window = chain_hashes[start : n - 1]
            if window:
                found = set(conn.execute(base.where(messages.c.chain_hash.in_(window))).scalars())
                hits = [i for i, h in enumerate(window) if h in found]
                if hits:
                    return start + hits[-1] + 1
            lo, hi = 0, start  # the answer is in [lo, hi]; chain_hashes[start] is not stored
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if stored(mid - 1):
                    lo = mid
                else:
                    hi = mid - 1
            return lo

        return await self._in_order(session_pk, lambda: self._transact("stored_prefix_len", run, write=False))

    async def append_messages(self, session_pk: int, new_messages: Sequence[NewMessage], now: datetime) -> int:
        """Append ``new_messages`` (parents first) to the session's log; return how many were new.

        One transaction: bump ``sessions.updated_at`` (its row lock orders concurrent appends of
        one session on PostgreSQL), then ``INSERT .. ON CONFLICT (session_pk, chain_hash) DO
        NOTHING`` in batches. Overlapping concurrent appends never duplicate nor fail; those of
        this process commit in the order they were called (``SessionOrder``), so a message sent
        twice is stored as first sent; an earlier operation still running after ``ORDER_WAIT_S``
        (5 s: a lock held elsewhere) is no longer waited for, and the wait is logged.
        """
        return len(await self.append_new_messages(session_pk, new_messages, now))

    async def append_new_messages(self, session_pk: int, new_messages: Sequence[NewMessage],
                                  now: datetime) -> list[int]:
        """``append_messages``, returning the ids of the rows it inserted (not of those already stored)."""
        if not new_messages:
            return []
        rows = message_rows(session_pk, new_messages, now)
        return await self._in_order(session_pk, lambda: self._transact(
            "append_messages", lambda conn: self._append(conn, session_pk, rows, now), small=small_rows(new_messages)))

    def _append(self, conn: sa.Connection, session_pk: int, rows: list[dict[str, Any]], now: datetime) -> list[int]:
        """Bump the session, insert ``rows``; the ids of the new ones (the ``RETURNING`` rows: a
        conflicting row returns none, on every driver, unlike ``rowcount`` of an executemany)."""
        conn.execute(self._bump_session, {"b_pk": session_pk, "b_now": now})
        added: list[int] = []
        for i in range(0, len(rows), INSERT_BATCH_ROWS):
            added.extend(conn.execute(self._insert_message, rows[i : i + INSERT_BATCH_ROWS]).scalars())
        return added

    def append_and_record(
        self, session_pk: int, new_messages: Sequence[NewMessage], record: RequestRecord, now: datetime,
        *, client_rows: int | None = None,
    ) -> asyncio.Future[int]:
        """The end-of-request write: ``append_messages`` and ``add_request`` in one short
        transaction, started now; its future gets how many messages were new. ``client_rows``:
        the first ``client_rows`` of ``new_messages`` are the client's messages, and the record's
        ``(added_messages, first_added_seq)`` are stored as how many of them this write inserted
        (not those found stored) and the seq of the first (``None``: none;
        ``storage.rows.added_counts``); ``None``: the record's own.

        The future fails with the ``StorageError``: ``MissingRow`` (the session is gone, nothing
        stored), ``StorageUnavailable``, or another when the request row was refused (a taken id,
        say): then the messages were stored all the same, alone. Called on the event loop's thread.

        How it runs is the store's business: on a SQLite file a small write (``small_rows``) is
        queued in the file's deferred batch and committed with the others of the next
        ``DEFER_WRITE_S`` (``storage.sqlite.end_write``: no task, no thread hop); anything else
        (PostgreSQL, SQLite in memory, many or large messages) runs in a task of its own, which
        ``close`` waits for, after the session's operations this process started before it
        (``SessionOrder``). Either way it has started, whatever becomes of the caller, and it
        may read its arguments as it runs (on SQLite the rows are converted at the batch's
        commit): the caller changes none of them (nor the messages' dicts) afterwards."""
        if self._end_write is not None and small_rows(new_messages):
            return self._end_write.defer(session_pk, new_messages, record, now, client_rows)
        item = record_item(session_pk, new_messages, record, now, client_rows)
        loop, order = asyncio.get_running_loop(), self._order
        if order is None:
            task = loop.create_task(self._append_and_record(item))
        else:  # in the session's order from now (``SessionOrder``), however the task ends, started or not
            before, mine = order.enter(session_pk)
            task = loop.create_task(self._append_and_record(item, before))
            task.add_done_callback(functools.partial(_left, before, mine))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task

    async def _append_and_record(self, item: RecordItem, before: asyncio.Future[None] | None = None) -> int:
        await SessionOrder.wait(before)
        session_pk, rows, values, now, client_seqs = item

        def run(conn: sa.Connection) -> int:
            added = len(self._append(conn, session_pk, rows, now)) if rows else 0
            counted = values
            if client_seqs is not None:
                counted = {**values}
                counted["added_messages"], counted["first_added_seq"] = added_counts(client_seqs, len(rows), added)
            conn.execute(self._insert_request, counted)
            return added

        try:
            return await self._transact("append_and_record", run, small=False)
        except (StorageUnavailable, MissingRow):
            raise
        except StorageError as exc:
            if not rows:
                raise
            # the record was refused (its values are sanitized: a taken id, say); the client's
            # messages and the reply must not be lost with it: stored alone, then the error raised
            await self._transact("append_messages", lambda conn: self._append(conn, session_pk, rows, now), small=False)
            log.error("the request record was refused (%s); its %d messages were stored without it", exc, len(rows))
            raise

    # --- events, artifacts, requests ---------------------------------------------------

    async def add_event(self, event: EventRecord) -> EventRecord:
        """Store ``event``; if the session already has an event of this kind at this anchor,
        return that one instead (two concurrent compactions at one point yield one event).
        Raises ``StorageError`` if ``event.id`` is taken by a different event."""
        stmt = self._insert(events).values(
            id=event.id,
            session_pk=event.session_pk,
            kind=event.kind,
            anchor_hash=event.anchor_hash,
            payload=event.payload,
            tokens_before=clamp_count(event.tokens_before, TOKENS_MAX),
            tokens_after=clamp_count(event.tokens_after, TOKENS_MAX),
            created_at=event.created_at,
        )
        existing = sa.select(*events.c).where(
            events.c.session_pk == event.session_pk,
            events.c.kind == event.kind,
            events.c.anchor_hash == event.anchor_hash,
        )
        def run(conn: sa.Connection) -> Any:
            new = conn.execute(stmt.on_conflict_do_nothing().returning(events.c.id)).first() is not None
            return new, conn.execute(existing).first()

        new, row = await self._transact("add_event", run)
        if new and (writes := tracked()) is not None:
            writes.event_ids.append(event.id)
        if row is None:
            raise StorageError(f"add_event: id {event.id!r} is already used by another event")
        return EventRecord(**row._mapping)

    async def list_events(self, session_pk: int) -> list[EventRecord]:
        """The session's compaction events in creation order (``created_at``, then id)."""
        query = sa.select(*events.c).where(events.c.session_pk == session_pk).order_by(events.c.created_at, events.c.id)
        return await self._transact(
            "list_events", lambda conn: [EventRecord(**r._mapping) for r in conn.execute(query)], write=False
        )

    @staticmethod
    def _request_row(record: RequestRecord, now: datetime) -> dict[str, Any]:
        return request_values(record, now)

    async def add_request(self, record: RequestRecord) -> None:
        """Store a request record (``created_at`` ``None`` means now)."""
        values = request_values(record, datetime.now(UTC))
        await self._transact("add_request", lambda conn: conn.execute(sa.insert(requests).values(**values)))

    async def list_internal_messages(self, session_pk: int) -> list[MessageRecord]:
        """The session's internal messages (rounds the proxy served itself), oldest first."""
        query = (
            sa.select(*messages.c)
            .where(messages.c.session_pk == session_pk, messages.c.internal.is_(True))
            .order_by(messages.c.id)
        )
        return await self._transact(
            "list_internal_messages", lambda conn: [MessageRecord(**r._mapping) for r in conn.execute(query)],
            write=False
        )


def _left(before: asyncio.Future[None] | None, mine: asyncio.Future[None], _task: asyncio.Task[int]) -> None:
    """``SessionOrder.leave`` once an ordered write's task has ended (a task cancelled before its
    first step runs none of its code)."""
    SessionOrder.leave(before, mine)
