"""proxy/forward/session_log.py helpers."""

from __future__ import annotations

import random
import time
from datetime import timedelta

import pytest

from proxy.compaction.base import Compactor
from proxy.conversation.canonical import digests_and_chain
from proxy.forward.context import ChatContext
from proxy.forward.pipeline import ChatPipeline
from proxy.forward.session_log import SessionLog, new_id, now
from proxy.settings import Settings
from proxy.telemetry.metrics import Metrics
from proxy.tokens.counter import load_counter
from storage.records import EventRecord
from storage.refused import track_writes, untrack_writes
from storage.retention import RetentionPolicy, run_retention
from storage.store import Store


def test_request_ids_stay_unique_whatever_seeds_random() -> None:
    """Hypothesis (and some libraries) reseed ``random``: ids drawn from it repeated, and a
    repeated request id failed that request's log write (a primary key)."""
    ids = set()
    try:
        for _ in range(50):
            random.seed(0)
            ids.add(new_id("req"))
    finally:
        random.seed()  # from system entropy again: later tests get no fixed sequence
    assert len(ids) == 50 and all(i.startswith("req_") and len(i) == 28 for i in ids)



@pytest.mark.parametrize("refused", [False, True], ids=["accepted", "refused"])
async def test_a_session_retention_deleted_before_the_append_is_the_one_the_request_goes_on_in(
    database_url: str, refused: bool,
) -> None:
    """Retention deletes the session a request opened (cached) before its early append: the
    append opens it again, and the rest of the request (a compaction's event, the record, a
    refused request's cleanup) uses that row, not the deleted one."""
    store = await Store.open(database_url, pool_size=2)
    try:
        log = SessionLog(store)
        stale = await log.open_session("t", "s")
        report = await run_retention(database_url, RetentionPolicy(max_age_days=0), now=now() + timedelta(days=1))
        assert report.sessions == 1
        messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]
        digests, chain = digests_and_chain(messages)
        ctx = ChatContext(request_id=new_id("req"), tenant="t", session=stale, body={"model": "m", "messages": messages},
                          raw=b"", messages=messages, digests=digests, chain=chain, upstream_headers=[], stream=False,
                          started=time.perf_counter(), session_log=log, refused=refused)
        logged = await ctx.ensure_logged()  # as a compaction does before storing its event
        assert logged.added == 2 and ctx.session.pk != stale.pk
        with_writes = track_writes(ctx.writes)
        try:
            await store.add_event(EventRecord(id="e", session_pk=ctx.session.pk, kind="summary", anchor_hash=chain[-1],
                                              payload={}, tokens_before=2, tokens_after=1, created_at=now()))
        finally:
            untrack_writes(with_writes)
        pipeline = ChatPipeline(Settings(), log, None, Compactor(), load_counter(None),  # type: ignore[arg-type]
                                metrics=Metrics())  # (no upstream call)
        await pipeline.writer.finish(ctx, 403 if refused else 200, None if refused else {"role": "assistant", "content": "hi"}, None)
        session = await store.find_session("s", "t")
        assert session is not None and session.pk == ctx.session.pk
        rows, _ = await store.list_requests(session.pk, 10, None)
        assert [r.id for r in rows] == [ctx.request_id]
        assert (await store.session_summary(session)).message_count == (0 if refused else 3)
        assert [e.id for e in await store.list_events(session.pk)] == ([] if refused else ["e"])
    finally:
        await store.close()
