"""The Store's writes on a SQLite file (storage/sqlite): inline writes and a locked database, WAL
checkpoints, the deferred end-of-request batch (read back at once, failing alone, messages
inserted at once, committed on its own), driver statements against SQLAlchemy's rows, a failed
rollback. Split from ``test_store.py`` (its helpers: ``chain``, ``conversation``, ``T0``)."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta, timezone
from typing import Any

import pytest

from storage.errors import StorageError
from storage.records import RequestRecord
from storage.store import Store
from tests.storage.test_store import T0, chain, conversation


async def _max_loop_gap_s(stop: asyncio.Event) -> float:
    """Tick every 10 ms until ``stop``; the longest gap between ticks (a stalled event loop shows)."""
    loop = asyncio.get_running_loop()
    last, worst = loop.time(), 0.0
    while not stop.is_set():
        await asyncio.sleep(0.01)
        now = loop.time()
        worst, last = max(worst, now - last), now
    return worst


async def test_sqlite_write_waits_for_a_locked_database_without_stalling_the_event_loop(tmp_path: Any) -> None:
    """Another connection holds SQLite's write lock (e.g. the retention command): a write neither
    fails nor blocks the event loop (small writes run on the loop's thread only when they need
    not wait); it completes once the lock is released."""
    import sqlite3

    from storage.migrate import upgrade

    url = f"sqlite:///{tmp_path}/locked.db"
    await upgrade(url)
    store = await Store.open(url)
    try:
        session = await store.get_or_create_session("t", "s", T0)
        other = sqlite3.connect(tmp_path / "locked.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # holds the write lock
        stop = asyncio.Event()
        ticker = asyncio.create_task(_max_loop_gap_s(stop))
        append = asyncio.create_task(store.append_messages(session.pk, chain(conversation(3)), T0))
        await asyncio.sleep(0.5)
        assert not append.done(), "the write should wait for the lock"
        other.execute("COMMIT")
        other.close()
        assert await asyncio.wait_for(append, 10) == 3
        stop.set()
        assert await ticker < 0.2, "the event loop stalled while the write waited"
        assert await store.stored_prefix_len(session.pk, [m.chain_hash for m in chain(conversation(3))]) == 3
    finally:
        await store.close()


async def test_sqlite_inline_writes_checkpoint_the_wal(tmp_path: Any) -> None:
    """Writes on the loop's thread never checkpoint themselves; the store checkpoints on its writer
    thread every ``CHECKPOINT_EVERY_WRITES``, and the writes that come meanwhile queue behind it, so
    under continuous writes the WAL is rewritten from its start after each checkpoint: it never
    grows past a round of writes. (Before: the checkpoint raced the loop's writes for the lock,
    finished a round or more late, or not at all, and the WAL grew by rounds: 5 MB, then 8-22 MB.)"""
    from storage.migrate import upgrade
    from storage.sqlite import file as store_module

    url = f"sqlite:///{tmp_path}/wal.db"
    await upgrade(url)
    store = await Store.open(url)
    wal = tmp_path / "wal.db-wal"
    try:
        session = await store.get_or_create_session("t", "s", T0)
        sizes = []
        for round_ in range(10):
            for i in range(store_module.CHECKPOINT_EVERY_WRITES):
                text = f"round {round_} message {i} " + "x" * 2000
                await store.append_messages(session.pk, chain([{"role": "user", "content": text}]), T0)
            sizes.append(wal.stat().st_size)  # no idle moment: writes go on while it checkpoints
        # without checkpoints it grows by a round's worth every round (10x here)
        assert max(sizes) <= sizes[0] * 1.5, sizes
    finally:
        await store.close()


async def test_a_checkpoint_a_reader_keeps_busy_is_logged_and_writes_go_on(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A reader holding an old snapshot (a backup, a long read) keeps every try of a checkpoint
    busy: the store says so in a warning (it used to give up silently, the WAL growing without a
    sign), writes go on meanwhile, and once the reader is gone the next checkpoint resets the WAL."""
    import logging
    import sqlite3

    from storage.migrate import upgrade
    from storage.sqlite import file as store_module

    monkeypatch.setattr(store_module, "CHECKPOINT_EVERY_WRITES", 20)
    monkeypatch.setattr(store_module, "CHECKPOINT_BUSY_TIMEOUT_MS", 10)
    url = f"sqlite:///{tmp_path}/busy.db"
    await upgrade(url)
    store = await Store.open(url)
    wal = tmp_path / "busy.db-wal"

    async def write_round(tag: str) -> None:
        for i in range(20):
            text = f"{tag} {i} " + "x" * 2000
            await store.append_messages(session.pk, chain([{"role": "user", "content": text}]), T0)
        await asyncio.sleep(0.3)  # the checkpoint the round's last write queued: done (5 tries of 10 ms)
    try:
        session = await store.get_or_create_session("t", "s", T0)
        await write_round("first")
        reader = sqlite3.connect(tmp_path / "busy.db", isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM messages").fetchone()  # a snapshot of the WAL as it is now
        with caplog.at_level(logging.WARNING, logger="context_proxy.storage"):
            await write_round("held")
            assert any("WAL checkpoint busy" in r.getMessage() for r in caplog.records), caplog.records
            reader.execute("COMMIT")
            reader.close()
            caplog.clear()
            sizes = []
            for tag in ("after", "again", "more"):  # the WAL grew by a round before the reset
                await write_round(tag)
                sizes.append(wal.stat().st_size)
        assert sizes[2] == sizes[1] == sizes[0], sizes  # then it is rewritten from its start
        assert not [r for r in caplog.records if "WAL checkpoint" in r.getMessage()]
        assert await store.session_summary(session) is not None
    finally:
        await store.close()


def _record(request_id: str, session_pk: int) -> RequestRecord:
    return RequestRecord(id=request_id, session_pk=session_pk, model="m", status=200, latency_ms=1.0, stream=False,
                         usage=None, added_messages=0, first_added_seq=None, tokens_client=None, tokens_forwarded=None,
                         defenses=[], event_ids=[], error=None, finish_reason="stop")


async def test_end_of_request_writes_are_read_back_at_once_and_fail_alone(store: Store, database_url: str) -> None:
    """``append_and_record`` may be deferred and batched (SQLite): a read issued while it is
    queued still sees it, and a refused write in a batch fails alone."""
    session = await store.get_or_create_session("t", "deferred", T0)
    log = chain(conversation(4))
    first = store.append_and_record(session.pk, log[:2], _record("req_a", session.pk), T0)  # started: a future
    if database_url.startswith("sqlite"):  # (PostgreSQL writes at once, concurrently with the read)
        await asyncio.sleep(0)  # queued, not committed yet
        assert await store.stored_prefix_len(session.pk, [m.chain_hash for m in log]) == 2
    assert await first == 2
    good = store.append_and_record(session.pk, log, _record("req_b", session.pk), T0)
    taken = store.append_and_record(session.pk, log, _record("req_a", session.pk), T0)
    assert await good == 2
    with pytest.raises(StorageError):
        await taken  # the request id is taken: this write alone is refused
    assert await store.stored_prefix_len(session.pk, [m.chain_hash for m in log]) == 4
    summary = await store.session_summary(session)
    assert summary.request_count == 2


async def test_end_of_request_writes_queued_together_each_count_their_own(store: Store, database_url: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Several end-of-request writes queued at once (SQLite commits them in one batch call, with
    one bump per session): each returns its own new messages, every request row is stored, and
    each session's ``updated_at`` is the latest of its writes, wherever that write is queued."""
    a = await store.get_or_create_session("t", "batch-a", T0)
    b = await store.get_or_create_session("t", "batch-b", T0)
    log_a, log_b = chain(conversation(4, "a")), chain(conversation(4, "b"))
    assert await store.append_messages(a.pk, log_a[:1], T0) == 1
    writes = [  # (session, messages, when); disjoint messages: the counts hold in any order (PostgreSQL)
        (a, log_a[1:3], T0 + timedelta(minutes=2)),
        (b, log_b[:3], T0 + timedelta(minutes=1)),
        (a, log_a[3:], T0 + timedelta(minutes=3)),  # session a's latest, in the middle
        (b, [], T0 + timedelta(minutes=9)),  # no messages: no bump
        (a, log_a[:1], T0 + timedelta(minutes=1)),  # stored already
    ]
    from storage.sqlite.end_write import SqliteEndWrite

    batches: list[int] = []
    if store._end_write is not None:  # SQLite: count the batch calls
        batch = SqliteEndWrite.batch

        def counting(self: SqliteEndWrite, conn: Any, items: list[Any]) -> list[int]:
            batches.append(len(items))
            return batch(self, conn, items)

        monkeypatch.setattr(SqliteEndWrite, "batch", counting)  # a bound method anew at each access, as unpatched
    added = await asyncio.gather(*(store.append_and_record(s.pk, m, _record(f"req_batch_{i}", s.pk), when)
                                   for i, (s, m, when) in enumerate(writes)))
    assert added == [2, 3, 1, 0, 0]
    assert batches == ([5] if store._end_write is not None else [])
    for session, requests, updated in ((a, 3, T0 + timedelta(minutes=3)), (b, 2, T0 + timedelta(minutes=1))):
        summary = await store.session_summary(session)
        assert summary.request_count == requests
        found = await store.find_session(session.session_id, "t")
        assert found is not None and found.updated_at == updated
    if store._end_write is not None:  # one batch whose writes share messages: each counts what it added, in order
        added = await asyncio.gather(store.append_and_record(b.pk, log_b, _record("req_batch_5", b.pk), T0),
                                     store.append_and_record(b.pk, log_b, _record("req_batch_6", b.pk), T0))
        assert added == [1, 0] and batches == [5, 2]


async def test_a_batch_inserts_its_messages_at_once_unless_only_some_are_new(tmp_path: Any,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's deferred batch inserts the message rows of all its writes in one statement when
    each write's count follows from the total (all rows new, or none): the counts are those of
    the writes run alone. When only some rows are new (whose is not known) that insert is undone
    and each write's rows are inserted in turn in the same transaction, counting its own (no write
    retried alone: one commit); a batch after ``dispose`` (a new connection) commits as well."""
    from storage.migrate import upgrade
    from storage.sqlite.driver import DriverStatement
    from storage.sqlite.end_write import SqliteEndWrite

    url = f"sqlite:///{tmp_path}/batch.db"
    await upgrade(url)
    store = await Store.open(url)
    assert store._end_write is not None and store._sqlite is not None
    inserts: list[int] = []
    alone: list[int] = []
    run_on, by_itself = DriverStatement.run_on, SqliteEndWrite._alone
    message_sql = store._end_write._insert_messages.sql

    def counting(self: DriverStatement, driver: Any, many: bool, params: list[list[Any]]) -> int:
        if self.sql == message_sql:
            inserts.append(len(params))
        return run_on(self, driver, many, params)

    def counting_alone(self: SqliteEndWrite, item: Any, conn: Any) -> Any:
        alone.append(len(item[1]))
        return by_itself(self, item, conn)

    monkeypatch.setattr(DriverStatement, "run_on", counting)
    monkeypatch.setattr(SqliteEndWrite, "_alone", counting_alone)
    try:
        a = await store.get_or_create_session("t", "a", T0)
        b = await store.get_or_create_session("t", "b", T0)
        log_a, log_b = chain(conversation(4, "a")), chain(conversation(4, "b"))
        writes = [(a, log_a[:2]), (b, log_b[:3]), (a, log_a[2:3]), (b, [])]

        async def batch(name: str) -> list[int]:
            return await asyncio.gather(*(store.append_and_record(s.pk, m, _record(f"{name}_{i}", s.pk), T0)
                                          for i, (s, m) in enumerate(writes)))

        assert await batch("req_new") == [2, 3, 1, 0] and inserts == [6] and alone == []  # all new: one insert
        assert await batch("req_again") == [0, 0, 0, 0] and inserts == [6, 6] and alone == []  # none new
        store._sqlite.dispose()
        writes = [(a, log_a), (b, log_b[:3]), (a, log_a[3:])]  # a's last message new, in two writes
        assert await batch("req_mixed") == [1, 0, 0]  # each in turn: in order, the first adds it
        assert inserts == [6, 6, 8, 4, 3, 1] and alone == []  # (the 8 undone, then an insert each)
        assert (await store.session_summary(a)).request_count == 6
    finally:
        await store.close()


async def test_deferred_writes_commit_without_another_operation(tmp_path: Any) -> None:
    """Nothing else touching the store: the queued end-of-request write is committed within
    milliseconds all the same (seen by another connection)."""
    import sqlite3

    from storage.migrate import upgrade

    url = f"sqlite:///{tmp_path}/deferred.db"
    await upgrade(url)
    store = await Store.open(url)
    try:
        session = await store.get_or_create_session("t", "s", T0)
        await store.append_and_record(session.pk, chain(conversation(3)), _record("req_1", session.pk), T0)
        other = sqlite3.connect(tmp_path / "deferred.db")
        assert other.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 3
        assert other.execute("SELECT COUNT(*) FROM requests").fetchone()[0] == 1
        other.close()
    finally:
        await store.close()


async def test_queued_writes_are_told_exactly_once_even_when_their_retries_are_cancelled(tmp_path: Any) -> None:
    """``append_and_record`` on SQLite (queued): a batch that finds the database locked is retried
    write by write; if the proxy stops first (the retry task cancelled before it ran), each write's
    future fails; with the lock gone, a queued write's future gets its count."""
    import sqlite3

    from storage.migrate import upgrade

    url = f"sqlite:///{tmp_path}/told.db"
    await upgrade(url)
    store = await Store.open(url)
    try:
        session = await store.get_or_create_session("t", "s", T0)
        log = chain(conversation(2))
        lock = sqlite3.connect(tmp_path / "told.db", isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        writes = [store.append_and_record(session.pk, log, _record(name, session.pk), T0) for name in ("req_a", "req_b")]
        assert store._sqlite is not None
        store._sqlite.batch.flush()  # locked: the batch goes to a retry task
        (retry,) = store._sqlite.batch._retrying
        retry.cancel()
        await asyncio.sleep(0.05)
        lock.execute("ROLLBACK")
        lock.close()
        assert all(w.done() for w in writes)
        assert all(isinstance(w.exception(), StorageError) and "stopped" in str(w.exception()) for w in writes)
        queued = store.append_and_record(session.pk, log, _record("req_c", session.pk), T0)
        await asyncio.sleep(0.1)  # committed within DEFER_WRITE_S, nothing else touching the store
        assert queued.done() and queued.result() == len(log)
    finally:
        await store.close()


async def test_driver_statements_write_the_same_rows_as_sqlalchemy(tmp_path: Any) -> None:
    """On a SQLite file the end-of-request write runs on the driver (``DriverStatement``): its
    rows are byte for byte those of the SQLAlchemy path (hashes as bytes, JSON packed or not,
    times as text), it counts only new rows, and it is read back like any other."""
    import sqlite3

    from storage.migrate import upgrade

    url = f"sqlite:///{tmp_path}/driver.db"
    await upgrade(url)
    store = await Store.open(url)
    assert store._end_write is not None  # the path under test
    messages = conversation(3) + [{"role": "user", "content": "ünïcode ✓ " + "long and compressible " * 20},
                                  {"role": "assistant", "content": None, "tool_calls": [
                                      {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
    log = chain(messages)
    record = dataclasses.replace(_record("req_x", 0), usage={"prompt_tokens": 7, "total_tokens": 9},
                                 defenses=["offload"], event_ids=["evt_1"], error="partial ✓", tokens_client=12)
    # microseconds, and another zone: both paths store UTC wall time as the same text
    later = (T0 + timedelta(seconds=1, microseconds=123456)).astimezone(timezone(timedelta(hours=2)))
    try:
        via_driver = await store.get_or_create_session("t", "driver", T0)
        via_sqlalchemy = await store.get_or_create_session("t", "sqlalchemy", T0)
        assert await store.append_and_record(via_driver.pk, log[:3], dataclasses.replace(record, session_pk=via_driver.pk), T0) == 3
        assert await store.append_and_record(via_driver.pk, log, dataclasses.replace(
            record, id="req_y", session_pk=via_driver.pk), later) == 2  # only the new ones
        assert await store.append_messages(via_sqlalchemy.pk, log[:3], T0) == 3
        await store.add_request(dataclasses.replace(record, session_pk=via_sqlalchemy.pk, id="req_z", created_at=T0))
        assert await store.append_messages(via_sqlalchemy.pk, log, later) == 2
        await store.add_request(dataclasses.replace(record, session_pk=via_sqlalchemy.pk, id="req_w", created_at=later))
        assert await store.stored_prefix_len(via_driver.pk, [m.chain_hash for m in log]) == len(log)
    finally:
        await store.close()
    db = sqlite3.connect(tmp_path / "driver.db")
    try:
        def rows(table: str, pk: int, columns: str) -> list[tuple[Any, ...]]:
            return db.execute(f"SELECT {columns} FROM {table} WHERE session_pk = ? ORDER BY rowid", (pk,)).fetchall()

        cols = "chain_hash, parent_hash, seq, role, message, internal, created_at"
        assert rows("messages", via_driver.pk, cols) == rows("messages", via_sqlalchemy.pk, cols)
        assert any(isinstance(r[4], bytes) for r in rows("messages", via_driver.pk, cols))  # packed
        cols = ("model, status, latency_ms, stream, usage, added_messages, first_added_seq, tokens_client, "
                "tokens_forwarded, defenses, event_ids, error, finish_reason, created_at")
        assert rows("requests", via_driver.pk, cols) == rows("requests", via_sqlalchemy.pk, cols)
        updated = db.execute("SELECT updated_at FROM sessions WHERE pk IN (?, ?)", (via_driver.pk, via_sqlalchemy.pk)).fetchall()
        assert updated[0] == updated[1] and updated[0][0].endswith(".123456")
        assert db.execute("SELECT updated_at FROM sessions WHERE pk = ?", (via_driver.pk,)).fetchone() == \
            db.execute("SELECT updated_at FROM sessions WHERE pk = ?", (via_sqlalchemy.pk,)).fetchone()
    finally:
        db.close()


async def test_inline_transactions_see_other_writers_and_survive_a_locked_database(tmp_path: Any) -> None:
    """On a SQLite file, an inline transaction sees what other connections committed before it, and
    a write that finds the database locked waits on the writer thread and lands, after which
    inline transactions work as before."""
    import asyncio
    import sqlite3

    from storage.migrate import upgrade

    url = f"sqlite:///{tmp_path}/inline.db"
    await upgrade(url)
    ours, theirs = await Store.open(url), await Store.open(url)
    log = chain(conversation(4))
    try:
        session = await ours.get_or_create_session("t", "inline", T0)
        assert await ours.stored_prefix_len(session.pk, [m.chain_hash for m in log]) == 0
        assert await theirs.append_messages(session.pk, log[:2], T0) == 2  # another connection commits
        assert await ours.stored_prefix_len(session.pk, [m.chain_hash for m in log]) == 2  # seen at once

        locker = sqlite3.connect(tmp_path / "inline.db", isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")  # holds the write lock
        write = asyncio.create_task(ours.append_messages(session.pk, log[:3], T0))
        await asyncio.sleep(0.3)
        assert not write.done()  # locked: waiting on the writer thread, not failed
        locker.execute("COMMIT")
        locker.close()
        assert await asyncio.wait_for(write, 10) == 1

        assert await theirs.append_messages(session.pk, log, T0) == 1
        assert await ours.stored_prefix_len(session.pk, [m.chain_hash for m in log]) == 4
        assert await ours.append_messages(session.pk, log, T0) == 0  # inline again, nothing new
    finally:
        await ours.close()
        await theirs.close()


async def test_a_batch_whose_rollback_fails_leaves_nothing_for_the_next_transaction(tmp_path: Any) -> None:
    """The commit fails and so does the rollback: the connection, still inside the failed
    transaction, is dropped (its changes undone), not used again: the write retried alone (on a
    new connection) stores its rows once. (Kept, the retry found its own uncommitted request row:
    refused as a duplicate, while the failed batch's rows were committed with the next write.)"""
    import sqlite3

    from storage.migrate import upgrade

    url = f"sqlite:///{tmp_path}/rollback.db"
    await upgrade(url)
    store = await Store.open(url)
    assert store._sqlite is not None
    try:
        session = await store.get_or_create_session("t", "s", T0)
        store._sqlite.commit_driver(lambda driver: None)  # (the driver connection looked up)
        real = store._sqlite._driver

        class Failing:
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def commit(self) -> None:
                raise sqlite3.OperationalError("disk I/O error")

            def rollback(self) -> None:
                raise sqlite3.OperationalError("cannot rollback")

        store._sqlite._driver = Failing()  # type: ignore[assignment]
        failed = store.append_and_record(session.pk, chain(conversation(3, "r")), _record("req_a", session.pk), T0)
        assert await failed == 3  # retried alone, on a new connection
        later = store.append_and_record(session.pk, [], _record("req_b", session.pk), T0)
        assert await later == 0
        summary = await store.session_summary(session)
        assert (summary.message_count, summary.request_count) == (3, 2)
    finally:
        await store.close()


async def test_while_a_checkpoint_is_pending_a_read_sees_the_writes_started_before_it(tmp_path: Any) -> None:
    """A write queued behind a pending checkpoint (on the writer thread) has been started: a read of
    the session started after it sees it (``stored_prefix_len``: "sees every write of the session
    this process started before it"), as when that write runs inline. (Reads run inline at once.)"""
    import sqlite3

    from storage.migrate import upgrade

    url = f"sqlite:///{tmp_path}/order.db"
    await upgrade(url)
    store = await Store.open(url)
    try:
        session = await store.get_or_create_session("t", "s", T0)
        await store.append_messages(session.pk, chain([{"role": "user", "content": "first"}]), T0)
        reader = sqlite3.connect(tmp_path / "order.db", isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM messages").fetchone()  # keeps the checkpoint busy a while
        assert store._sqlite is not None
        store._sqlite._checkpoint()
        log = chain([{"role": "user", "content": "first"}, {"role": "user", "content": "second"}])
        queued = asyncio.create_task(store.append_new_messages(session.pk, log[1:], T0))
        await asyncio.sleep(0)  # started: queued behind the checkpoint
        assert await store.stored_prefix_len(session.pk, [m.chain_hash for m in log]) == 2
        reader.execute("COMMIT")
        reader.close()
        await queued
    finally:
        await store.close()
