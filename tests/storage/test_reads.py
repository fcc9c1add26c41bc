"""Read side (storage/reads.py through Store) on SQLite and PostgreSQL: branches of the message
tree, keyset pagination, session listing and tenant scoping, and a real trace replayed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.conversation.canonical import digests_and_chain
from storage.errors import InvalidCursor
from storage.records import NewMessage
from storage.store import Store

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def entries(messages: list[dict[str, Any]], start: int = 0) -> list[NewMessage]:
    """Log entries for ``messages[start:]`` (their chain hashes cover the whole list)."""
    _, hashes = digests_and_chain(messages)
    return [
        NewMessage(chain_hash=hashes[i], parent_hash=hashes[i - 1] if i else None, seq=i, role=messages[i]["role"], message=messages[i])
        for i in range(start, len(messages))
    ]


def talk(n: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "sys"}] + [
        {"role": "user" if i % 2 else "assistant", "content": f"m{i}"} for i in range(1, n)
    ]


async def test_branches_from_an_edit(store: Store) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    original = talk(10)
    await store.append_messages(session.pk, entries(original), T0)
    edited = original[:5] + [{"role": "assistant", "content": "regenerated"}, {"role": "user", "content": "next"}]
    prefix = await store.stored_prefix_len(session.pk, digests_and_chain(edited)[1])
    assert prefix == 5
    assert await store.append_messages(session.pk, entries(edited, start=prefix), T0) == 2

    summary = await store.session_summary(session)
    assert summary.message_count == 12 and summary.branch_count == 2

    newest = await store.branch_leaf(session.pk, None)
    assert newest is not None and newest.message == {"role": "user", "content": "next"} and newest.seq == 6
    listed, more = await store.list_branch_messages(session.pk, newest.chain_hash, None, 100)
    assert [m.message for m in listed] == edited and not more

    old_leaf = digests_and_chain(original)[1][-1]
    assert (await store.branch_leaf(session.pk, old_leaf)) is not None
    listed, _ = await store.list_branch_messages(session.pk, old_leaf, None, 100)
    assert [m.message for m in listed] == original
    assert [m.seq for m in listed] == list(range(10))

    # an older branch extended later becomes the newest leaf
    extended = original + [{"role": "assistant", "content": "more"}]
    await store.append_messages(session.pk, entries(extended, start=10), T0)
    newest = await store.branch_leaf(session.pk, None)
    assert newest is not None and newest.message == {"role": "assistant", "content": "more"}
    assert (await store.session_summary(session)).branch_count == 2


async def test_branch_listing_paginates_by_seq(store: Store) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    log = talk(25)
    await store.append_messages(session.pk, entries(log), T0)
    leaf = digests_and_chain(log)[1][-1]
    seen: list[dict[str, Any]] = []
    after: int | None = None
    pages = 0
    while True:
        page, more = await store.list_branch_messages(session.pk, leaf, after, 10)
        seen.extend(m.message for m in page)
        pages += 1
        if not more:
            break
        after = page[-1].seq
    assert seen == log and pages == 3
    page, more = await store.list_branch_messages(session.pk, leaf, 24, 10)
    assert page == [] and not more


async def test_unknown_leaf_and_empty_session(store: Store) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    assert await store.branch_leaf(session.pk, None) is None
    assert await store.branch_leaf(session.pk, "f" * 64) is None
    assert await store.list_branch_messages(session.pk, "f" * 64, None, 10) == ([], False)
    summary = await store.session_summary(session)
    assert (summary.message_count, summary.branch_count, summary.request_count, summary.last_model) == (0, 0, 0, None)


async def test_list_sessions_pages_newest_first_with_tenant_scoping(store: Store) -> None:
    # 7 sessions of tenant a (two share one updated_at), 3 of tenant b
    for i in range(7):
        await store.get_or_create_session("a", f"a{i}", T0 + timedelta(seconds=min(i, 5)))
    for i in range(3):
        await store.get_or_create_session("b", f"b{i}", T0 + timedelta(seconds=10 + i))
    await store.get_or_create_session("b", "a3", T0)  # same session_id in another tenant

    ids: list[str] = []
    after = None
    while True:
        page, more = await store.list_sessions("a", 3, after)
        ids.extend(s.session.session_id for s in page)
        if not more:
            break
        after = page[-1].session.session_id
    assert ids == ["a6", "a5", "a4", "a3", "a2", "a1", "a0"]  # tie at +5s broken by newer pk
    assert all(s.session.tenant == "a" for s in (await store.list_sessions("a", 10, None))[0])

    everyone, more = await store.list_sessions(None, 100, None)
    assert len(everyone) == 11 and not more
    assert [s.session.session_id for s in everyone[:3]] == ["b2", "b1", "b0"]

    with pytest.raises(InvalidCursor):
        await store.list_sessions("a", 3, "b1")  # another tenant's session is no cursor


async def test_list_sessions_carries_counts(store: Store) -> None:
    session = await store.get_or_create_session("a", "s", T0)
    await store.append_messages(session.pk, entries(talk(4)), T0 + timedelta(seconds=1))
    (summary,), _ = await store.list_sessions("a", 5, None)
    assert summary.message_count == 4 and summary.branch_count == 1
    assert summary.session.updated_at == T0 + timedelta(seconds=1)


async def test_find_session_tenant_and_admin(store: Store) -> None:
    mine = await store.get_or_create_session("a", "shared-name", T0)
    theirs = await store.get_or_create_session("b", "shared-name", T0 + timedelta(seconds=1))
    assert await store.find_session("shared-name", "a") == mine
    assert await store.find_session("shared-name", "c") is None
    assert await store.find_session("shared-name", None) == theirs  # admin: newest match
    assert await store.find_session("nope", None) is None


async def test_replay_real_trace_stores_each_message_once(store: Store, shared_dir: Path) -> None:
    """Turn by turn, as the agent sent it: each request resends the growing history."""
    path = shared_dir / "traces" / "tau-bench__airline-task13-trial1__gpt-4o.jsonl"
    trace = [orjson.loads(line) for line in path.read_text().splitlines() if line.strip()]
    session = await store.get_or_create_session("t", "trace", T0)
    replies = [i for i, m in enumerate(trace) if m["role"] == "assistant"]
    total_added = 0
    stored = 0  # messages stored so far: everything up to and including the previous reply
    for i in replies:
        sent = trace[:i]  # the request: the whole history so far
        _, hashes = digests_and_chain(sent)
        prefix = await store.stored_prefix_len(session.pk, hashes)
        assert prefix == stored  # only the messages since the previous reply are new
        total_added += await store.append_messages(session.pk, entries(sent, start=prefix), T0)
        total_added += await store.append_messages(session.pk, entries(trace[: i + 1], start=i), T0)  # the reply
        stored = i + 1
    if replies[-1] != len(trace) - 1:
        total_added += await store.append_messages(session.pk, entries(trace, start=replies[-1] + 1), T0)
    assert total_added == len(trace)
    summary = await store.session_summary(session)
    assert summary.message_count == len(trace) and summary.branch_count == 1
    leaf = await store.branch_leaf(session.pk, None)
    assert leaf is not None
    listed, more = await store.list_branch_messages(session.pk, leaf.chain_hash, None, 1_000)
    assert [m.message for m in listed] == trace and not more
