"""The end-of-request write on a SQLite file: deferred in the file's batch, run on the driver.

``Store.append_and_record`` hands a small write here (``storage.sqlite.file.small_rows``): it
goes to the file's ``DeferredBatch`` as given and is committed with the other writes queued within
``storage.sqlite.batch.DEFER_WRITE_S``, by ``DriverStatement``s (the same SQL and column types
as the SQLAlchemy path, ``storage.rows``, without its per-execution work). Its rows are converted
at the commit, the batch's together (``SqliteEndWrite.batch``), not when queued: at one request a
time the write is queued right after the answer, while the client's next request arrives, and
only the commit needs them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from storage.errors import FOREIGN_ERRORS, MissingRow, StorageUnavailable, translate_error
from storage.records import NewMessage, RequestRecord
from storage.rows import MESSAGE_ROW_KEYS, REQUEST_ROW_KEYS, added_counts, client_seqs, request_tuple
from storage.sqlite.driver import DriverStatement
from storage.sqlite.file import SqliteFile

log = logging.getLogger("context_proxy.storage")

_Write = tuple[int, Sequence[NewMessage], RequestRecord, datetime, int | None]
"""A queued write, as ``defer`` got it: ``(session_pk, new_messages, record, now, client_rows)``."""
_Item = tuple[int, list[list[Any]], list[Any], datetime, tuple[int, ...] | None]
"""A write converted (``item``): ``(session_pk, message rows, request row, now, client_seqs)``,
rows as the driver takes them (``client_seqs``: ``storage.rows.record_item``'s)."""


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

    def defer(self, session_pk: int, new_messages: Sequence[NewMessage], record: RequestRecord, now: datetime,
              client_rows: int | None) -> asyncio.Future[int]:
        """Queue the write of ``Store.append_and_record``'s arguments: its future gets how many
        of its messages were new once committed, or the error (``MissingRow``: the session is
        gone, nothing stored; another ``StorageError``: the request row was refused, its
        messages stored; what converting a value raised, say a reply orjson cannot serialize:
        nothing of it stored, the batch's other writes committed). The arguments are kept as
        given and converted at the commit (``batch``, ``_alone``): the caller changes none of
        them once queued (the next ``DEFER_WRITE_S`` at most). Must be called on the event
        loop's thread."""
        write: _Write = (session_pk, new_messages, record, now, client_rows)
        future: asyncio.Future[int] = self._batch.defer("append_and_record", functools.partial(self._alone, write),
                                                        batch=self.batch, item=write)
        return future

    def item(self, session_pk: int, new_messages: Sequence[NewMessage], record: RequestRecord, now: datetime,
             client_rows: int | None) -> _Item:
        """The driver's parameters of one write: ``(session_pk, message rows, request row, now,
        client_seqs)``, the same values as ``storage.rows.record_item``'s bound by the column
        types (the request row's message counts the record's until ``_count`` sets them)."""
        message_row = self._insert_messages.row_of
        rows = [message_row((session_pk, m.chain_hash, m.parent_hash, m.seq, m.role, m.message, m.internal, now))
                for m in new_messages]
        return (session_pk, rows, self._insert_request.row_of(request_tuple(record, now)), now,
                client_seqs(new_messages, client_rows))

    def _count(self, item: _Item, inserted: int) -> None:
        """Set ``item``'s request row's ``(added_messages, first_added_seq)`` from the ``inserted``
        of its message rows (``storage.rows.added_counts``), if its ``client_seqs`` ask for it."""
        _, rows, request_row, _, seqs = item
        if seqs is not None:
            added, first = added_counts(seqs, len(rows), inserted)
            self._insert_request.put(request_row, "added_messages", added)
            self._insert_request.put(request_row, "first_added_seq", first)

    def _converted(self, write: _Write) -> _Item | Exception:
        """``item`` of ``write``, or what converting it raised (a value a column type or orjson refuses)."""
        try:
            return self.item(*write)
        except Exception as exc:  # noqa: BLE001  (the write's failure: ``DeferredBatch``'s result)
            return exc

    def _alone(self, write: _Write, conn: sa.Connection) -> int | Exception:
        """One write alone (its batch failed): as ``batch``, except that a refused request row
        does not undo the messages (SQLite undoes only the failed statement): its error is the
        result (``DeferredBatch``: committed, the write failed) and the messages commit. A
        session that is gone still fails the whole write (``MissingRow``). A write that cannot
        be converted runs nothing: what converting raised is the result."""
        item = self._converted(write)
        if isinstance(item, Exception):
            return item
        session_pk, rows, request_row, now, _ = item
        added = 0
        if rows:
            self._bump.execute(conn, {"b_pk": session_pk, "b_now": now})
            added = self._insert_messages.executemany_rows(conn, rows)
        self._count(item, added)
        try:
            self._insert_request.execute_row(conn, request_row)
        except FOREIGN_ERRORS as exc:
            error = translate_error(exc, "append_and_record")
            if not rows or isinstance(error, StorageUnavailable | MissingRow):
                raise
            log.error("the request record was refused (%s); its %d messages were stored without it", error, len(rows))
            return error
        return added

    def batch(self, driver: sqlite3.Connection, writes: list[_Write]) -> list[int | Exception]:
        """The deferred writes on the driver, converted first (``item``, all of them before the
        first statement): a write that cannot be converted gets what converting it raised as its
        result (``DeferredBatch``: this write failed, nothing of it stored) and the others run
        as ``_insert``. Returns a result per write, in order."""
        convert = self.item
        try:
            items = [convert(pk, new_messages, record, now, client_rows)
                     for pk, new_messages, record, now, client_rows in writes]
        except Exception:  # noqa: BLE001  (a write cannot be converted: each is, on its own)
            pass
        else:
            return list(self._insert(driver, items))
        converted = [self._converted(write) for write in writes]
        items = [item for item in converted if not isinstance(item, Exception)]
        added = iter(self._insert(driver, items) if items else [])
        return [item if isinstance(item, Exception) else next(added) for item in converted]

    def _insert(self, driver: sqlite3.Connection, items: list[_Item]) -> list[int]:
        """The converted writes (``item``) on the driver, as each would run alone (bump,
        messages, request), with a bump per session (to the latest ``now``: the bump keeps the
        later time anyway), the message rows of all in one ``executemany`` and the request rows
        in another. Each item's count is known from the one total when it is all of the rows
        (all new) or none: otherwise (some new, some stored, say a row in two items) that insert
        is undone (to a savepoint) and each item's rows are inserted in turn, in the same
        transaction, counting its own (the counts and times of the writes run one after the other);
        each request row's message counts follow its item's (``_count``)."""
        latest: dict[int, datetime] = {}
        for session_pk, rows, _, now, _ in items:
            if rows and (session_pk not in latest or now > latest[session_pk]):
                latest[session_pk] = now
        added: list[int]
        if latest:
            self._bump.run_on(driver, True, [self._bump.row({"b_pk": pk, "b_now": now}) for pk, now in latest.items()])
            all_rows = [row for _, rows, _, _, _ in items for row in rows]
            driver.execute("SAVEPOINT batch_messages")
            new = self._insert_messages.run_on(driver, True, all_rows)
            if new == len(all_rows):
                added = [len(rows) for _, rows, _, _, _ in items]
            elif new == 0:
                added = [0] * len(items)
            else:  # some new: whose is not known; the one insert undone, each write's counted in order
                driver.execute("ROLLBACK TO batch_messages")
                insert = self._insert_messages.run_on
                added = [insert(driver, True, rows) if rows else 0 for _, rows, _, _, _ in items]
            driver.execute("RELEASE batch_messages")
        else:
            added = [0] * len(items)
        for item, inserted in zip(items, added, strict=True):
            self._count(item, inserted)
        self._insert_request.run_on(driver, True, [request_row for _, _, request_row, _, _ in items])
        return added
