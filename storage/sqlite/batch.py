"""The deferred batch of a SQLite file: small writes nothing waits on but a future, committed together.

``DeferredBatch.defer`` queues a write (the end of a request: reply and request record) and
returns its future; the writes queued meanwhile are committed in one inline transaction
``DEFER_WRITE_S`` later, or sooner: before any other operation of the store (``flush``). If that
transaction fails, each write is retried alone, so one bad write fails alone.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa

from storage.errors import StorageError

log = logging.getLogger("context_proxy.storage")

T = TypeVar("T")

DEFER_WRITE_S = 0.02
"""How long the end-of-request write may wait to be committed with others (``DeferredBatch``).
A commit costs about 0.15 ms of CPU however few its rows (the write lock, the session's bump, then
the WAL frames of the pages changed), so it is shared by the requests of this window: in the proxy
under ``tests/benchmarks``' overhead load (concurrency 16) a flush commits about 10 requests with
5 ms (7 with 2 ms), and with 20 ms the proxy's CPU per request was 0.93x that with 5 ms (median of
5 paired runs, both proxies on one core at once). The window is what a killed process (kill -9)
can lose of request records; the replies come back with the client's next request, and a
graceful shutdown commits everything (PostgreSQL's ``synchronous_commit = off`` risks up to
three ``wal_writer_delay``s, 600 ms by default, for the same kind of saving). A power loss or OS
crash can lose more: with ``synchronous = NORMAL`` in WAL mode the WAL is synced at checkpoints
(``storage.sqlite.file.CHECKPOINT_EVERY_WRITES``), not at each commit."""

Batch = Callable[[sqlite3.Connection, list[Any]], list[Any]]
"""Runs several deferred writes of one kind at once: ``batch(driver, items)`` returns a result per
item (``driver``: the ``sqlite3`` connection, inside the batch's transaction)."""

Job = tuple[str, Callable[[sa.Connection], Any], "asyncio.Future[Any]", Batch, Any]
"""``(operation, fn, future, batch, item)``: ``item`` among others in ``batch``, or ``fn(conn)`` alone."""


class Runner(Protocol):
    """What the batch runs its transactions on (``storage.sqlite.file.SqliteFile``)."""

    def commit_driver(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(driver)`` in one transaction on the event loop's thread, on the ``sqlite3``
        connection itself, committed; raises if it failed for any reason (a locked database
        included)."""

    async def run(self, operation: str, fn: Callable[[sa.Connection], T], *, write: bool, small: bool) -> T:
        """``fn(conn)`` in one transaction, inline or on a store thread; ``StorageError`` if it failed."""

    def wrote_inline(self) -> None:
        """An inline write was committed (for the WAL checkpoints)."""


class DeferredBatch:
    """The queue of deferred writes of one SQLite file. Bound: what is queued within
    ``DEFER_WRITE_S`` (the pipeline bounds the writes pending, ``max_pending_log_writes``).
    Must be used on the event loop's thread."""

    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self._deferred: list[Job] = []
        self._flush_timer: asyncio.TimerHandle | None = None
        self._retrying: set[asyncio.Task[None]] = set()

    def defer(self, operation: str, fn: Callable[[sa.Connection], Any], *,
              batch: Batch, item: Any) -> asyncio.Future[Any]:
        """Queue a small write; its future gets ``fn``'s result once committed, or the error.

        The point is when it runs: at one request a time, a client's next request arrives right
        after the reply, and the previous request's write would delay it; deferred, the write
        runs while the proxy waits for the upstream (``tests/benchmarks``, overhead at
        concurrency 1). A killed process loses at most the last ``DEFER_WRITE_S`` of replies,
        which the client resends with its next request anyway.

        ``batch`` and ``item``: writes queued one after the other with an equal ``batch`` (a
        bound method of one object, say) run as one call, ``batch(driver, [item, ...])``, which
        does what their ``fn``s would with fewer statements (or raises: then each runs alone).
        ``fn`` alone is what runs when the transaction is retried write by write. A result that
        is an exception instance means "committed, and this write failed with it" (its future
        gets the exception): a request row refused alone while its messages were stored, or a
        write whose values could not be converted, nothing of it stored
        (``storage.sqlite.end_write``)."""
        deferred = self._deferred
        # the loop of the writes queued (this one: the batch is used on one loop's thread), else the
        # running one, looked up once (on Python 3.11 each lookup is a ``getpid`` system call); a
        # queue left by a loop that has ended since (a store never closed) is not this one's
        loop = deferred[0][2].get_loop() if deferred else None
        if loop is None or loop.is_closed():
            loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        deferred.append((operation, fn, future, batch, item))
        if self._flush_timer is None:
            self._flush_timer = loop.call_later(DEFER_WRITE_S, self.flush)
        return future

    def flush(self) -> None:
        """Commit the queued writes in one inline transaction. If that fails (the database is
        locked, or one write is refused), each is retried on its own (``Runner.run``: inline,
        or on the writer thread when the database is locked), later, in a task."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        jobs, self._deferred = self._deferred, []
        if not jobs:
            return
        try:
            results = self._runner.commit_driver(functools.partial(_run_jobs, jobs=jobs))
        except Exception:  # noqa: BLE001  (locked, a refused write, anything: retried one by one)
            remaining = list(jobs)
            task = asyncio.get_running_loop().create_task(self._one_by_one(remaining))
            self._retrying.add(task)
            task.add_done_callback(self._retrying.discard)
            task.add_done_callback(functools.partial(_tell_cancelled, remaining))
            return
        for job, result in zip(jobs, results, strict=True):
            _settle(job[2], result, None)
        self._runner.wrote_inline()

    async def close(self) -> None:
        """Commit what is queued and wait for the retries."""
        self.flush()
        if self._retrying:
            await asyncio.gather(*self._retrying, return_exceptions=True)

    async def _one_by_one(self, remaining: list[Job]) -> None:
        """Retry each write alone, settling each future; a write is taken off ``remaining`` once
        settled (if the task is cancelled, ``_tell_cancelled`` fails the rest)."""
        while remaining:
            operation, fn, future, _, _ = remaining[0]
            try:
                result = await self._runner.run(operation, fn, write=True, small=True)
            except Exception as exc:  # noqa: BLE001  (the write's future gets it)
                remaining.pop(0)
                _settle(future, None, exc)
            else:
                remaining.pop(0)
                _settle(future, result, None)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """The write's future gets ``result``, or ``error`` (or ``result`` itself when it is an
    exception: see ``DeferredBatch.defer``); nothing if it was cancelled meanwhile."""
    if future.done():
        return
    if error is None and isinstance(result, BaseException):
        error = result
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def _tell_cancelled(remaining: list[Job], task: asyncio.Task[None]) -> None:
    """The retries were cancelled (the loop is stopping): the writes not settled yet fail so. The
    one being retried may still commit (``run`` shields it), hence "may"."""
    if task.cancelled():
        error = StorageError("the proxy stopped before this write was retried (it may have been committed)")
        for job in remaining:
            _settle(job[2], None, error)
        remaining.clear()


def _run_jobs(driver: sqlite3.Connection, jobs: list[Job]) -> list[Any]:
    """The jobs' results, in order: consecutive jobs of one ``batch`` in one call of it."""
    results: list[Any] = []
    i = 0
    while i < len(jobs):
        batch = jobs[i][3]
        j = i + 1
        while j < len(jobs) and jobs[j][3] == batch:  # (a bound method is made anew at each access)
            j += 1
        out = batch(driver, [job[4] for job in jobs[i:j]])
        if len(out) != j - i:
            raise RuntimeError(f"a deferred batch returned {len(out)} results for {j - i} writes")
        results.extend(out)
        i = j
    return results
