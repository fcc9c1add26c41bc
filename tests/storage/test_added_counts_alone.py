"""A request record's ``(added_messages, first_added_seq)`` when its SQLite batch fails and each
write is retried alone (``storage.sqlite.end_write``): the counts are what that write inserted,
as in the batch (review of the counts' fix: no test read them on this path)."""

from __future__ import annotations

import pytest

from proxy.conversation.canonical import chain_hash, message_digest
from storage.errors import StorageError
from storage.records import NewMessage, RequestRecord
from storage.store import Store
from tests.storage.test_store import T0, chain, conversation


def _record(request_id: str, session_pk: int) -> RequestRecord:
    return RequestRecord(id=request_id, session_pk=session_pk, model="m", status=200, latency_ms=1.0, stream=False,
                         usage=None, added_messages=99, first_added_seq=77, tokens_client=None,
                         tokens_forwarded=None, defenses=[], event_ids=[], error=None, finish_reason="stop")


def _reply(parent: NewMessage, text: str) -> NewMessage:
    m = {"role": "assistant", "content": text}
    return NewMessage(chain_hash(parent.chain_hash, message_digest(m)), parent.chain_hash, parent.seq + 1, "assistant", m)


async def test_writes_retried_alone_count_what_each_inserted(store: Store) -> None:
    session = await store.get_or_create_session("t", "alone", T0)
    log = chain(conversation(5))
    await store.append_messages(session.pk, log[:1], T0)
    await store.add_request(_record("req_taken", session.pk))  # its id taken: the batch with it fails
    w1 = store.append_and_record(session.pk, log[:3], _record("req_1", session.pk), T0, client_rows=3)
    w2 = store.append_and_record(session.pk, [*log[:4], _reply(log[3], "r")], _record("req_taken", session.pk), T0,
                                 client_rows=4)
    w3 = store.append_and_record(session.pk, [*log[1:5], _reply(log[4], "r5")], _record("req_3", session.pk), T0,
                                 client_rows=4)
    await w1
    with pytest.raises(StorageError):
        await w2
    await w3
    records, _ = await store.list_requests(session.pk, 100, None)
    counts = {r.id: (r.added_messages, r.first_added_seq) for r in records}
    assert counts["req_taken"] == (99, 77)  # the row already there, untouched
    # in the order the writes were started (SQLite: its queue; PostgreSQL: ``storage.session_order``)
    assert counts["req_1"] == (2, 1)  # seqs 1, 2
    assert counts["req_3"] == (1, 4)  # seq 4 (seq 3 came with req_taken's messages; 5 is its reply)
    claimed = [set(range(first, first + added)) for added, first in (counts["req_1"], counts["req_3"]) if first is not None]
    assert len(claimed) < 2 or not claimed[0] & claimed[1]
