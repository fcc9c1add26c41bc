"""How ``Store`` runs its hot-path transactions on a SQLite file (``SqliteFile``).

A small transaction (a turn's few rows, a point read) runs whole, synchronously, on the event
loop's thread with a synchronous engine's single "inline" connection. That costs about 0.25 ms of
CPU (WAL, ``synchronous=NORMAL``: a commit does not sync), against about 1.5 ms of thread hops
through ``aiosqlite`` (py-spy under ``tests/benchmarks``). The inline connection never waits for a
lock: if another connection holds it, the transaction goes to the store threads like a large one
(writes on a single writer thread, in arrival order; reads on their own threads).

Also here: the end-of-request write deferred and batched (``defer``), and WAL checkpoints
on the writer thread (the inline connection never checkpoints itself).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import operator
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc

from storage.engine import SQLITE_BUSY_TIMEOUT_MS, create_sqlite_file_engine
from storage.errors import FOREIGN_ERRORS, StorageError, translate_error
from storage.records import NewMessage

log = logging.getLogger("context_proxy.storage")

T = TypeVar("T")

INLINE_MAX_ROWS = 16
"""Message rows a transaction may write on the event loop's thread; more (a client's first
request with a long history) go to the writer thread, so the loop never stalls on a large write."""

INLINE_MAX_CHARS = 256 * 1024
"""Characters of text in those rows, at most, for the same reason (serializing, compressing and
writing one 16 MB message took 321 ms of the loop's time, measured)."""

READ_THREADS = 2
"""Threads for reads that do not run inline (WAL: reads run beside the writer)."""

DEFER_WRITE_S = 0.02
"""How long the end-of-request write may wait to be committed with others (``defer``).
A commit costs about 0.15 ms of CPU however few its rows (the write lock, the session's bump, then
the WAL frames of the pages changed), so it is shared by the requests of this window: in the proxy
under ``tests/benchmarks``' overhead load (concurrency 16) a flush commits about 10 requests with
5 ms (7 with 2 ms), and with 20 ms the proxy's CPU per request was 0.93x that with 5 ms (median of
5 paired runs, both proxies on one core at once). The window is what a killed process (kill -9)
can lose of request records; the replies come back with the client's next request, and a
graceful shutdown commits everything (PostgreSQL's ``synchronous_commit = off`` risks up to
three ``wal_writer_delay``s, 600 ms by default, for the same kind of saving). A power loss or OS
crash can lose more: with ``synchronous = NORMAL`` in WAL mode the WAL is synced at checkpoints
(``CHECKPOINT_EVERY_WRITES``), not at each commit."""

CHECKPOINT_EVERY_WRITES = 200
"""Inline writes between two WAL checkpoints (SQLite's own default is every 1,000 pages)."""

CHECKPOINT_ATTEMPTS = 5
"""Tries of one checkpoint (each waits ``CHECKPOINT_BUSY_TIMEOUT_MS``, then half of it between)."""

CHECKPOINT_BUSY_TIMEOUT_MS = 100
"""How long a checkpoint waits for readers of older snapshots (e.g. a backup, the retention
command): writers queue behind it meanwhile, so it gives up soon and is tried again later."""

Batch = Callable[[sa.Connection, list[Any]], list[Any]]
"""Runs several deferred writes of one kind at once: ``batch(conn, items)`` returns a result per item."""

Done = Callable[[Any, BaseException | None], None]
"""Told how a deferred write ended, exactly once: ``done(result, None)`` once committed,
``done(None, error)`` if it failed (a ``StorageError``, or what the write itself raised). Called on
the event loop's thread, in the context of whatever ran the flush (not the caller's); what it
raises is logged and dropped."""

Job = tuple[str, Callable[[sa.Connection], Any], Done, Batch | None, Any]
"""``(operation, fn, done, batch, item)``: ``fn(conn)`` alone, or ``item`` among others in ``batch``."""


def small_rows(new_messages: Sequence[NewMessage]) -> bool:
    """Few rows and little text (``INLINE_MAX_ROWS``, ``INLINE_MAX_CHARS``): cheap enough to write
    on the event loop's thread."""
    if len(new_messages) > INLINE_MAX_ROWS:
        return False
    budget = INLINE_MAX_CHARS
    for m in new_messages:
        budget -= _chars(m.message)
        if budget < 0:
            return False
    return True


def _chars(value: Any) -> int:
    """Characters of the strings in a JSON value (its size, roughly, without serializing it)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_chars(v) for v in value.values())
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    return 8


class _Busy(Exception):
    """The inline connection found the database locked (it never waits)."""


class SqliteFile:
    """The engines, threads and write queue of one SQLite file. ``open`` returns ``None`` for a
    URL that is not a SQLite file (PostgreSQL, SQLite in memory): ``Store`` then uses its async
    engine alone. Foreign errors are raised as ``StorageError``s."""

    def __init__(self, threaded: Engine, inline: Engine) -> None:
        self._threaded = threaded
        self._inline = inline
        self._inline_writes = 0
        self._deferred: list[Job] = []
        self._flush_timer: asyncio.TimerHandle | None = None
        self._retrying: set[asyncio.Task[None]] = set()
        # one writer at a time in SQLite: one thread for writes queues them in order instead of
        # having our own connections wait on each other's locks
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="store-write")
        self._reader = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="store-read")

    @property
    def dialect(self) -> sa.Dialect:
        """The dialect of the file's connections (``pysqlite``)."""
        return self._inline.dialect

    @classmethod
    def open(cls, database_url: str) -> SqliteFile | None:
        threaded = create_sqlite_file_engine(database_url)
        if threaded is None:
            return None
        inline = create_sqlite_file_engine(database_url, inline=True)
        assert inline is not None
        return cls(threaded, inline)

    async def close(self) -> None:
        """Commit what is queued, finish the threads' work, close the connections."""
        self.flush()
        if self._retrying:
            await asyncio.gather(*self._retrying, return_exceptions=True)
        for pool in (self._writer, self._reader):
            await asyncio.get_running_loop().run_in_executor(None, pool.shutdown)
        self.dispose()

    def dispose(self) -> None:
        """Drop the pooled connections (new ones open on the next use)."""
        self._threaded.dispose()
        self._inline.dispose()

    async def run(self, operation: str, fn: Callable[[sa.Connection], T], *, write: bool, small: bool) -> T:
        """Run ``fn(connection)`` in one transaction (committed if ``write``); inline when
        ``small`` and the database is not locked, else on a store thread (see the module
        docstring). A caller cancelled while a threaded transaction waits does not stop it."""
        self.flush()  # what was deferred goes first: order and read-your-writes hold
        if small:
            try:
                result = _transaction(self._inline, operation, fn, write, inline=True)
            except _Busy:
                pass  # another connection holds the lock: wait for it on a thread instead
            else:
                if write:
                    self._wrote_inline()
                return result
        pool = self._writer if write else self._reader
        # shielded: a cancelled caller must not cancel a queued write before it ran
        return await asyncio.shield(
            asyncio.get_running_loop().run_in_executor(pool, _transaction, self._threaded, operation, fn, write)
        )

    def defer(self, operation: str, fn: Callable[[sa.Connection], Any], done: Done, *,
              batch: Batch | None = None, item: Any = None) -> None:
        """Queue a small write that nothing waits on but ``done`` (the end of a request: reply and
        request record). It is committed with the others queued meanwhile in one transaction,
        ``DEFER_WRITE_S`` later, or sooner: before any other operation of the store (``flush``).
        If that transaction fails, each write is retried alone (``run``: inline, or on the writer
        thread when the database is locked), later. The point is when it runs: at one request a
        time, a client's next request arrives right after the reply, and the previous request's
        write would delay it; deferred, the write runs while the proxy waits for the upstream
        (``tests/benchmarks``, overhead at concurrency 1). A killed process loses at most the
        last ``DEFER_WRITE_S`` of replies, which the client resends with its next request anyway
        (a power loss can lose more: see ``DEFER_WRITE_S``). Must be called on the event loop's thread.

        ``batch`` and ``item``: writes queued one after the other with an equal ``batch`` (a
        bound method of one object, say) run as one call, ``batch(conn, [item, ...])``, which
        does what their ``fn``s would with fewer statements (at concurrency 16 a flush commits
        about 10 requests: see ``DEFER_WRITE_S``). ``fn`` alone is what runs when the
        transaction is retried write by write. ``done``: see ``Done``; a callback instead of a
        future, so that a request whose write nothing awaits needs no task to wait on it (a task
        and a future a request were measurable, ``Store.append_and_record_nowait``)."""
        self._deferred.append((operation, fn, done, batch, item))
        if self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(DEFER_WRITE_S, self.flush)

    def flush(self) -> None:
        """Commit the queued writes in one inline transaction. If that fails (the database is
        locked, or one write is refused), each is retried on its own through ``run``, so one bad
        write fails alone."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        jobs, self._deferred = self._deferred, []
        if not jobs:
            return
        try:
            results = _transaction(self._inline, "deferred writes", lambda conn: _run_jobs(conn, jobs), True, inline=True)
        except Exception:  # noqa: BLE001  (locked, a refused write, anything: retried one by one)
            remaining = list(jobs)
            task = asyncio.get_running_loop().create_task(self._one_by_one(remaining))
            self._retrying.add(task)
            task.add_done_callback(self._retrying.discard)
            task.add_done_callback(functools.partial(_tell_cancelled, remaining))
            return
        for (_, _, done, _, _), result in zip(jobs, results, strict=True):
            _tell(done, result, None)
        self._wrote_inline()

    async def _one_by_one(self, remaining: list[Job]) -> None:
        """Retry each write alone (``run``: inline, or on the writer thread when the database is
        locked), telling each how it ended; a write is taken off ``remaining`` once told (if the
        task is cancelled, ``_tell_cancelled`` tells the rest)."""
        while remaining:
            operation, fn, done, _, _ = remaining[0]
            try:
                result = await self.run(operation, fn, write=True, small=True)
            except Exception as exc:  # noqa: BLE001  (handed to the caller's ``done``)
                remaining.pop(0)
                _tell(done, None, exc)
            else:
                remaining.pop(0)
                _tell(done, result, None)

    def _wrote_inline(self) -> None:
        self._inline_writes += 1
        if self._inline_writes % CHECKPOINT_EVERY_WRITES == 0:
            self._checkpoint()

    def _checkpoint(self) -> None:
        """Checkpoint the WAL on the writer thread, in RESTART mode: it holds off writers until
        the whole WAL is copied, so the next write starts the WAL over (a PASSIVE checkpoint
        never catches up while writes go on, and the WAL grows without end). Meanwhile the
        loop's writes find the lock taken and queue on the writer thread behind it."""

        def run(conn: sa.Connection) -> None:
            conn.exec_driver_sql(f"PRAGMA busy_timeout = {CHECKPOINT_BUSY_TIMEOUT_MS}")
            try:
                for _ in range(CHECKPOINT_ATTEMPTS):  # busy: a reader or the loop's write was in the way
                    busy = conn.exec_driver_sql("PRAGMA wal_checkpoint(RESTART)").first()
                    if busy is None or not busy[0]:
                        return
                    time.sleep(CHECKPOINT_BUSY_TIMEOUT_MS / 2000)
            finally:
                conn.exec_driver_sql(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")

        future = asyncio.get_running_loop().run_in_executor(self._writer, _transaction, self._threaded, "checkpoint", run, False)
        future.add_done_callback(_log_checkpoint_failure)


def settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """A ``Done`` for a caller that awaits ``future``: it gets the result or the error (unless
    cancelled). ``functools.partial(settle, future)``."""
    if not future.done():
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


def _tell_cancelled(remaining: list[Job], task: asyncio.Task[None]) -> None:
    """The retries were cancelled (the loop is stopping): the writes not told yet are told so. The
    one being retried may still commit (``run`` shields it), hence "may"."""
    if task.cancelled():
        error = StorageError("the proxy stopped before this write was retried (it may have been committed)")
        for job in remaining:
            _tell(job[2], None, error)
        remaining.clear()


def _tell(done: Done, result: Any, error: BaseException | None) -> None:
    """``done(result, error)``; a callback that raises is logged, never let through (the other
    writes of the flush still get theirs)."""
    try:
        done(result, error)
    except Exception:
        log.exception("a deferred write's callback failed")


def _run_jobs(conn: sa.Connection, jobs: list[Job]) -> list[Any]:
    """The jobs' results, in order: consecutive jobs of one ``batch`` in one call of it."""
    results: list[Any] = []
    i = 0
    while i < len(jobs):
        batch = jobs[i][3]
        if batch is None:
            results.append(jobs[i][1](conn))
            i += 1
            continue
        j = i + 1
        while j < len(jobs) and jobs[j][3] == batch:  # (a bound method is made anew at each access)
            j += 1
        out = batch(conn, [job[4] for job in jobs[i:j]])
        if len(out) != j - i:
            raise RuntimeError(f"a deferred batch returned {len(out)} results for {j - i} writes")
        results.extend(out)
        i = j
    return results


def _transaction(engine: Engine, operation: str, fn: Callable[[sa.Connection], T], write: bool, *, inline: bool = False) -> T:
    """``fn(connection)`` in one transaction of ``engine``; ``_Busy`` when the inline connection
    finds the database locked, else foreign errors as ``StorageError``s. (A connection kept open
    between inline transactions saved ~11 us each, timeit, but let the WAL checkpoint fail now and
    then under continuous writes, ``test_sqlite_inline_writes_checkpoint_the_wal``: not kept.)"""
    try:
        with engine.begin() if write else engine.connect() as conn:
            return fn(conn)
    except sa_exc.OperationalError as exc:
        text = str(exc.orig)
        if inline and ("locked" in text or "busy" in text):
            raise _Busy from exc
        raise translate_error(exc, operation) from exc
    except FOREIGN_ERRORS as exc:
        raise translate_error(exc, operation) from exc


def _log_checkpoint_failure(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("WAL checkpoint failed: %s", future.exception())


class DriverStatement:
    """A SQLAlchemy statement compiled once for SQLite, then run on the driver's connection.

    ``execute(conn, values)`` / ``executemany(conn, rows)`` take the values by bind name (as
    ``conn.execute`` does), convert them with the column types' own bind processors (hashes to
    bytes, JSON packed, times as text), and call ``sqlite3`` directly inside ``conn``'s
    transaction. They return the rows changed (``executemany``: the sum, so an ``INSERT .. ON
    CONFLICT DO NOTHING`` counts the rows it added). SQLAlchemy's per-execution work (execution
    context, parameter processing, result objects) was about 15% of a small chat request's CPU
    (py-spy, ``tests/benchmarks`` overhead at concurrency 16); this keeps the same SQL and types
    without it. Driver errors are raised as SQLAlchemy's (``OperationalError`` for a locked
    database), as ``conn.execute`` would. Statements with ``RETURNING`` are not supported.
    """

    __slots__ = ("_get", "_processed", "sql")

    def __init__(self, statement: sa.Executable, dialect: sa.Dialect, column_keys: Sequence[str] | None = None) -> None:
        """``column_keys``: for an ``INSERT`` without values, the columns given (else all)."""
        compiled = statement.compile(dialect=dialect, column_keys=list(column_keys) if column_keys else None)  # type: ignore[attr-defined]
        if compiled.positiontup is None:
            raise ValueError("DriverStatement needs a positional (qmark) dialect")
        processors = compiled._bind_processors  # name -> the type's bind processor, for those that have one
        self.sql: str = compiled.string
        names = list(compiled.positiontup)
        self._get = operator.itemgetter(*names, *names[:1])  # (a name more: a 1-column row is a tuple too)
        # a type's own one-step SQLite processor (``sqlite_bind``) first, else SQLAlchemy's
        procs = [getattr(compiled.binds[name].type, "sqlite_bind", None) or processors.get(name) for name in names]
        self._processed = [(i, proc) for i, proc in enumerate(procs) if proc is not None]

    def row(self, values: dict[str, Any]) -> list[Any]:
        """The driver's parameters for ``values`` (by bind name), converted by the column types."""
        row = list(self._get(values))
        row.pop()
        for i, proc in self._processed:
            row[i] = proc(row[i])
        return row

    def execute(self, conn: sa.Connection, values: dict[str, Any]) -> int:
        return self._run(conn, False, [self.row(values)])

    def executemany(self, conn: sa.Connection, rows: Sequence[dict[str, Any]]) -> int:
        return self._run(conn, True, [self.row(r) for r in rows])

    def executemany_rows(self, conn: sa.Connection, rows: list[list[Any]]) -> int:
        """``executemany`` of rows already converted by ``row``."""
        return self._run(conn, True, rows)

    def _run(self, conn: sa.Connection, many: bool, params: list[list[Any]]) -> int:
        driver = conn.connection.driver_connection
        assert driver is not None
        try:
            cursor = driver.executemany(self.sql, params) if many else driver.execute(self.sql, params[0])
        except (conn.dialect.dbapi.Error, OverflowError) as exc:  # type: ignore[union-attr]  (sqlite3: an int beyond 64 bits)
            # parameters hidden, as every engine hides them (``storage.engine``): they are message content
            raise sa_exc.DBAPIError.instance(self.sql, params, exc, conn.dialect.dbapi.Error,  # type: ignore[union-attr]
                                             hide_parameters=True) from exc
        try:
            return cursor.rowcount
        finally:
            cursor.close()
