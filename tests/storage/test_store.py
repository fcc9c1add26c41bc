"""Write side of the Store (storage/store.py) on SQLite and PostgreSQL: sessions, the log,
events, artifacts, requests, learned limits, errors."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
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
