"""storage/reads.py for the archive and the request list, on SQLite and PostgreSQL: the archive read
in pages by id is the archive rendered whole, and a request cursor names a request of its own
session only (issue 16 items 3 and 14, issue 17 item 7)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from proxy.conversation.canonical import digests_and_chain
from proxy.tools.archive import render_archive, stream_archive_lines
from storage.errors import InvalidCursor
from storage.records import EventRecord, NewMessage, RequestRecord
from storage.store import Store

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def entries(messages: list[dict[str, str]]) -> list[NewMessage]:
    _, hashes = digests_and_chain(messages)
    return [NewMessage(hashes[i], hashes[i - 1] if i else None, i, messages[i]["role"], messages[i]) for i in range(len(messages))]


async def test_archive_streamed_by_pages_is_the_whole_rendering(store: Store) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    talk = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}\n" + "z" * (i * 37)} for i in range(45)]
    rows = entries(talk)
    await store.append_messages(session.pk, rows[:30], T0)
    await store.add_event(EventRecord(id="evt_" + "1" * 24, session_pk=session.pk, kind="summary", anchor_hash=rows[12].chain_hash,
                                      payload={"summary": "s"}, tokens_before=9, tokens_after=1, created_at=T0 + timedelta(seconds=1)))
    await store.append_messages(session.pk, rows[30:], T0 + timedelta(seconds=2))
    # another branch: not in the archive of this one
    await store.append_messages(session.pk, entries([*talk[:3], {"role": "user", "content": "edited"}])[3:], T0 + timedelta(seconds=3))
    leaf = rows[-1].chain_hash
    whole, _ = await store.list_branch_messages(session.pk, leaf, None, 1000)
    expected = render_archive("s", whole, await store.list_events(session.pk))
    assert expected.count("## Compaction ") == 1 and "edited" not in expected
    for page in (1, 7, 500):
        streamed = [line async for line in stream_archive_lines(store, "s", session.pk, leaf, page_messages=page)]
        assert "".join(line + "\n" for line in streamed) == expected, page
    assert await store.branch_message_ids(session.pk, "not-a-hash") == []
    assert await store.messages_by_ids(session.pk + 1, [m.id for m in whole]) == []


@pytest.mark.parametrize("cursor", ["foreign-session", "foreign-tenant", "unknown"])
async def test_a_request_cursor_names_a_request_of_its_session_only(store: Store, cursor: str) -> None:
    mine = await store.get_or_create_session("t1", "s", T0)
    other = await store.get_or_create_session("t1" if cursor == "foreign-session" else "t2", "s2", T0)

    def record(rid: str, session_pk: int, seconds: int) -> RequestRecord:
        return RequestRecord(id=rid, session_pk=session_pk, model="m", status=200, latency_ms=1.0, stream=False, usage=None,
                             added_messages=0, first_added_seq=None, tokens_client=None, tokens_forwarded=None,
                             created_at=T0 + timedelta(seconds=seconds))

    for n in range(3):
        await store.add_request(record(f"req_mine_{n}", mine.pk, n))
    await store.add_request(record("req_theirs", other.pk, 1))
    page, more = await store.list_requests(mine.pk, 1, None)
    assert [r.id for r in page] == ["req_mine_0"] and more
    page, more = await store.list_requests(mine.pk, 10, "req_mine_0")
    assert [r.id for r in page] == ["req_mine_1", "req_mine_2"] and not more
    with pytest.raises(InvalidCursor):
        await store.list_requests(mine.pk, 10, "req_nope" if cursor == "unknown" else "req_theirs")
