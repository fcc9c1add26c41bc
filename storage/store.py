"""``Store``: the async storage API of the proxy (log, events, artifacts, requests, limits, reads).

Storage inserts what it is given (ids and times come from the caller) and returns frozen records
from ``storage.records``. Every method runs one short transaction; there is no global lock.
Concurrent writers are safe by constraint, not by locking: inserts use ``ON CONFLICT DO
NOTHING`` on the natural keys, so racing appends or compactions converge on one row.
Every SQLAlchemy/driver error is raised as ``StorageError`` or ``StorageUnavailable``.

On a SQLite file, the hot-path methods run through ``storage.sqlite.file.SqliteFile`` (small
transactions inline on the event loop's thread, others on store threads); the read API's queries
and PostgreSQL use the async engine. See ``Store._transact``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from storage import reads
from storage.engine import create_engine
from storage.errors import (
    FOREIGN_ERRORS,
    MissingRow,
    StorageError,
    StorageUnavailable,
    translate_error,
)
from storage.learned_limits import LearnedLimitQueries
from storage.records import (
    ArtifactRecord,
    EventRecord,
    MessageRecord,
    NewMessage,
    RequestRecord,
    SessionRecord,
    SessionSummary,
)
from storage.refused import RefusedRequestQueries, tracked
from storage.sqlite.file import Done, DriverStatement, SqliteFile, settle, small_rows
from storage.tables import (
    artifacts,
    events,
    messages,
    requests,
    sessions,
)
from storage.values import COUNT_MAX, TOKENS_MAX, clamp_count, finite

log = logging.getLogger("context_proxy.storage")

INSERT_BATCH_ROWS = 500
"""Rows per multi-row INSERT: keeps bound parameters (rows x columns) under SQLite's and asyncpg's
32,766/32,767 limits."""

PREFIX_TAIL = 64
"""``stored_prefix_len`` checks the last this-many hashes in one query before binary searching."""


def _later(column: sa.ColumnElement[Any], now: datetime | sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """``max(column, now)``, portable: a timestamp never moves back when clocks interleave."""
    return sa.case((column < now, now), else_=column)


T = TypeVar("T")

RecordItem = tuple[int, list[dict[str, Any]], dict[str, Any], datetime]
"""A deferred end-of-request write: ``(session_pk, message rows, request row values, now)``."""

COMPACTION_LOCK_SPACE = 0x4350 << 40
"""High bits of the advisory-lock key of a session's compaction (``'CP'``), above any session pk."""


class Store(LearnedLimitQueries, RefusedRequestQueries):
    """Async storage over one engine (SQLite or PostgreSQL). Create with ``await Store.open(url)``."""

    def __init__(self, engine: AsyncEngine, sqlite_file: SqliteFile | None = None, *, lock_connections: int = 10) -> None:
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
        self._driver: tuple[DriverStatement, DriverStatement, DriverStatement] | None = None
        """On a SQLite file: the end-of-request statements run on the driver (``DriverStatement``)."""
        if sqlite_file is not None:
            d = sqlite_file.dialect
            self._driver = (
                DriverStatement(self._bump_session, d),
                DriverStatement(self._insert(messages).on_conflict_do_nothing(
                    index_elements=[messages.c.session_pk, messages.c.chain_hash]), d, MESSAGE_ROW_KEYS),
                DriverStatement(self._insert_request, d, REQUEST_ROW_KEYS),
            )

    @classmethod
    async def open(cls, database_url: str, *, pool_size: int = 20) -> Store:
        """Open a store on ``database_url`` (as users write it); does not migrate
        (``storage.migrate.upgrade`` does). Connections are made lazily."""
        return cls(create_engine(database_url, pool_size=pool_size), SqliteFile.open(database_url),
                   lock_connections=max(1, pool_size // 2))

    async def close(self) -> None:
        """Finish queued writes, then close every pooled connection."""
        if self._sqlite is not None:
            await self._sqlite.close()
        await self._engine.dispose()

    async def reset_pool(self) -> None:
        """Drop every pooled connection (after the server restarted they are all dead); the
        engine stays usable and opens fresh ones."""
        if self._sqlite is not None:
            self._sqlite.dispose()
        await self._engine.dispose()

    async def _transact(self, operation: str, fn: Callable[[sa.Connection], T], *, write: bool = True, small: bool = True) -> T:
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

    def _flush(self) -> None:
        """Commit deferred writes before anything else reads or writes (order, read-your-writes)."""
        if self._sqlite is not None:
            self._sqlite.flush()

    async def ping(self, timeout_s: float = 5.0) -> bool:
        """True iff ``SELECT 1`` succeeds within ``timeout_s``; never raises."""
        try:
            async with asyncio.timeout(timeout_s), self._engine.connect() as conn:
                await conn.execute(sa.text("SELECT 1"))
            return True
        except (*FOREIGN_ERRORS, TimeoutError):
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

    @asynccontextmanager
    async def compaction_lock(self, session_pk: int, wait_s: float = 120.0) -> AsyncIterator[bool]:
        """Hold the session's compaction lock across processes; yields whether it was acquired.

        PostgreSQL: a session-level advisory lock on a dedicated connection, polled with
        ``pg_try_advisory_lock`` for at most ``wait_s`` (then yields ``False``: the caller goes on
        unlocked rather than stall a request). At most ``lock_connections`` (half the pool, from
        ``Store.open``) are held at once in this process; more compactions wait for a slot, so
        requests always find connections. SQLite: yields ``True`` at once (one process writes a
        SQLite file in practice; the proxy also locks per session in-process).
        """
        if self._dialect != "postgresql":
            yield True
            return
        key = COMPACTION_LOCK_SPACE | session_pk
        try:
            async with self._lock_slots, self._engine.connect() as conn:
                deadline = asyncio.get_running_loop().time() + wait_s
                acquired = False
                while True:
                    acquired = bool((await conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": key})).scalar())
                    await conn.commit()
                    if acquired or asyncio.get_running_loop().time() > deadline:
                        break
                    await asyncio.sleep(0.05)
                try:
                    yield acquired
                finally:
                    if acquired:
                        await conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                        await conn.commit()
        except FOREIGN_ERRORS as exc:
            raise translate_error(exc, "compaction_lock") from exc

    def _insert(self, table: sa.Table) -> Any:
        """The dialect's INSERT construct (it has ``on_conflict_do_nothing/do_update``)."""
        return (postgresql.insert if self._dialect == "postgresql" else sqlite.insert)(table)

    # --- sessions and the log -------------------------------------------------------------

    async def get_or_create_session(self, tenant: str, session_id: str, now: datetime) -> SessionRecord:
        """The session ``(tenant, session_id)``, created if missing; ``updated_at`` becomes ``now``
        (never earlier than it was). Race-safe: concurrent calls return the same row."""
        bump = (
            sa.update(sessions)
            .where(sessions.c.tenant == tenant, sessions.c.session_id == session_id)
            .values(updated_at=_later(sessions.c.updated_at, now))
            .returning(*sessions.c)
        )
        insert = self._insert(sessions).values(tenant=tenant, session_id=session_id, created_at=now, updated_at=now)
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
        parent). Cost: one point lookup when all are stored; else one ``IN`` query over the
        last ``PREFIX_TAIL``; else a binary search of point lookups (about 13 for 5,000).
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

        return await self._transact("stored_prefix_len", run, write=False)

    async def append_messages(self, session_pk: int, new_messages: Sequence[NewMessage], now: datetime) -> int:
        """Append ``new_messages`` (parents first) to the session's log; return how many were new.

        One transaction: bump ``sessions.updated_at`` (its row lock orders concurrent appends of
        one session on PostgreSQL), then ``INSERT .. ON CONFLICT (session_pk, chain_hash) DO
        NOTHING`` in batches. Overlapping concurrent appends never duplicate nor fail.
        """
        return len(await self.append_new_messages(session_pk, new_messages, now))

    async def append_new_messages(self, session_pk: int, new_messages: Sequence[NewMessage], now: datetime) -> list[int]:
        """``append_messages``, returning the ids of the rows it inserted (not of those already stored)."""
        if not new_messages:
            return []
        rows = _message_rows(session_pk, new_messages, now)
        return await self._transact("append_messages", lambda conn: self._append(conn, session_pk, rows, now),
                                    small=small_rows(new_messages))

    def _append(self, conn: sa.Connection, session_pk: int, rows: list[dict[str, Any]], now: datetime) -> list[int]:
        """Bump the session, insert ``rows``; the ids of the new ones (the ``RETURNING`` rows: a
        conflicting row returns none, on every driver, unlike ``rowcount`` of an executemany)."""
        conn.execute(self._bump_session, {"b_pk": session_pk, "b_now": now})
        added: list[int] = []
        for i in range(0, len(rows), INSERT_BATCH_ROWS):
            added.extend(conn.execute(self._insert_message, rows[i : i + INSERT_BATCH_ROWS]).scalars())
        return added

    async def append_and_record(
        self, session_pk: int, new_messages: Sequence[NewMessage], record: RequestRecord, now: datetime,
        *, added: tuple[int, int | None] | None = None,
    ) -> int:
        """``append_messages`` and ``add_request`` in one short transaction (the end of a request);
        how many messages were new. ``added``: ``(added_messages, first_added_seq)`` to store
        instead of the record's. On a SQLite file, a small one is deferred (``SqliteFile.defer``)."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if self.append_and_record_nowait(session_pk, new_messages, record, now, functools.partial(settle, future),
                                         added=added):
            return await future
        _, rows, values, _ = self._record_item(session_pk, new_messages, record, now, added)

        def run(conn: sa.Connection) -> int:
            added = len(self._append(conn, session_pk, rows, now)) if rows else 0
            conn.execute(self._insert_request, values)
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

    @property
    def defers_writes(self) -> bool:
        """Whether small writes are deferred and batched (a SQLite file): ``append_and_record_nowait``
        can queue them; elsewhere it always answers ``False``."""
        return self._driver is not None

    def append_and_record_nowait(
        self, session_pk: int, new_messages: Sequence[NewMessage], record: RequestRecord, now: datetime,
        done: Done, *, added: tuple[int, int | None] | None = None,
    ) -> bool:
        """``append_and_record`` without waiting for it, when it can be deferred (a SQLite file and
        a small write): queued, and ``done(new message count, None)`` or ``done(None, error)``
        once it ended (``storage.sqlite.file.Done``). ``False``, with nothing
        queued, otherwise (PostgreSQL, SQLite in memory, many or large messages): the caller then
        awaits ``append_and_record``. Must be called on the event loop's thread.

        For the end of a chat request: awaited, its write cost the request a task and a future
        on top of the write (``tests/benchmarks``, callgrind's instruction counts per request)."""
        if self._driver is None or not small_rows(new_messages):
            return False
        assert self._sqlite is not None
        item = self._record_item(session_pk, new_messages, record, now, added)
        refused: list[StorageError] = []

        def told(result: Any, error: BaseException | None) -> None:
            if error is None and refused:
                done(None, refused[0])
            else:
                done(result, error)

        self._sqlite.defer("append_and_record", functools.partial(self._record_alone, item, refused), told,
                           batch=self._records_on_driver, item=item)
        return True

    @staticmethod
    def _record_item(session_pk: int, new_messages: Sequence[NewMessage], record: RequestRecord, now: datetime,
                     added: tuple[int, int | None] | None) -> RecordItem:
        values = _request_values(record, now, added)
        return session_pk, _message_rows(session_pk, new_messages, now), values, now

    def _record_alone(self, item: RecordItem, refused: list[StorageError], conn: sa.Connection) -> int:
        """One deferred write alone (its batch failed): as ``_records_on_driver``, except that a
        refused request row does not undo the messages (SQLite undoes only the failed statement):
        its error goes to ``refused`` (the write's ``done`` gets it) and the messages commit. A
        session that is gone still fails the whole write (``MissingRow``)."""
        assert self._driver is not None
        session_pk, rows, values, now = item
        bump, insert_messages, insert_request = self._driver
        added = 0
        if rows:
            bump.execute(conn, {"b_pk": session_pk, "b_now": now})
            added = insert_messages.executemany(conn, rows)
        try:
            insert_request.execute(conn, values)
        except FOREIGN_ERRORS as exc:
            error = translate_error(exc, "append_and_record")
            if not rows or isinstance(error, StorageUnavailable | MissingRow):
                raise
            log.error("the request record was refused (%s); its %d messages were stored without it", error, len(rows))
            refused.append(error)
        return added

    def _records_on_driver(self, conn: sa.Connection, items: list[RecordItem]) -> list[int]:
        """The deferred ``append_and_record``s ``(session_pk, message rows, request values, now)``
        on the driver, as each would run alone (bump, messages, request), with a bump per session
        (to the latest ``now``: the bump keeps the later time anyway) and the request rows in one
        ``executemany``. The messages stay an ``executemany`` per item: its row count is the
        item's result."""
        assert self._driver is not None
        bump, insert_messages, insert_request = self._driver
        latest: dict[int, datetime] = {}
        for session_pk, rows, _, now in items:
            if rows and (session_pk not in latest or now > latest[session_pk]):
                latest[session_pk] = now
        if latest:
            bump.executemany(conn, [{"b_pk": pk, "b_now": now} for pk, now in latest.items()])
        added: list[int] = []
        request_rows: list[list[Any]] = []
        for _, rows, values, _ in items:
            added.append(insert_messages.executemany(conn, rows) if rows else 0)
            request_rows.append(insert_request.row(values))  # now: its time converts once (the memo)
        insert_request.executemany_rows(conn, request_rows)
        return added

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
        return await self._transact("list_events", lambda conn: [EventRecord(**r._mapping) for r in conn.execute(query)], write=False)

    async def put_artifacts(self, items: Sequence[ArtifactRecord]) -> list[str]:
        """Store artifacts; an id already stored for that tenant is left as it is. Returns the ids
        of the rows inserted (noted in the context's ``storage.refused.RequestWrites`` if tracked).

        Ids are content-addressed, so two tenants offloading the same content get the same id:
        the primary key is ``(tenant, id)`` and each tenant owns its own copy.
        """
        if not items:
            return []
        rows = [
            {
                "id": a.id,
                "tenant": a.tenant,
                "session_pk": a.session_pk,
                "media_type": a.media_type,
                "content": a.content,
                "size_bytes": clamp_count(a.size_bytes, 2**63 - 1),
                "line_count": clamp_count(a.line_count, COUNT_MAX),
                "created_at": a.created_at,
            }
            for a in items
        ]
        def run(conn: sa.Connection) -> list[str]:
            new: list[str] = []
            for i in range(0, len(rows), INSERT_BATCH_ROWS):
                stmt = self._insert(artifacts).values(rows[i : i + INSERT_BATCH_ROWS])
                new.extend(conn.execute(stmt.on_conflict_do_nothing(index_elements=[artifacts.c.tenant, artifacts.c.id])
                                        .returning(artifacts.c.id)).scalars())
            return new

        new = await self._transact("put_artifacts", run, small=False)  # offloaded content is large by definition
        if new and (writes := tracked()) is not None:
            writes.artifact_ids.extend(new)
        return new

    async def get_artifact(self, artifact_id: str, tenant: str | None) -> ArtifactRecord | None:
        """The artifact if it exists and belongs to ``tenant`` (``None``: admin, any tenant). Any
        ``str`` may be asked for (ids are escaped as stored: ``storage.tables.SafeText``)."""
        query = sa.select(*artifacts.c).where(artifacts.c.id == artifact_id)
        if tenant is not None:
            query = query.where(artifacts.c.tenant == tenant)
        row = await self._transact("get_artifact", lambda conn: conn.execute(query).first(), write=False, small=False)
        return None if row is None else ArtifactRecord(**row._mapping)

    @staticmethod
    def _request_row(record: RequestRecord, now: datetime) -> dict[str, Any]:
        return _request_values(record, now, None)

    async def add_request(self, record: RequestRecord) -> None:
        """Store a request record (``created_at`` ``None`` means now)."""
        values = _request_values(record, datetime.now(UTC), None)
        await self._transact("add_request", lambda conn: conn.execute(sa.insert(requests).values(**values)))

    # --- read side (see storage.reads) ---------------------------------------------------

    async def list_sessions(
        self, tenant: str | None, limit: int, after: str | None = None, after_tenant: str | None = None
    ) -> tuple[list[SessionSummary], bool]:
        """A keyset page of sessions, newest first, and ``has_more``; see ``reads.list_sessions``.
        ``tenant=None`` is an admin listing of every tenant. Raises ``InvalidCursor``."""
        async with self._read("list_sessions") as conn:
            return await reads.list_sessions(conn, tenant, limit, after, after_tenant)

    async def find_session(self, session_id: str, tenant: str | None) -> SessionRecord | None:
        """The tenant's session ``session_id`` (``tenant=None``: admin, newest match)."""
        async with self._read("find_session") as conn:
            return await reads.find_session(conn, session_id, tenant)

    async def session_summary(self, session: SessionRecord) -> SessionSummary:
        """Counts, token sums and last model of ``session``."""
        async with self._read("session_summary") as conn:
            return await reads.session_summary(conn, session)

    async def branch_leaf(self, session_pk: int, leaf_hash: str | None) -> MessageRecord | None:
        """The message ``leaf_hash``, or (``None``) the newest leaf of the session."""
        async with self._read("branch_leaf") as conn:
            return await reads.branch_leaf(conn, session_pk, leaf_hash)

    async def list_branch_messages(
        self, session_pk: int, leaf_hash: str, after_seq: int | None, limit: int
    ) -> tuple[list[MessageRecord], bool]:
        """Root-to-``leaf_hash`` messages with ``seq > after_seq``, by seq, and ``has_more``."""
        async with self._read("list_branch_messages") as conn:
            return await reads.list_branch_messages(conn, session_pk, leaf_hash, after_seq, limit)

    async def branch_message_ids(self, session_pk: int, leaf_hash: str) -> list[int]:
        """Ids of the root-to-``leaf_hash`` messages, by seq (for ``messages_by_ids`` pages)."""
        async with self._read("branch_message_ids") as conn:
            return await reads.branch_message_ids(conn, session_pk, leaf_hash)

    async def messages_by_ids(self, session_pk: int, ids: list[int]) -> list[MessageRecord]:
        """The session's messages with these ids, by seq."""
        async with self._read("messages_by_ids") as conn:
            return await reads.messages_by_ids(conn, session_pk, ids)

    async def get_message_by_hash(self, session_pk: int, chain_hash: str) -> MessageRecord | None:
        """The message of the session with this chain hash, or ``None``."""
        async with self._read("get_message_by_hash") as conn:
            return await reads.get_message_by_hash(conn, session_pk, chain_hash)

    async def list_internal_messages(self, session_pk: int) -> list[MessageRecord]:
        """The session's internal messages (rounds the proxy served itself), oldest first."""
        query = (
            sa.select(*messages.c)
            .where(messages.c.session_pk == session_pk, messages.c.internal.is_(True))
            .order_by(messages.c.id)
        )
        return await self._transact(
            "list_internal_messages", lambda conn: [MessageRecord(**r._mapping) for r in conn.execute(query)], write=False
        )

    async def list_requests(self, session_pk: int, limit: int, after: str | None) -> tuple[list[RequestRecord], bool]:
        """The session's request records, oldest first, and ``has_more``; see ``reads.list_requests``
        (the cursor is looked up in this session only). Raises ``InvalidCursor``."""
        async with self._read("list_requests") as conn:
            return await reads.list_requests(conn, session_pk, limit, after)


MESSAGE_ROW_KEYS = ("session_pk", "chain_hash", "parent_hash", "seq", "role", "message", "internal", "created_at")
"""The keys of ``_message_rows``' rows (the columns of a new message row)."""
REQUEST_ROW_KEYS = tuple(f.name for f in dataclasses.fields(RequestRecord))
"""The columns of a request row, as ``append_and_record`` gives them (``created_at`` included)."""


_COUNT_FIELDS = ("status", "added_messages", "first_added_seq")
_TOKEN_FIELDS = ("tokens_client", "tokens_forwarded")


def _request_values(record: RequestRecord, now: datetime, added: tuple[int, int | None] | None) -> dict[str, Any]:
    """The request row of ``record`` (``created_at`` ``None``: ``now``; ``added``: the message
    counts to store instead of the record's), every value storable: counts clamped to the
    columns (``COUNT_MAX``, tokens ``TOKENS_MAX``; a non-finite count stored as ``None``, or 0
    where the column needs one), a non-finite latency as 0. Text and JSON need nothing here:
    their column types store any ``str`` and any JSON (``storage.values``)."""
    values = {name: getattr(record, name) for name in REQUEST_ROW_KEYS}
    values["created_at"] = record.created_at or now
    if added is not None:
        values["added_messages"], values["first_added_seq"] = added
    for names, maximum in ((_COUNT_FIELDS, COUNT_MAX), (_TOKEN_FIELDS, TOKENS_MAX)):
        for name in names:
            value = values[name]
            if value is not None and (type(value) is not int or not -maximum <= value <= maximum):
                values[name] = clamp_count(value, maximum)  # (the usual in-range int skips the call)
    for name in ("status", "added_messages"):
        if values[name] is None:
            values[name] = 0
    if type(values["latency_ms"]) is float:
        values["latency_ms"] = finite(values["latency_ms"])
    return values


def _message_rows(session_pk: int, new_messages: Sequence[NewMessage], now: datetime) -> list[dict[str, Any]]:
    return [
        {
            "session_pk": session_pk,
            "chain_hash": m.chain_hash,
            "parent_hash": m.parent_hash,
            "seq": m.seq,
            "role": m.role,
            "message": m.message,
            "internal": m.internal,
            "created_at": now,
        }
        for m in new_messages
    ]
