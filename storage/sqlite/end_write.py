"""The end-of-request write on a SQLite file: deferred in the file's batch, run on the driver.

``Store.append_and_record`` hands a small write here (``storage.sqlite.file.small_rows``): its
rows go to the file's ``DeferredBatch`` and are committed with the other writes queued within
``storage.sqlite.batch.DEFER_WRITE_S``, by ``DriverStatement``s (the same SQL and column types
as the SQLAlchemy path, ``storage.rows``, without its per-execution work).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from storage.errors import FOREIGN_ERRORS, MissingRow, StorageError, StorageUnavailable, translate_error
from storage.rows import MESSAGE_ROW_KEYS, REQUEST_ROW_KEYS, RecordItem
from storage.sqlite.driver import DriverStatement
from storage.sqlite.file import SqliteFile

log = logging.getLogger("context_proxy.storage")


class SqliteEndWrite:
    """``append_and_record`` on a SQLite file: ``defer(item)`` returns the write's future."""

    def __init__(self, sqlite_file: SqliteFile, bump_session: sa.Executable, insert_message: sa.Executable,
                 insert_request: sa.Executable) -> None:
        """``bump_session``: the session's ``updated_at`` (binds ``b_pk``, ``b_now``);
        ``insert_message``: a message row, ``ON CONFLICT DO NOTHING`` (no ``RETURNING``);
        ``insert_request``: a request row."""
        d = sqlite_file.dialect
        self._batch = sqlite_file.batch
        self._bump = DriverStatement(bump_session, d)
        self._insert_messages = DriverStatement(insert_message, d, MESSAGE_ROW_KEYS)
        self._insert_request = DriverStatement(insert_request, d, REQUEST_ROW_KEYS)

    def defer(self, item: RecordItem) -> asyncio.Future[int]:
        """Queue the write ``item`` (``storage.rows.record_item``): its future gets how many of
        its messages were new once committed, or the ``StorageError`` (``MissingRow``: the
        session is gone, nothing stored; another: the request row was refused, its messages
        stored). Must be called on the event loop's thread."""
        future: asyncio.Future[int] = self._batch.defer("append_and_record", functools.partial(self._alone, item),
                                                        batch=self.batch, item=item)
        return future

    def _alone(self, item: RecordItem, conn: sa.Connection) -> int | StorageError:
        """One write alone (its batch failed): as ``batch``, except that a refused request row
        does not undo the messages (SQLite undoes only the failed statement): its error is the
        result (``DeferredBatch``: committed, the write failed) and the messages commit. A
        session that is gone still fails the whole write (``MissingRow``)."""
        session_pk, rows, values, now = item
        added = 0
        if rows:
            self._bump.execute(conn, {"b_pk": session_pk, "b_now": now})
            added = self._insert_messages.executemany(conn, rows)
        try:
            self._insert_request.execute(conn, values)
        except FOREIGN_ERRORS as exc:
            error = translate_error(exc, "append_and_record")
            if not rows or isinstance(error, StorageUnavailable | MissingRow):
                raise
            log.error("the request record was refused (%s); its %d messages were stored without it", error, len(rows))
            return error
        return added

    def batch(self, conn: sa.Connection, items: list[RecordItem]) -> list[int]:
        """The deferred writes ``(session_pk, message rows, request values, now)`` on the driver,
        as each would run alone (bump, messages, request), with a bump per session (to the latest
        ``now``: the bump keeps the later time anyway) and the request rows in one
        ``executemany``. The messages stay an ``executemany`` per item: its row count is the
        item's result."""
        latest: dict[int, datetime] = {}
        for session_pk, rows, _, now in items:
            if rows and (session_pk not in latest or now > latest[session_pk]):
                latest[session_pk] = now
        if latest:
            self._bump.executemany(conn, [{"b_pk": pk, "b_now": now} for pk, now in latest.items()])
        added: list[int] = []
        request_rows: list[list[Any]] = []
        for _, rows, values, _ in items:
            added.append(self._insert_messages.executemany(conn, rows) if rows else 0)
            request_rows.append(self._insert_request.row(values))  # now: its time converts once (the memo)
        self._insert_request.executemany_rows(conn, request_rows)
        return added
