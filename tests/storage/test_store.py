"""Write side of the Store (storage/store.py) on SQLite and PostgreSQL: sessions, the log,
events, artifacts, requests, learned limits, errors."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from proxy.conversation.canonical import digests_and_chain
from storage.errors import StorageError, StorageUnavailable
from storage.records import ArtifactRecord, EventRecord, NewMessage, RequestRecord
from storage.store import Store

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def chain(messages: list[dict[str, Any]]) -> list[NewMessage]:
    """The log entries of ``messages`` as one branch from the root."""
    _, hashes = digests_and_chain(messages)
    return [
        NewMessage(chain_hash=h, parent_hash=hashes[i - 1] if i else None, seq=i, role=m["role"], message=m)
        for i, (h, m) in enumerate(zip(hashes, messages, strict=True))
    ]


def conversation(n: int, tag: str = "") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for i in range(1, n):
        out.append({"role": "user" if i % 2 else "assistant", "content": f"turn {i}{tag}"})
    return out


async def test_get_or_create_session_is_idempotent_and_bumps_updated_at(store: Store) -> None:
    first = await store.get_or_create_session("tenant-a", "s1", T0)
    again = await store.get_or_create_session("tenant-a", "s1", T0 + timedelta(seconds=5))
    assert again.pk == first.pk
    assert again.created_at == T0 and again.created_at.tzinfo is not None
    assert again.updated_at == T0 + timedelta(seconds=5)
    older = await store.get_or_create_session("tenant-a", "s1", T0)  # a late, older clock
    assert older.updated_at == T0 + timedelta(seconds=5)
    other_tenant = await store.get_or_create_session("tenant-b", "s1", T0)
    assert other_tenant.pk != first.pk


async def test_get_or_create_session_concurrent_calls_return_one_row(store: Store) -> None:
    results = await asyncio.gather(*(store.get_or_create_session("t", "race", T0) for _ in range(10)))
    assert len({r.pk for r in results}) == 1


async def test_append_messages_counts_new_rows_and_never_duplicates(store: Store) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    log = chain(conversation(6))
    assert await store.append_messages(session.pk, log[:4], T0) == 4
    assert await store.append_messages(session.pk, log, T0) == 2
    assert await store.append_messages(session.pk, log, T0) == 0
    assert await store.append_messages(session.pk, [], T0) == 0
    summary = await store.session_summary(session)
    assert summary.message_count == 6
    stored = await store.get_message_by_hash(session.pk, log[3].chain_hash)
    assert stored is not None and stored.message == log[3].message and stored.seq == 3
    assert stored.parent_hash == log[2].chain_hash and stored.internal is False


async def test_append_messages_bumps_session_updated_at(store: Store) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    await store.append_messages(session.pk, chain(conversation(2)), T0 + timedelta(minutes=1))
    found = await store.find_session("s", "t")
    assert found is not None and found.updated_at == T0 + timedelta(minutes=1)


async def test_concurrent_overlapping_appends_store_each_message_once(store: Store) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    log = chain(conversation(40))
    slices = [log[: 10 + 3 * k] for k in range(10)] + [log] * 5
    added = await asyncio.gather(*(store.append_messages(session.pk, s, T0) for s in slices))
    assert sum(added) == 40
    assert (await store.session_summary(session)).message_count == 40


async def test_append_large_batch_crosses_insert_batches(store: Store) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    log = chain(conversation(1_201))
    assert await store.append_messages(session.pk, log, T0) == 1_201
    assert await store.stored_prefix_len(session.pk, [m.chain_hash for m in log]) == 1_201


async def test_stored_prefix_len_finds_the_stored_prefix(store: Store) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    log = chain(conversation(300))
    hashes = [m.chain_hash for m in log]
    assert await store.stored_prefix_len(session.pk, hashes) == 0
    assert await store.stored_prefix_len(session.pk, []) == 0
    for stored in (1, 2, 150, 236, 237, 238, 290, 299, 300):
        await store.append_messages(session.pk, log[:stored], T0)
        assert await store.stored_prefix_len(session.pk, hashes) == stored
        assert await store.stored_prefix_len(session.pk, hashes[:stored]) == stored
    # a history that diverges after message 100 (an edit): only its first 100 are stored
    edited = conversation(300)
    edited[100] = {"role": "user", "content": "edited"}
    _, edited_hashes = digests_and_chain(edited)
    assert await store.stored_prefix_len(session.pk, edited_hashes) == 100
    # prefixes are per session
    other = await store.get_or_create_session("t", "other", T0)
    assert await store.stored_prefix_len(other.pk, hashes) == 0


async def test_append_to_unknown_session_raises_storage_error(store: Store) -> None:
    with pytest.raises(StorageError) as caught:
        await store.append_messages(987_654, chain(conversation(2)), T0)
    assert not isinstance(caught.value, StorageUnavailable)
    assert caught.value.__cause__ is not None


def _event(session_pk: int, event_id: str, anchor: str = "a" * 64, kind: str = "summary") -> EventRecord:
    return EventRecord(
        id=event_id,
        session_pk=session_pk,
        kind=kind,
        anchor_hash=anchor,
        payload={"summary": f"by {event_id}", "n": [1, 2.5, None]},
        tokens_before=30_000,
        tokens_after=4_000,
        created_at=T0,
    )


async def test_add_event_is_unique_per_kind_and_anchor_under_concurrency(store: Store) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    racing = [_event(session.pk, f"evt_{i:024x}") for i in range(8)]
    stored = await asyncio.gather(*(store.add_event(e) for e in racing))
    assert len({e.id for e in stored}) == 1
    winner = stored[0]
    assert winner.payload == {"summary": f"by {winner.id}", "n": [1, 2.5, None]}
    other_kind = await store.add_event(_event(session.pk, "evt_offload", kind="offload"))
    later = await store.add_event(_event(session.pk, "evt_later", anchor="b" * 64))
    events = await store.list_events(session.pk)
    assert [e.id for e in events] == sorted([winner.id, other_kind.id, later.id])  # same created_at: by id
    assert events[0].created_at == T0


async def test_add_event_with_a_taken_id_raises(store: Store) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    await store.add_event(_event(session.pk, "evt_same"))
    with pytest.raises(StorageError):
        await store.add_event(_event(session.pk, "evt_same", anchor="c" * 64))


async def test_list_events_in_creation_order(store: Store) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    for i, event_id in enumerate(["evt_z", "evt_a", "evt_m"]):
        event = _event(session.pk, event_id, anchor=str(i) * 64)
        await store.add_event(dataclasses.replace(event, created_at=T0 + timedelta(seconds=i)))
    assert [e.id for e in await store.list_events(session.pk)] == ["evt_z", "evt_a", "evt_m"]
    assert await store.list_events(session.pk + 1) == []


async def test_artifacts_are_idempotent_and_tenant_scoped(store: Store) -> None:
    session = await store.get_or_create_session("tenant-a", "s", T0)
    content = "line 1\nline 2\n" + "x" * 100_000
    artifact = ArtifactRecord(
        id="art_" + "1" * 24,
        tenant="tenant-a",
        session_pk=session.pk,
        media_type="text/plain",
        content=content,
        size_bytes=len(content.encode()),
        line_count=3,
        created_at=T0,
    )
    await store.put_artifacts([artifact])
    await asyncio.gather(store.put_artifacts([artifact]), store.put_artifacts([artifact]))
    await store.put_artifacts([])
    assert await store.get_artifact(artifact.id, "tenant-a") == artifact
    assert await store.get_artifact(artifact.id, None) == artifact  # admin
    assert await store.get_artifact(artifact.id, "tenant-b") is None
    assert await store.get_artifact("art_missing", None) is None


async def test_add_request_feeds_the_session_summary(store: Store) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    for i, model in enumerate(["gpt-4o", "gpt-4o-mini"]):
        await store.add_request(
            RequestRecord(
                id=f"req_{i}",
                session_pk=session.pk,
                model=model,
                status=200,
                latency_ms=12.5,
                stream=bool(i),
                usage={"prompt_tokens": 10, "completion_tokens": 2},
                added_messages=2,
                first_added_seq=0,
                tokens_client=100 * (i + 1),
                tokens_forwarded=50,
                defenses=["offload"],
                event_ids=["evt_1"],
                created_at=T0 + timedelta(seconds=i),
            )
        )
    await store.add_request(
        RequestRecord(
            id="req_err",
            session_pk=session.pk,
            model=None,
            status=502,
            latency_ms=1.0,
            stream=False,
            usage=None,
            added_messages=0,
            first_added_seq=None,
            tokens_client=None,
            tokens_forwarded=None,
            error="upstream unreachable",
        )
    )
    summary = await store.session_summary(session)
    assert summary.request_count == 3
    assert summary.tokens_client_total == 300
    assert summary.tokens_forwarded_total == 100
    assert summary.last_model == "gpt-4o-mini"
    with pytest.raises(StorageError):  # same id twice
        await store.add_request(
            RequestRecord(
                id="req_err", session_pk=session.pk, model=None, status=500, latency_ms=1.0, stream=False,
                usage=None, added_messages=0, first_added_seq=None, tokens_client=None, tokens_forwarded=None,
            )
        )


async def test_naive_datetimes_are_refused(store: Store) -> None:
    with pytest.raises((StorageError, ValueError)):
        await store.get_or_create_session("t", "s", datetime(2025, 1, 1))


async def test_ping(store: Store) -> None:
    assert await store.ping() is True


@pytest.mark.parametrize(
    "dead_url",
    ["postgresql://nobody@127.0.0.1:1/none", "sqlite:////proc/no/such/dir/db.sqlite"],
)
async def test_dead_database_pings_false_and_raises_unavailable(dead_url: str) -> None:
    dead = await Store.open(dead_url)
    try:
        assert await dead.ping(timeout_s=5) is False
        with pytest.raises(StorageUnavailable):
            await dead.get_or_create_session("t", "s", T0)
    finally:
        await dead.close()
        # aiosqlite 0.22 does not await its worker's stop after a failed connect; let the worker
        # answer before the test's event loop closes (else it raises in its thread).
        await asyncio.sleep(0.2)


async def test_unmigrated_database_raises_storage_error(tmp_path: Any) -> None:
    empty = await Store.open(f"sqlite:///{tmp_path}/empty.db")
    try:
        with pytest.raises(StorageError) as caught:
            await empty.get_learned_limit("t", "u", "m")
        assert not isinstance(caught.value, StorageUnavailable), repr(caught.value.__cause__)
    finally:
        await empty.close()


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
    thread every ``CHECKPOINT_EVERY_WRITES``, so the WAL file stops growing under continuous writes."""
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
        # each checkpoint lets the WAL be rewritten from its start: it stops growing (a checkpoint
        # that could not finish at once, on a loaded machine, lets it grow by a round or two);
        # without checkpoints it grows by a round's worth every round (10x here)
        assert sizes[-1] <= sizes[1] * 5, sizes
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


async def test_compaction_locks_leave_connections_for_requests(database_url: str) -> None:
    """Many sessions compacting at once (each lock holds a connection for a summary's seconds)
    never take the whole pool: a request's read still gets a connection at once."""
    store = await Store.open(database_url, pool_size=2)  # 2 + 2 overflow connections; 1 lock slot
    try:
        sessions = [await store.get_or_create_session("t", f"compacting-{i}", T0) for i in range(5)]
        entered = asyncio.Event()

        async def compacting(pk: int) -> None:
            async with store.compaction_lock(pk) as acquired:
                assert acquired
                entered.set()
                await asyncio.sleep(1.5)  # a summary call

        holders = [asyncio.create_task(compacting(s.pk)) for s in sessions]
        await asyncio.wait_for(entered.wait(), 5)
        await asyncio.sleep(0.2)  # every compaction that can take a connection has
        t0 = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(store.list_events(sessions[0].pk), 10) == []
        assert asyncio.get_running_loop().time() - t0 < 1.0, "the read waited for a compaction's connection"
        await asyncio.gather(*holders)
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
