"""How ``Store`` runs its hot-path transactions on a SQLite file (``SqliteFile``).

A small transaction (a turn's few rows, a point read) runs whole, synchronously, on the event
loop's thread with a synchronous engine's single "inline" connection. That costs about 0.25 ms of
CPU (WAL, ``synchronous=NORMAL``: a commit does not sync), against about 1.5 ms of thread hops
through ``aiosqlite`` (py-spy under ``tests/benchmarks``). The inline connection never waits for a
lock: if another connection holds it, the transaction goes to the store threads like a large one
(writes on a single writer thread, in arrival order; reads on their own threads).

Also here: WAL checkpoints on the writer thread (the inline connection never checkpoints
itself); while one is pending, writes queue behind it there instead of running inline, and
reads wait for the writes queued so (a read sees the writes started before it). The
file's deferred batch (``storage.sqlite.batch``) commits through it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc

from storage.engine import SQLITE_BUSY_TIMEOUT_MS, create_sqlite_file_engine
from storage.errors import FOREIGN_ERRORS, translate_error
from storage.records import NewMessage
from storage.sqlite.batch import DeferredBatch

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

CHECKPOINT_EVERY_WRITES = 200
"""Inline writes between two WAL checkpoints (SQLite's own default is every 1,000 pages)."""

CHECKPOINT_ATTEMPTS = 5
"""Tries of one checkpoint (each waits ``CHECKPOINT_BUSY_TIMEOUT_MS``, then half of it between)."""

CHECKPOINT_BUSY_TIMEOUT_MS = 100
"""How long a checkpoint waits for readers of older snapshots (e.g. a backup, the retention
command): writers queue behind it meanwhile, so it gives up soon and is tried again later."""


def small_rows(new_messages: Sequence[NewMessage]) -> bool:
    """Few rows and little text (``INLINE_MAX_ROWS``, ``INLINE_MAX_CHARS``): cheap enough to write
    on the event loop's thread. A message nested too deep to measure is not (its JSON is written
    without recursion, ``storage.values``, but not for free)."""
    if len(new_messages) > INLINE_MAX_ROWS:
        return False
    budget = INLINE_MAX_CHARS
    for m in new_messages:
        try:
            budget -= _chars(m.message)
        except RecursionError:
            return False
        if budget < 0:
            return False
    return True


def _chars(value: Any) -> int:
    """Characters of the strings in a JSON value (its size, roughly, without serializing it)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):  # (a message: mostly strings, counted without a call each)
        n = 0
        for v in value.values():
            n += len(v) if type(v) is str else _chars(v)
        return n
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    return 8


class _Busy(Exception):
    """The inline connection found the database locked (it never waits)."""


class SqliteFile:
    """The engines, threads and deferred batch (``batch``) of one SQLite file. ``open`` returns
    ``None`` for a URL that is not a SQLite file (PostgreSQL, SQLite in memory): ``Store`` then
    uses its async engine alone. Foreign errors are raised as ``StorageError``s."""

    def __init__(self, threaded: Engine, inline: Engine) -> None:
        self._threaded = threaded
        self._inline = inline
        self._inline_writes = 0
        self._checkpointing: concurrent.futures.Future[Any] | None = None
        """The last checkpoint queued on the writer thread: until it is done, writes queue behind it."""
        self._tail: concurrent.futures.Future[Any] | None = None
        """The last job queued on the writer thread behind that checkpoint (or the checkpoint): until
        it is done, reads wait for it. (``concurrent`` futures: done when the thread is done,
        whichever loop runs, or none.)"""
        self._driver: sqlite3.Connection | None = None
        """The inline connection's ``sqlite3`` connection, for ``commit_driver`` (its engine's
        ``StaticPool`` keeps that one connection; ``None``: not looked up yet, or dropped)."""
        self.batch = DeferredBatch(self)
        """Small writes nothing waits on but a future (``DeferredBatch.defer``)."""
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
        await self.batch.close()
        for pool in (self._writer, self._reader):
            await asyncio.get_running_loop().run_in_executor(None, pool.shutdown)
        self.dispose()

    def dispose(self) -> None:
        """Drop the pooled connections (new ones open on the next use)."""
        self._driver = None
        self._threaded.dispose()
        self._inline.dispose()

    async def run(self, operation: str, fn: Callable[[sa.Connection], T], *, write: bool, small: bool) -> T:
        """Run ``fn(connection)`` in one transaction (committed if ``write``); inline when
        ``small`` and the database is not locked, else on a store thread (see the module
        docstring). A caller cancelled while a threaded transaction waits does not stop it.

        While a checkpoint is pending, writes run on the writer thread, after it: inline writes
        one after the other leave the database unlocked only between two of them, and a
        checkpoint waiting for the lock could miss every such moment (each try polls it a few
        times in ``CHECKPOINT_BUSY_TIMEOUT_MS``), and the WAL grew without end. Reads meanwhile
        wait for the writes queued so: they were started before, and a read sees them. Once the
        checkpoint is done, writes run inline again without waiting for those queued behind it,
        so a steady stream of concurrent writes does not keep every write on the thread; but one
        that finds the lock free between two of those commits before them (a probe: 4-13 of 30
        rounds of 50 writes queued behind a checkpoint; not fixed here)."""
        self.batch.flush()  # what was deferred goes first: order and read-your-writes hold
        tail = self._tail
        if tail is not None:
            if tail.done():
                tail = self._tail = None
            elif not write:
                await _after(tail)
                tail = None
            elif not self._checkpoint_pending():
                tail = None
        if small and tail is None:
            try:
                result = _transaction(self._inline, operation, fn, write, inline=True)
            except _Busy:
                pass  # another connection holds the lock: wait for it on a thread instead
            else:
                if write:
                    self.wrote_inline()
                return result
        future = (self._writer if write else self._reader).submit(_transaction, self._threaded, operation, fn, write)
        if tail is not None:  # a write behind the checkpoint: the next ones, and reads, come after it
            self._tail = future
        # shielded: a cancelled caller must not cancel a queued write before it ran
        return await asyncio.shield(asyncio.wrap_future(future))

    def commit_driver(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(driver)`` in one committed transaction on the inline connection's ``sqlite3``
        connection itself, at once (as an inline write transaction, without SQLAlchemy's
        checkout, transaction and reset: an empty transaction took 13 us through them, 0.6 us
        so, timeit). ``fn`` runs statements on ``driver`` (``DriverStatement.run_on``: DML opens
        the transaction, as under SQLAlchemy); this commits, or rolls back and raises what
        failed, as is (a locked database included: it never waits). Only on the event loop's
        thread, between inline transactions (they run whole, synchronously, there too)."""
        driver = self._driver
        if driver is None:
            with self._inline.connect() as conn:  # (opens it on first use, or after ``dispose``)
                found = conn.connection.driver_connection
            assert isinstance(found, sqlite3.Connection)
            driver = self._driver = found
        try:
            result = fn(driver)
            driver.commit()
        except BaseException:
            self._driver = None  # (looked up again next time: a connection SQLAlchemy replaced)
            try:
                driver.rollback()
            except sqlite3.Error:  # still inside the failed transaction: never used again (as SQLAlchemy
                self._inline.dispose()  # invalidates a connection whose reset fails), its changes undone
            raise
        return result

    def wrote_inline(self) -> None:
        """An inline write was committed: every ``CHECKPOINT_EVERY_WRITES``, checkpoint."""
        self._inline_writes += 1
        if self._inline_writes % CHECKPOINT_EVERY_WRITES == 0 and not self._checkpoint_pending():
            self._checkpoint()  # (not while one is pending: a deferred batch commits inline meanwhile)

    def _checkpoint_pending(self) -> bool:
        """A checkpoint is queued or running on the writer thread."""
        return self._checkpointing is not None and not self._checkpointing.done()

    def _checkpoint(self) -> None:
        """Checkpoint the WAL on the writer thread, in RESTART mode: it holds off writers until
        the whole WAL is copied, so the next write starts the WAL over (a PASSIVE checkpoint
        never catches up while writes go on, and the WAL grows without end). Meanwhile the
        loop's writes queue on the writer thread behind it (``run``). When every try is busy
        (a reader kept an old snapshot throughout: a backup, a long read), it logs a warning and
        gives up until the next ``CHECKPOINT_EVERY_WRITES``; the WAL grows meanwhile."""

        def run(conn: sa.Connection) -> bool:
            conn.exec_driver_sql(f"PRAGMA busy_timeout = {CHECKPOINT_BUSY_TIMEOUT_MS}")
            try:
                for attempt in range(CHECKPOINT_ATTEMPTS):  # busy: a reader was in the way
                    if attempt:
                        time.sleep(CHECKPOINT_BUSY_TIMEOUT_MS / 2000)
                    busy = conn.exec_driver_sql("PRAGMA wal_checkpoint(RESTART)").first()
                    if busy is None or not busy[0]:
                        return True
                return False
            finally:
                conn.exec_driver_sql(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")

        future = self._writer.submit(_transaction, self._threaded, "checkpoint", run, False)
        self._checkpointing = self._tail = future
        asyncio.wrap_future(future).add_done_callback(_checkpoint_done)


def _checkpoint_done(future: asyncio.Future[bool]) -> None:
    """A checkpoint that failed or stayed busy is logged."""
    if future.cancelled():
        return
    if future.exception() is not None:
        log.warning("WAL checkpoint failed: %s", future.exception())
    elif not future.result():
        log.warning("WAL checkpoint busy %d times (a reader kept an older snapshot); the WAL grows "
                    "until a later checkpoint, after %d more writes, finishes",
                    CHECKPOINT_ATTEMPTS, CHECKPOINT_EVERY_WRITES)


def _transaction(engine: Engine, operation: str, fn: Callable[[sa.Connection], T], write: bool, *,
                 inline: bool = False) -> T:
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


async def _after(future: concurrent.futures.Future[Any]) -> None:
    """Until ``future`` (a job of a store thread) is done, however it ended: its outcome is its caller's."""
    waiter = asyncio.wrap_future(future)
    waiter.add_done_callback(_retrieved)
    await asyncio.wait((waiter,))


def _retrieved(future: asyncio.Future[Any]) -> None:
    """(Its exception, if any, is its caller's: not logged as never retrieved here.)"""
    if not future.cancelled():
        future.exception()
