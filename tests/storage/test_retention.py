"""Retention on SQLite and PostgreSQL: age and per-tenant size rules, whole sessions with their
messages, events, requests and artifacts, batches, dry runs, a concurrent writer, and the CLI."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from typer.testing import CliRunner

from proxy.cli import app
from proxy.conversation.canonical import digests_and_chain
from storage.engine import create_engine
from storage.records import ArtifactRecord, EventRecord, NewMessage, RequestRecord
from storage.retention import RetentionPolicy, run_retention
from storage.store import Store

NOW = datetime(2025, 6, 1, tzinfo=UTC)


async def make_session(store: Store, tenant: str, session_id: str, updated: datetime, *, n: int = 4,
                       text: str = "hello", artifact: str | None = None) -> int:
    """A session with ``n`` messages, one event, one request and (optionally) an artifact."""
    s = await store.get_or_create_session(tenant, session_id, updated)
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{text} {session_id} {i}"} for i in range(n)]
    _, chain = digests_and_chain(msgs)
    await store.append_messages(s.pk, [NewMessage(chain[i], chain[i - 1] if i else None, i, m["role"], m)
                                       for i, m in enumerate(msgs)], updated)
    await store.add_event(EventRecord(f"evt_{tenant}_{session_id}", s.pk, "summary", chain[1], {"summary": "s"}, 10, 5, updated))
    await store.add_request(RequestRecord(f"req_{tenant}_{session_id}", s.pk, "m", 200, 1.0, False, None, n, 0, None, None,
                                          created_at=updated))
    if artifact is not None:
        await store.put_artifacts([ArtifactRecord(artifact, tenant, s.pk, "text/plain", "x" * 1000, 1000, 1, updated)])
    return s.pk


async def counts(url: str) -> dict[str, int]:
    engine = create_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:
            out = {t: (await conn.execute(sa.text(f"SELECT COUNT(*) FROM {t}"))).scalar_one()
                   for t in ("sessions", "messages", "events", "requests", "artifacts")}
            orphan_sql = ("SELECT COUNT(*) FROM {t} WHERE session_pk IS NOT NULL AND session_pk NOT IN (SELECT pk FROM sessions)")
            out["orphans"] = sum([(await conn.execute(sa.text(orphan_sql.format(t=t)))).scalar_one()
                                  for t in ("messages", "events", "requests", "artifacts")])
            return out
    finally:
        await engine.dispose()


async def test_age_rule_deletes_old_sessions_whole_and_keeps_recent(store: Store, database_url: str) -> None:
    old = NOW - timedelta(days=40)
    for i in range(5):
        await make_session(store, "t_a", f"old-{i}", old, artifact=f"art_old{i}")
    keep = await make_session(store, "t_a", "recent", NOW - timedelta(days=1), artifact="art_recent")
    await make_session(store, "t_b", "old-0", old)  # same session id, other tenant: also old
    dry = await run_retention(database_url, RetentionPolicy(max_age_days=30), now=NOW, dry_run=True)
    assert dry.sessions == 6 and (await counts(database_url))["sessions"] == 7  # nothing deleted
    report = await run_retention(database_url, RetentionPolicy(max_age_days=30, batch_size=10), now=NOW)
    assert (report.sessions, report.messages, report.events, report.requests, report.artifacts) == (6, 24, 6, 6, 5)
    assert report.batches == 6  # each session is 1 + 4 + 1 + 1 (+1) rows: one session per 10-row batch
    left = await counts(database_url)
    assert left == {"sessions": 1, "messages": 4, "events": 1, "requests": 1, "artifacts": 1, "orphans": 0}
    assert (await store.find_session("recent", "t_a")).pk == keep
    assert await store.get_artifact("art_recent", "t_a") is not None
    assert await store.get_artifact("art_old0", "t_a") is None


async def test_age_rule_deletes_learned_limits_not_updated_within_it(store: Store, database_url: str) -> None:
    up = "https://upstream/v1"
    await store.set_learned_window("t_a", up, "old-model", 4096, "overflow", NOW - timedelta(days=40), None)
    await store.set_estimate_ratio("t_a", up, "new-model", 1.3, NOW - timedelta(days=1))
    dry = await run_retention(database_url, RetentionPolicy(max_age_days=30), now=NOW, dry_run=True)
    assert dry.learned_limits == 1 and len(await store.list_learned_limits()) == 2
    report = await run_retention(database_url, RetentionPolicy(max_age_days=30), now=NOW)
    assert report.learned_limits == 1
    assert [r.model for r in await store.list_learned_limits()] == ["new-model"]


async def test_size_rule_deletes_a_tenants_oldest_sessions_until_under_the_cap(store: Store, database_url: str) -> None:
    for i in range(6):  # tenant A: 6 sessions of ~1,000 bytes of artifacts plus messages
        await make_session(store, "t_a", f"a{i}", NOW - timedelta(hours=10 - i), artifact=f"art_a{i}")
    await make_session(store, "t_b", "b0", NOW - timedelta(days=300), artifact="art_b0")  # small tenant, untouched
    report = await run_retention(database_url, RetentionPolicy(max_bytes_per_tenant=3000), now=NOW)
    assert report.by_reason == {"age": 0, "size": 4}
    sessions, _ = await store.list_sessions(None, 100)
    assert sorted(s.session.session_id for s in sessions) == ["a4", "a5", "b0"]  # the newest of A, all of B
    assert (await counts(database_url))["orphans"] == 0
    assert report.bytes_freed >= 4000


async def test_a_session_resumed_during_retention_is_kept(store: Store, database_url: str) -> None:
    """The delete re-checks ``updated_at``: a session touched after it was chosen survives."""
    await make_session(store, "t_a", "resumed", NOW - timedelta(days=40))
    engine_now = datetime.now(UTC)
    await store.get_or_create_session("t_a", "resumed", engine_now)  # the agent comes back
    report = await run_retention(database_url, RetentionPolicy(max_age_days=30), now=engine_now + timedelta(days=1))
    assert report.sessions == 0
    assert await store.find_session("resumed", "t_a") is not None


async def test_a_concurrent_writer_is_never_blocked_for_long_nor_loses_a_message(store: Store, database_url: str) -> None:
    old = NOW - timedelta(days=90)
    for i in range(60):
        await make_session(store, "t_a", f"old-{i}", old, n=20, artifact=f"art_{i}")
    writer_times: list[float] = []
    written: list[str] = []
    stop = asyncio.Event()

    async def writer() -> None:
        history: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            history.append({"role": "user", "content": f"live {len(history)}"})
            _, chain = digests_and_chain(history)
            t0 = loop.time()
            s = await store.get_or_create_session("t_a", "live", datetime.now(UTC))
            i = len(history) - 1
            await store.append_messages(s.pk, [NewMessage(chain[i], chain[i - 1] if i else None, i, "user", history[-1])],
                                        datetime.now(UTC))
            writer_times.append(loop.time() - t0)
            written.append(chain[i])
            await asyncio.sleep(0)

    task = asyncio.create_task(writer())
    await asyncio.sleep(0.05)
    report = await run_retention(database_url, RetentionPolicy(max_age_days=30, batch_size=50), now=datetime.now(UTC))
    stop.set()
    await task
    assert report.sessions == 60 and report.batches >= 20
    live = await store.find_session("live", "t_a")
    assert live is not None
    stored, _ = await store.list_branch_messages(live.pk, written[-1], None, 10**6)
    assert [m.chain_hash for m in stored] == written  # no lost, no duplicate message
    assert len(writer_times) > 10 and max(writer_times) < 2.0
    left = await counts(database_url)
    assert left["sessions"] == 1 and left["orphans"] == 0 and left["artifacts"] == 0


def test_cli_retention_reports_and_deletes(database_url: str) -> None:
    async def seed() -> None:
        store = await Store.open(database_url, pool_size=2)
        try:
            await make_session(store, "t_a", "ancient", datetime.now(UTC) - timedelta(days=400))
            await make_session(store, "t_a", "fresh", datetime.now(UTC))
        finally:
            await store.close()

    asyncio.run(seed())
    runner = CliRunner()
    nothing = runner.invoke(app, ["retention", "--database-url", database_url])
    assert nothing.exit_code == 2 and "nothing to do" in nothing.output
    dry = runner.invoke(app, ["retention", "--max-age-days", "365", "--dry-run", "--database-url", database_url])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output)["sessions"] == 1 and json.loads(dry.output)["dry_run"] is True
    real = runner.invoke(app, ["retention", "--max-age-days", "365", "--database-url", database_url])
    assert real.exit_code == 0, real.output
    assert json.loads(real.output)["messages"] == 4
    assert asyncio.run(counts(database_url))["sessions"] == 1
