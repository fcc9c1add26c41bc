"""The SQLite end-of-request write converts its rows at the commit (``storage.sqlite.end_write``):
nothing is converted when a write is queued, and a write whose values cannot be converted fails
alone, with what converting raised, nothing of it stored, while the other writes of its batch
commit: in the batch's one transaction, and when the batch is retried write by write."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import pytest

from storage.migrate import upgrade
from storage.records import NewMessage, RequestRecord
from storage.sqlite.end_write import SqliteEndWrite
from storage.store import Store
from tests.storage.test_store import T0, chain, conversation


def _record(request_id: str, session_pk: int) -> RequestRecord:
    return RequestRecord(id=request_id, session_pk=session_pk, model="m", status=200, latency_ms=1.0, stream=False,
                         usage=None, added_messages=0, first_added_seq=None, tokens_client=None, tokens_forwarded=None,
                         defenses=[], event_ids=[], error=None, finish_reason="stop")


def _queue(store: Store, sessions: list[int]) -> list[asyncio.Future[int]]:
    """Three writes queued in one loop step (one batch): a good one on ``sessions[0]``, one whose
    reply no JSON writer takes (a ``set``) on ``sessions[1]``, one whose message row a column type
    refuses (``internal`` neither bool nor 0/1) on ``sessions[2]``."""
    good = chain(conversation(3, "good"))
    unserializable = chain(conversation(2, "reply"))
    unserializable.append(NewMessage("f" * 64, unserializable[-1].chain_hash, 2, "assistant",
                                     {"role": "assistant", "content": {"a set"}}))
    refused = [NewMessage(m.chain_hash, m.parent_hash, m.seq, m.role, m.message, internal=2)  # type: ignore[arg-type]
               for m in chain(conversation(2, "bool"))]
    return [store.append_and_record(pk, rows, _record(f"req_{name}", pk), T0, client_rows=len(rows) - 1)
            for pk, rows, name in zip(sessions, (good, unserializable, refused), ("good", "set", "bool"), strict=True)]


def _stored(path: Any) -> tuple[list[tuple[str, int, int | None]], list[int]]:
    """The request rows stored (id and message counts) and the session of every message row,
    seen by another connection."""
    other = sqlite3.connect(path)
    try:
        requests = list(other.execute("SELECT id, added_messages, first_added_seq FROM requests ORDER BY id"))
        messages = [r[0] for r in other.execute("SELECT session_pk FROM messages")]
    finally:
        other.close()
    return requests, messages


async def _check(writes: list[asyncio.Future[int]], path: Any, good_pk: int) -> None:
    good, unserializable, refused = await asyncio.gather(*writes, return_exceptions=True)
    assert good == 3
    assert isinstance(unserializable, TypeError) and "not JSON serializable" in str(unserializable)
    assert isinstance(refused, ValueError)
    requests, messages = _stored(path)
    assert requests == [("req_good", 2, 0)]  # the client's two rows counted (the third is the reply)
    assert messages == [good_pk] * 3  # nothing of the failed writes


async def _open(path: Any) -> tuple[Store, list[int]]:
    url = f"sqlite:///{path}"
    await upgrade(url)
    store = await Store.open(url)
    assert store._end_write is not None and store._sqlite is not None
    return store, [(await store.get_or_create_session("t", name, T0)).pk for name in ("good", "set", "bool")]


async def test_rows_are_converted_at_the_commit_and_a_write_that_cannot_be_fails_alone(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Queued, no write is converted (the client's next request arrives meanwhile); at the commit
    all three are, in one batch call: the two that cannot be fail, each with its own error, and
    nothing of them is stored; the good one commits in that same transaction."""
    item, batch = SqliteEndWrite.item, SqliteEndWrite.batch
    converted: list[int] = []
    batches: list[int] = []

    def counting_item(self: SqliteEndWrite, session_pk: int, *rest: Any) -> Any:
        converted.append(session_pk)
        return item(self, session_pk, *rest)

    def counting_batch(self: SqliteEndWrite, driver: Any, writes: list[Any]) -> Any:
        batches.append(len(writes))
        return batch(self, driver, writes)

    monkeypatch.setattr(SqliteEndWrite, "item", counting_item)
    monkeypatch.setattr(SqliteEndWrite, "batch", counting_batch)
    store, sessions = await _open(tmp_path / "convert.db")
    try:
        writes = _queue(store, sessions)
        assert converted == [] and not any(w.done() for w in writes)  # queued as given
        assert store._sqlite is not None
        store._sqlite.batch.flush()  # the commit: every write settled by it, none left to a retry
        assert all(w.done() for w in writes) and not store._sqlite.batch._retrying
        await _check(writes, tmp_path / "convert.db", sessions[0])
        assert set(converted) == set(sessions) and batches == [3]  # at the commit, in one batch
    finally:
        await store.close()


async def test_a_write_that_cannot_be_converted_fails_alone_when_the_batch_is_retried(tmp_path: Any) -> None:
    """The batch finds the database locked: each write is retried alone (``SqliteEndWrite._alone``),
    converted then; the two that cannot be fail with their own errors, nothing of them stored, and
    the good one commits once the lock is gone."""
    store, sessions = await _open(tmp_path / "retried.db")
    try:
        lock = sqlite3.connect(tmp_path / "retried.db", isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        writes = _queue(store, sessions)
        assert not any(w.done() for w in writes)  # queued as given: nothing converted, nothing failed yet
        assert store._sqlite is not None
        store._sqlite.batch.flush()  # locked: the batch goes to a retry task, write by write
        assert len(store._sqlite.batch._retrying) == 1
        assert not any(w.done() for w in writes)  # the batch's transaction undone: each is settled by its retry
        await asyncio.sleep(0.2)
        lock.execute("ROLLBACK")
        lock.close()
        await _check(writes, tmp_path / "retried.db", sessions[0])
    finally:
        await store.close()
