"""Row layout of revision 0002 on SQLite and PostgreSQL: hashes as 32 bytes, values compressed on
SQLite, hashes from users that cannot be stored naming nothing, and a database written at 0001
upgraded (and downgraded) with every row reading back identically."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import sqlalchemy as sa
from alembic import command

from proxy.conversation.canonical import chain_hash, digests_and_chain, message_digest
from storage.columns import PACK_MIN_BYTES, JsonText, UtcDateTime
from storage.engine import create_engine
from storage.migrate import alembic_config, upgrade
from storage.records import ArtifactRecord, EventRecord, NewMessage
from storage.retention import RetentionPolicy, run_retention
from storage.store import Store

T0 = datetime(2025, 3, 1, 8, 30, 15, 123456, tzinfo=UTC)

BIG = "Line {i}: the quick brown fox — jumps over the lazy dog; ünïcode ✓ 12.50 USD\n"


def history() -> list[dict[str, Any]]:
    """A short log with one large, compressible message and exact number and key forms."""
    return [
        {"role": "system", "content": "".join(BIG.format(i=i) for i in range(300))},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "f", "arguments": "{\"x\": 1.0}"}}], "z_first": 1, "a_after": [1.0, 2, -0.5e-7]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ]


def entries(messages: list[dict[str, Any]], start: int = 0) -> list[NewMessage]:
    _, hashes = digests_and_chain(messages)
    return [NewMessage(hashes[i], hashes[i - 1] if i else None, i, messages[i]["role"], messages[i])
            for i in range(start, len(messages))]


async def raw(url: str, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    engine = create_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:
            return [tuple(r) for r in await conn.execute(sa.text(sql), params)]
    finally:
        await engine.dispose()


async def test_hashes_are_stored_as_32_bytes_and_read_back_as_hex(store: Store, database_url: str) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    msgs = history()
    await store.append_messages(session.pk, entries(msgs), T0)
    chain = digests_and_chain(msgs)[1]
    await store.add_event(EventRecord("evt_1", session.pk, "summary", chain[2], {"summary": "s"}, 9, 3, T0))
    sizes = await raw(database_url, "SELECT octet_length(chain_hash), octet_length(parent_hash) FROM messages ORDER BY seq"
                      if "postgresql" in database_url else
                      "SELECT length(chain_hash), length(parent_hash) FROM messages WHERE typeof(chain_hash) = 'blob' ORDER BY seq")
    assert sizes == [(32, None), (32, 32), (32, 32), (32, 32)]
    assert await raw(database_url, "SELECT anchor_hash FROM events") == [(bytes.fromhex(chain[2]),)]
    listed, _ = await store.list_branch_messages(session.pk, chain[-1], None, 10)
    assert [(m.chain_hash, m.parent_hash) for m in listed] == [(h, chain[i - 1] if i else None) for i, h in enumerate(chain)]
    assert (await store.list_events(session.pk))[0].anchor_hash == chain[2]
    assert await store.stored_prefix_len(session.pk, chain) == 4


async def test_values_are_compressed_on_sqlite_only_when_smaller_and_read_back_identically(store: Store, database_url: str) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    msgs = history()
    await store.append_messages(session.pk, entries(msgs), T0)
    big_text = msgs[0]["content"]
    await store.add_event(EventRecord("evt_1", session.pk, "summary", digests_and_chain(msgs)[1][1], {"summary": big_text}, 9, 3, T0))
    await store.put_artifacts([ArtifactRecord("art_big", "t", session.pk, "text/plain", big_text, len(big_text.encode()), 300, T0),
                               ArtifactRecord("art_small", "t", session.pk, "text/plain", "tiny ✓", 8, 1, T0)])
    json_bytes = [len(orjson.dumps(m)) for m in msgs]
    if "postgresql" in database_url:
        stored = await raw(database_url, "SELECT message FROM messages ORDER BY seq")
        assert [orjson.loads(v) for (v,) in stored] == msgs  # plain text, TOAST compresses it
    else:
        stored = await raw(database_url, "SELECT typeof(message), length(CAST(message AS BLOB)) FROM messages ORDER BY seq")
        assert [kind for kind, _ in stored] == ["blob", "text", "text", "text"]  # all but the first under PACK_MIN_BYTES
        assert json_bytes[2] < PACK_MIN_BYTES <= json_bytes[0]
        assert stored[0][1] < json_bytes[0] / 4
        assert [n for kind, n in stored if kind == "text"] == json_bytes[1:]
        assert await raw(database_url, "SELECT typeof(payload) FROM events") == [("blob",)]
        assert await raw(database_url, "SELECT id, typeof(content) FROM artifacts ORDER BY id") == [("art_big", "blob"), ("art_small", "text")]
    listed, _ = await store.list_branch_messages(session.pk, digests_and_chain(msgs)[1][-1], None, 10)
    assert [m.message for m in listed] == msgs
    assert [list(m.message) for m in listed] == [list(m) for m in msgs]  # key order as written
    assert [orjson.dumps(m.message) for m in listed] == [orjson.dumps(m) for m in msgs]  # number forms as written
    assert (await store.list_events(session.pk))[0].payload == {"summary": big_text}
    assert (await store.get_artifact("art_big", "t")).content == big_text
    assert (await store.get_artifact("art_small", "t")).content == "tiny ✓"


async def test_a_hash_that_cannot_be_stored_names_no_message(store: Store) -> None:
    session = await store.get_or_create_session("t", "s", T0)
    msgs = history()
    await store.append_messages(session.pk, entries(msgs), T0)
    real = digests_and_chain(msgs)[1][-1]
    assert (await store.get_message_by_hash(session.pk, real)).message == msgs[-1]
    for bad in ("nothex", real.upper(), real[:-1], real + "0", "g" * 64, real[:-1] + "\x00", "", "é" * 64):
        assert await store.get_message_by_hash(session.pk, bad) is None, bad
        assert await store.branch_leaf(session.pk, bad) is None, bad
        assert await store.list_branch_messages(session.pk, bad, None, 10) == ([], False), bad


async def test_size_rule_counts_values_as_stored(store: Store, database_url: str) -> None:
    """A 24 kB compressible message counts its compressed size (zlib on SQLite, TOAST on PostgreSQL)."""
    session = await store.get_or_create_session("t", "s", T0)
    msgs = history()
    await store.append_messages(session.pk, entries(msgs), T0)
    json_bytes = sum(len(orjson.dumps(m)) for m in msgs)
    report = await run_retention(database_url, RetentionPolicy(max_bytes_per_tenant=1), now=T0, dry_run=True)
    assert report.sessions == 1 and 200 < report.bytes_freed < json_bytes / 4


# --- a database written by revision 0001 ---------------------------------------------------

_OLD = sa.MetaData()
"""Revision 0001's columns as its code wrote them: hashes as hex text, JSON and content as text."""
OLD_SESSIONS = sa.Table("sessions", _OLD, sa.Column("pk", sa.Integer, primary_key=True), sa.Column("session_id", sa.Text),
                        sa.Column("tenant", sa.Text), sa.Column("created_at", UtcDateTime), sa.Column("updated_at", UtcDateTime))
OLD_MESSAGES = sa.Table("messages", _OLD, sa.Column("id", sa.Integer, primary_key=True), sa.Column("session_pk", sa.Integer),
                        sa.Column("chain_hash", sa.Text), sa.Column("parent_hash", sa.Text), sa.Column("seq", sa.Integer),
                        sa.Column("role", sa.Text), sa.Column("message", JsonText), sa.Column("internal", sa.Boolean),
                        sa.Column("created_at", UtcDateTime))
OLD_EVENTS = sa.Table("events", _OLD, sa.Column("id", sa.Text, primary_key=True), sa.Column("session_pk", sa.Integer),
                      sa.Column("kind", sa.Text), sa.Column("anchor_hash", sa.Text), sa.Column("payload", JsonText),
                      sa.Column("tokens_before", sa.Integer), sa.Column("tokens_after", sa.Integer), sa.Column("created_at", UtcDateTime))
OLD_ARTIFACTS = sa.Table("artifacts", _OLD, sa.Column("tenant", sa.Text, primary_key=True), sa.Column("id", sa.Text, primary_key=True),
                         sa.Column("session_pk", sa.Integer), sa.Column("media_type", sa.Text), sa.Column("content", sa.Text),
                         sa.Column("size_bytes", sa.Integer), sa.Column("line_count", sa.Integer), sa.Column("created_at", UtcDateTime))


def two_branches() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The history, and an edit of it that branches after message 1."""
    msgs = history()
    return msgs, msgs[:2] + [{"role": "assistant", "content": "regenerated " + "x" * 200}]


async def write_as_0001(url: str) -> dict[str, Any]:
    """Rows as revision 0001's code stored them; returns what they hold."""
    msgs, edit = two_branches()
    rows = []
    for branch in (msgs, edit):
        hashes = digests_and_chain(branch)[1]
        rows += [{"chain_hash": h, "parent_hash": hashes[i - 1] if i else None, "seq": i, "role": branch[i]["role"],
                  "message": branch[i], "internal": i == 3, "created_at": T0} for i, h in enumerate(hashes)]
    rows = list({r["chain_hash"]: r for r in rows}.values())
    anchor = digests_and_chain(msgs)[1][1]
    engine = create_engine(url, pool_size=1)
    try:
        async with engine.begin() as conn:
            pk = (await conn.execute(sa.insert(OLD_SESSIONS).values(session_id="s", tenant="t", created_at=T0, updated_at=T0)
                                     .returning(OLD_SESSIONS.c.pk))).scalar_one()
            await conn.execute(sa.insert(OLD_MESSAGES), [{"session_pk": pk, **r} for r in rows])
            await conn.execute(sa.insert(OLD_EVENTS).values(id="evt_old", session_pk=pk, kind="summary", anchor_hash=anchor,
                                                            payload={"summary": msgs[0]["content"], "n": [1.0, None]},
                                                            tokens_before=100, tokens_after=10, created_at=T0))
            await conn.execute(sa.insert(OLD_ARTIFACTS).values(tenant="t", id="art_old", session_pk=pk, media_type="text/plain",
                                                               content=msgs[0]["content"], size_bytes=1, line_count=300, created_at=T0))
    finally:
        await engine.dispose()
    return {"pk": pk, "msgs": msgs, "edit": edit, "anchor": anchor, "rows": rows}


async def read_as_0001(url: str) -> dict[str, Any]:
    engine = create_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:
            return {
                "messages": [tuple(r) for r in await conn.execute(sa.select(OLD_MESSAGES).order_by(OLD_MESSAGES.c.id))],
                "events": [tuple(r) for r in await conn.execute(sa.select(OLD_EVENTS))],
                "artifacts": [tuple(r) for r in await conn.execute(sa.select(OLD_ARTIFACTS))],
            }
    finally:
        await engine.dispose()


async def downgrade(url: str, revision: str) -> None:
    config = alembic_config(url)
    engine = create_engine(url, pool_size=1)
    try:
        async with engine.begin() as conn:

            def run(sync: sa.Connection) -> None:
                config.attributes["connection"] = sync
                command.downgrade(config, revision)

            await conn.run_sync(run)
    finally:
        await engine.dispose()


async def assert_reads_back(store: Store, old: dict[str, Any], added: int = 0) -> None:
    pk, msgs, edit = old["pk"], old["msgs"], old["edit"]
    for branch in (msgs, edit):
        hashes = digests_and_chain(branch)[1]
        listed, more = await store.list_branch_messages(pk, hashes[-1], None, 100)
        assert [m.message for m in listed] == branch and not more
        assert [(m.chain_hash, m.parent_hash, m.seq, m.created_at) for m in listed] == [
            (h, hashes[i - 1] if i else None, i, T0) for i, h in enumerate(hashes)]
        assert await store.stored_prefix_len(pk, hashes) == len(branch)
    assert [m.message for m in await store.list_internal_messages(pk)] == [msgs[3]]
    (event,) = await store.list_events(pk)
    assert (event.anchor_hash, event.payload, event.created_at) == (old["anchor"], {"summary": msgs[0]["content"], "n": [1.0, None]}, T0)
    assert (await store.get_artifact("art_old", "t")).content == msgs[0]["content"]
    summary = await store.session_summary(await store.find_session("s", "t"))
    assert (summary.message_count, summary.branch_count, summary.event_count) == (len(old["rows"]) + added, 2, 1)


async def test_a_database_written_at_0001_upgrades_and_reads_back_identically(empty_database_url: str) -> None:
    url = empty_database_url
    await upgrade(url, "0001")
    old = await write_as_0001(url)
    before = await read_as_0001(url)
    await upgrade(url)
    store = await Store.open(url, pool_size=2)
    try:
        await assert_reads_back(store, old)
        # the log goes on across old and new rows: a continuation's parent is an upgraded row
        more = old["msgs"] + [{"role": "user", "content": "and now " + "y" * 300}]
        hashes = digests_and_chain(more)[1]
        assert await store.append_messages(old["pk"], entries(more, start=4), T0) == 1
        listed, _ = await store.list_branch_messages(old["pk"], hashes[-1], None, 100)
        assert [m.message for m in listed] == more
        assert hashes[-1] == chain_hash(hashes[-2], message_digest(more[-1]))
    finally:
        await store.close()
    # and back: 0001's code reads every row as it wrote it, the new one as plain hex and text
    await downgrade(url, "0001")
    after = await read_as_0001(url)
    assert after["messages"][:-1] == before["messages"] and after["events"] == before["events"]
    assert after["artifacts"] == before["artifacts"]
    last = after["messages"][-1]
    assert (last[2], last[3], last[6]) == (hashes[-1], hashes[-2], more[-1])
    await upgrade(url)
    store = await Store.open(url, pool_size=2)
    try:
        await assert_reads_back(store, old, added=1)
    finally:
        await store.close()
