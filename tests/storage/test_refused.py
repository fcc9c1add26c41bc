"""``Store.record_refused`` (storage/refused.py) on SQLite and PostgreSQL: a refused request's
record is written with the deletion of what the request created itself, and only that: never rows
it found stored, nor rows another request built on or used."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
import sqlalchemy as sa

from storage.errors import StorageError
from storage.records import ArtifactRecord, EventRecord, RequestRecord
from storage.refused import RequestWrites, track_writes, untrack_writes
from storage.store import Store
from storage.tables import artifacts, events, messages
from tests.storage.test_store import T0, chain, conversation


def _record(session_pk: int, request_id: str, status: int = 403, *, defenses: tuple[str, ...] = (),
            event_ids: tuple[str, ...] = (), at: int = 10) -> RequestRecord:
    return RequestRecord(id=request_id, session_pk=session_pk, model="m", status=status, latency_ms=1.0, stream=False,
                         usage=None, added_messages=0, first_added_seq=None, tokens_client=None, tokens_forwarded=None,
                         defenses=list(defenses),
                         event_ids=list(event_ids), created_at=T0 + timedelta(seconds=at))


def _artifact(session_pk: int, artifact_id: str, tenant: str = "t", at: int = 1) -> ArtifactRecord:
    return ArtifactRecord(id=artifact_id, tenant=tenant, session_pk=session_pk, media_type="text/plain",
                          content=f"content of {artifact_id}", size_bytes=10, line_count=1, created_at=T0 + timedelta(seconds=at))


async def _column(store: Store, column: sa.Column, *where: sa.ColumnElement[bool]) -> set:
    async with store._engine.connect() as conn:
        return set((await conn.execute(sa.select(column).where(*where))).scalars())


async def test_only_the_messages_its_own_append_inserted_go_and_none_another_built_on(store: Store) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    log = chain(conversation(6))
    await store.append_messages(session.pk, log[:2], T0)  # an accepted request's, stored before
    mine = await store.append_new_messages(session.pk, log, T0)  # the refused request's early append
    assert len(mine) == 4
    # another request, meanwhile, replied after the refused one's 4th message (seq 3): it built on 0..3
    fork = chain([*conversation(4), {"role": "assistant", "content": "another request's reply"}])[-1]
    assert fork.parent_hash == log[3].chain_hash
    await store.append_messages(session.pk, [fork], T0)
    assert await store.record_refused(_record(session.pk, "r"), T0, "t", mine, (), ()) == []
    left = await _column(store, messages.c.chain_hash, messages.c.session_pk == session.pk)
    assert left == {m.chain_hash for m in log[:4]} | {fork.chain_hash}  # seq 4 and 5 went, nothing else
    rows, _ = await store.list_requests(session.pk, 10, None)
    assert [r.id for r in rows] == ["r"]


async def test_new_artifacts_and_events_are_tracked_and_only_they_go(store: Store) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    other = await store.get_or_create_session("t2", "s", T0)
    assert await store.put_artifacts([_artifact(session.pk, "old")]) == ["old"]  # stored before
    await store.put_artifacts([_artifact(other.pk, "new", tenant="t2")])  # the same id, another tenant's
    await store.add_event(EventRecord(id="e_old", session_pk=session.pk, kind="summary", anchor_hash="a" * 64,
                                      payload={}, tokens_before=2, tokens_after=1, created_at=T0))
    writes = RequestWrites()
    token = track_writes(writes)
    try:
        assert await store.put_artifacts([_artifact(session.pk, "old"), _artifact(session.pk, "new")]) == ["new"]
        for event_id, anchor in (("e_old2", "a"), ("e_new", "b")):  # the first finds e_old's place taken
            await store.add_event(EventRecord(id=event_id, session_pk=session.pk, kind="summary", anchor_hash=anchor * 64,
                                              payload={}, tokens_before=2, tokens_after=1, created_at=T0))
    finally:
        untrack_writes(token)
    assert writes == RequestWrites(artifact_ids=["new"], event_ids=["e_new"])
    gone = await store.record_refused(_record(session.pk, "r"), T0, "t", (), writes.artifact_ids, writes.event_ids)
    assert gone == ["new"]
    assert await _column(store, artifacts.c.id, artifacts.c.tenant == "t") == {"old"}
    assert await _column(store, artifacts.c.id, artifacts.c.tenant == "t2") == {"new"}
    assert await _column(store, events.c.id) == {"e_old"}


@pytest.mark.parametrize("other", ["offloaded", "plain"])
async def test_what_another_request_of_the_session_used_since_stays(store: Store, other: str) -> None:
    """An accepted request recorded after the refused one stored its rows may have used them (it
    found the content-addressed artifact stored; it applied the event): they stay. A request that
    offloaded nothing cannot have named the artifact."""
    session = await store.get_or_create_session("t", "s", T0)
    await store.put_artifacts([_artifact(session.pk, "shared")])
    await store.add_event(EventRecord(id="e", session_pk=session.pk, kind="summary", anchor_hash="a" * 64,
                                      payload={}, tokens_before=2, tokens_after=1, created_at=T0 + timedelta(seconds=1)))
    used = other == "offloaded"
    await store.add_request(_record(session.pk, "accepted", 200, defenses=("offload",) if used else (),
                                    event_ids=("e",) if used else (), at=5))
    gone = await store.record_refused(_record(session.pk, "r"), T0, "t", (), ["shared"], ["e"])
    assert gone == ([] if used else ["shared"])
    assert await _column(store, artifacts.c.id) == ({"shared"} if used else set())
    assert await _column(store, events.c.id) == ({"e"} if used else set())


@pytest.mark.parametrize("where", ["another session of the tenant", "another tenant"])
async def test_an_artifact_another_session_of_the_tenant_may_use_stays(store: Store, where: str) -> None:
    """Artifacts are content-addressed per tenant: another session of the tenant that offloaded the
    same content found the refused request's row stored and its stubs name it (review: only the
    refused request's own session was checked, and that row was deleted under the other session)."""
    session = await store.get_or_create_session("t", "s", T0)
    other = await store.get_or_create_session("t" if where == "another session of the tenant" else "t2", "s2", T0)
    await store.put_artifacts([_artifact(session.pk, "shared")])
    await store.add_request(_record(other.pk, "accepted", 200, defenses=("offload",), at=5))
    gone = await store.record_refused(_record(session.pk, "r"), T0, "t", (), ["shared"], ())
    kept = where == "another session of the tenant"
    assert gone == ([] if kept else ["shared"])
    assert await _column(store, artifacts.c.id) == ({"shared"} if kept else set())


async def test_the_deletion_and_the_record_commit_together(store: Store) -> None:
    """A record that cannot be written (its id taken) leaves the content as it was: never the
    content gone without the record, nor the record there with the content."""
    session = await store.get_or_create_session("t", "s", T0)
    mine = await store.append_new_messages(session.pk, chain(conversation(3)), T0)
    await store.put_artifacts([_artifact(session.pk, "a")])
    await store.add_request(_record(session.pk, "taken", 200))
    with pytest.raises(StorageError):
        await store.record_refused(_record(session.pk, "taken"), T0, "t", mine, ["a"], ())
    assert len(await _column(store, messages.c.id)) == 3 and await _column(store, artifacts.c.id) == {"a"}
    assert await store.record_refused(dataclasses.replace(_record(session.pk, "r")), T0, "t", mine, ["a"], ()) == ["a"]
    assert await _column(store, messages.c.id) == set()
