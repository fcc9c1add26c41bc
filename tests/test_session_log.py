"""proxy/forward/session_log.py helpers."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import random
import time
from datetime import timedelta
from typing import Any

import pytest

from proxy.compaction.base import Compactor
from proxy.conversation.canonical import digests_and_chain
from proxy.conversation.prefix import STORED_SESSIONS_PER_PREFIX, PrefixStates
from proxy.forward.context import ChatContext
from proxy.forward.pipeline import ChatPipeline
from proxy.forward.session_log import SessionLog, new_id, now, settle
from proxy.settings import Settings
from proxy.telemetry.metrics import Metrics
from proxy.tokens.counter import load_counter
from storage.records import EventRecord, RequestRecord
from storage.refused import RequestWrites, track_writes, untrack_writes
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


def _record(session_pk: int) -> RequestRecord:
    return RequestRecord(id=new_id("req"), session_pk=session_pk, model="m", status=200, latency_ms=1.0, stream=False,
                         usage=None, added_messages=0, first_added_seq=None, tokens_client=None,
                         tokens_forwarded=None, created_at=now())


class _CountingStore:
    """``store`` with its ``stored_prefix_len`` calls counted."""

    def __init__(self, store: Store) -> None:
        self.store, self.reads = store, 0
        self.inner = store.stored_prefix_len

        async def counted(session_pk: int, chain: list[str]) -> int:
            self.reads += 1
            return await self.inner(session_pk, chain)

        store.stored_prefix_len = counted  # type: ignore[method-assign]


async def test_the_next_turn_skips_the_stored_prefix_query_until_the_session_is_gone(database_url: str) -> None:
    """The stored length lives in the conversation's prefix state (per session pk): the next turn
    of a session asks the store nothing; another session with the same history does; after a
    retention deletion the session is opened again and the query runs again."""
    store = await Store.open(database_url, pool_size=2)
    try:
        counting = _CountingStore(store)
        prefixes = PrefixStates()
        log = SessionLog(store, prefixes)
        session = await log.open_session("t", "s")
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
        for turn in range(3):
            _, chain = digests_and_chain(messages)
            reply = {"role": "assistant", "content": f"answer {turn}"}
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            log.finish(session, messages, chain, [], reply, _record(session.pk), with_request=True,
                       then=functools.partial(settle, done))
            await done
            assert counting.reads == 1, turn  # the first turn's only
            messages = [*messages, reply, {"role": "user", "content": f"question {turn}"}]
        summary = await store.session_summary(session)
        assert summary.message_count == len(messages) - 1
        rows, _ = await store.list_requests(session.pk, 10, None)
        assert sorted((r.added_messages, r.first_added_seq) for r in rows) == [(1, 0), (1, 2), (1, 4)]
        other = await log.open_session("t", "other")  # same history, another session: not its knowledge
        _, chain = digests_and_chain(messages)
        logged = await log.append_request(other, messages, chain)
        assert counting.reads == 2 and logged.added == len(messages)
        await log.append_request(other, messages, chain)
        assert counting.reads == 2  # now known for it too
        report = await run_retention(database_url, RetentionPolicy(max_age_days=0), now=now() + timedelta(days=1))
        assert report.sessions == 2
        logged = await log.append_request(session, messages, chain)  # MissingRow: opened again, all written
        assert logged.session is not None and logged.session.pk != session.pk
        assert logged.added == len(messages) and counting.reads == 3
    finally:
        await store.close()


async def test_a_refused_requests_cleanup_makes_the_next_request_read_again(database_url: str) -> None:
    store = await Store.open(database_url, pool_size=2)
    try:
        counting = _CountingStore(store)
        log = SessionLog(store)
        session = await log.open_session("t", "s")
        messages = [{"role": "user", "content": "hello"}]
        _, chain = digests_and_chain(messages)
        logged = await log.append_request(session, messages, chain)
        assert counting.reads == 1
        await log.finish_refused(session, dataclasses.replace(_record(session.pk), status=401), logged,
                                 RequestWrites())
        logged = await log.append_request(session, messages, chain)
        assert counting.reads == 2 and logged.added == 1  # deleted with the refused request: written again
    finally:
        await store.close()


def test_the_stored_lengths_stay_bounded_with_many_sessions_and_long_histories() -> None:
    prefixes = PrefixStates(max_positions=5_000)
    log = SessionLog(None, prefixes)  # type: ignore[arg-type]  (no store call)
    long_chain = digests_and_chain([{"role": "user", "content": f"m{i}"} for i in range(20_000)])[1]
    for pk in range(1_000):
        log._remember(pk, long_chain)
        assert log._known_prefix(pk, long_chain) == len(long_chain)
    state = prefixes.take(long_chain)
    assert len(state.stored) == STORED_SESSIONS_PER_PREFIX and len(prefixes) == 0
    assert log._known_prefix(999, long_chain) is None  # taken: unknown, so read
    prefixes.keep(long_chain, state)
    assert log._known_prefix(0, long_chain) is None  # the oldest noted sessions left the state
    assert log._known_prefix(999, long_chain) == len(long_chain)
    for k in range(10_000):
        log._remember(k, [f"hash {k}"])
    assert len(prefixes) <= 5_000


async def test_the_reads_without_a_coroutine_answer_as_the_reads_do(database_url: str) -> None:
    """``session_now``, and ``internal_now`` with ``expand``: ``None`` until cached, then what
    ``open_session`` and ``expand_internal`` answer (the proxy's own round put back where it ran)."""
    store = await Store.open(database_url, pool_size=2)
    try:
        log = SessionLog(store)
        assert log.session_now("t", "s") is None
        session = await log.open_session("t", "s")
        assert log.session_now("t", "s") is session
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
        digests, chain = digests_and_chain(messages)
        assert log.internal_now(session.pk) is None  # not read yet
        assert await log.expand_internal(session, messages, digests, chain) is None
        assert log.internal_now(session.pk) == []
        assert log.expand([], messages, digests, chain) is None
        internal = [{"role": "assistant", "content": None,
                     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "r", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "read"}]
        reply = {"role": "assistant", "content": "done"}
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        log.finish(session, messages, chain, internal, reply, _record(session.pk), with_request=True,
                   then=functools.partial(settle, done))
        await done
        following = [*messages, reply, {"role": "user", "content": "again"}]
        digests, chain = digests_and_chain(following)
        assert log.internal_now(session.pk) is None  # the write dropped the cached list: read again
        read = await log.expand_internal(session, following, digests, chain)
        assert read is not None and read[0] == [*messages, *internal, *following[1:]]
        cached = log.internal_now(session.pk)
        assert cached is not None and len(cached) == 2
        assert log.expand(cached, following, digests, chain) == read
    finally:
        await store.close()


async def test_a_cached_session_is_served_without_the_coroutines(
    inprocess_proxy: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pipeline's second request of a session finds its row and its (no) internal rounds
    cached: ``open_session`` and ``expand_internal`` are not called; the first calls both."""
    calls: list[str] = []
    open_session, expand_internal = SessionLog.open_session, SessionLog.expand_internal

    async def opened(self: SessionLog, *args: Any, **kwargs: Any) -> Any:
        calls.append("open_session")
        return await open_session(self, *args, **kwargs)

    async def expanded(self: SessionLog, *args: Any, **kwargs: Any) -> Any:
        calls.append("expand_internal")
        return await expand_internal(self, *args, **kwargs)

    monkeypatch.setattr(SessionLog, "open_session", opened)
    monkeypatch.setattr(SessionLog, "expand_internal", expanded)
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}
    first = await inprocess_proxy.chat(body, headers={"x-session-id": "cached"})
    assert first.status_code == 200 and calls == ["open_session", "expand_internal"]
    second = await inprocess_proxy.chat(body, headers={"x-session-id": "cached"})
    assert second.status_code == 200 and calls == ["open_session", "expand_internal"]
    assert second.json()["choices"] == first.json()["choices"]
    assert second.headers["x-context-proxy-session-id"] == first.headers["x-context-proxy-session-id"] == "cached"
