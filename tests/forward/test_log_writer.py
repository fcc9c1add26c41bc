"""proxy/forward/log_writer.py: one end-of-request write call, tracked until it ended.

A real store (SQLite file, and PostgreSQL where the store runs the write as a task) and a real
session log; no upstream, no sockets.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from typing import Any

import pytest

from proxy.conversation.canonical import digests_and_chain
from proxy.forward.context import ChatContext
from proxy.forward.db_health import DatabaseHealth
from proxy.forward.log_writer import LogWriter
from proxy.forward.session_log import SessionLog, new_id
from proxy.settings import Settings
from proxy.telemetry.logs import bind_request, current_context, request_context
from proxy.telemetry.metrics import Metrics
from storage.store import Store

REPLY = {"role": "assistant", "content": "hi"}


def _writer(log: SessionLog, **settings: Any) -> LogWriter:
    return LogWriter(Settings(**settings), log, Metrics(), DatabaseHealth(log.store))


async def _ctx(log: SessionLog, session_id: str, text: str = "hello", *, request_id: str | None = None) -> ChatContext:
    messages = [{"role": "user", "content": text}]
    digests, chain = digests_and_chain(messages)
    session = await log.open_session("t", session_id)
    return ChatContext(request_id=request_id or new_id("req"), tenant="t", session=session,
                       body={"model": "m", "messages": messages}, raw=b"", messages=messages, digests=digests,
                       chain=chain, upstream_headers=[], stream=False, started=time.perf_counter(), session_log=log)


async def _requests(log: SessionLog, session_id: str) -> list[str]:
    session = await log.store.find_session(session_id, "t")
    assert session is not None
    rows, _ = await log.store.list_requests(session.pk, 100, None)
    return [r.id for r in rows]


async def test_finish_is_one_call_whose_future_ends_when_the_write_is_stored(log: SessionLog, database_url: str) -> None:
    """The end of a request starts its write at once; the returned future resolves once the reply
    and the record are stored. On a SQLite file, for a session whose history this process knows,
    no task is made for it (the write is queued in the store's deferred batch)."""
    writer = _writer(log)
    first = await _ctx(log, "s")
    await writer.finish(first, 200, REPLY, None)  # the history is not known yet: read, then written
    assert await _requests(log, "s") == [first.request_id]
    second = await _ctx(log, "s")
    second.messages = [*first.messages, REPLY, {"role": "user", "content": "again"}]
    second.digests, second.chain = digests_and_chain(second.messages)
    tasks = len(asyncio.all_tasks())
    ended = writer.finish(second, 200, REPLY, None)
    assert second.finished
    if database_url.startswith("sqlite"):
        assert len(asyncio.all_tasks()) == tasks, "a task was made for a write the store could queue"
    assert writer.full is False and len(writer._pending) == 1
    await ended
    assert not writer._pending
    assert await _requests(log, "s") == [first.request_id, second.request_id]
    session = await log.store.find_session("s", "t")
    assert session is not None and (await log.store.session_summary(session)).message_count == 4


async def test_the_end_of_a_write_is_handled_in_the_loop_step_that_settles_it(tmp_path: Any) -> None:
    """On a SQLite file, once the deferred batch committed a request's write, the session log's
    bookkeeping, the log writer's and the end of its tracking run as one callback: one loop step
    later the request is no longer pending and its future is resolved (it took three steps, a
    future handing on to the next, when each layer had a future of its own)."""
    from storage.migrate import upgrade

    url = f"sqlite:///{tmp_path}/steps.db"
    await upgrade(url)
    store = await Store.open(url, pool_size=2)
    log = SessionLog(store)
    writer = _writer(log)
    first = await _ctx(log, "steps")
    await writer.finish(first, 200, REPLY, None)
    second = await _ctx(log, "steps")  # (its history is known stored: its write is queued)
    second.messages = [*first.messages, REPLY, {"role": "user", "content": "again"}]
    second.digests, second.chain = digests_and_chain(second.messages)
    ended = writer.finish(second, 200, REPLY, None)
    try:
        assert store._sqlite is not None
        store._sqlite.batch.flush()
        assert not ended.done() and len(writer._pending) == 1  # (the callback runs in a later step, never inline)
        await asyncio.sleep(0)
        assert ended.done() and not writer._pending
        assert await _requests(log, "steps") == [first.request_id, second.request_id]
    finally:
        await store.close()


async def test_a_failed_write_is_logged_in_the_requests_context_and_never_raised(
        log: SessionLog, caplog: pytest.LogCaptureFixture) -> None:
    """A write the database refuses (a request id taken) resolves the future all the same; the
    failure is logged once, with the request's ids, on a line emitted in the request's own
    context (its ``bind`` fields), and counted."""
    writer = _writer(log)
    ctx = await _ctx(log, "dup", request_id="req_taken")
    await writer.finish(ctx, 200, REPLY, None)
    seen: list[dict[str, str]] = []

    class Context(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            seen.append(current_context())
            return True

    again = await _ctx(log, "dup", "other", request_id="req_taken")
    logger = logging.getLogger("context_proxy.pipeline")
    context_filter = Context()
    logger.addFilter(context_filter)
    try:
        with caplog.at_level(logging.ERROR, logger="context_proxy.pipeline"), request_context():
            bind_request(again.request_id, "dup-session", None)
            ended = writer.finish(again, 200, REPLY, None)
        await ended  # resolved, not raised, outside the request's context
    finally:
        logger.removeFilter(context_filter)
    failed = [r for r in caplog.records if r.getMessage() == "logging the reply failed"]
    assert len(failed) == 1 and failed[0].request_id == "req_taken" and failed[0].exc_info is not None
    assert seen == [{"request_id": "req_taken", "session_id": "dup-session"}]
    assert 'context_proxy_database_errors_total{where="log"} 1.0' in writer.metrics.render()[0].decode()


async def test_pending_writes_hold_new_requests_back_and_drain_waits_without_polling(tmp_path: Any) -> None:
    """With the database locked, ``max_pending_log_writes`` pending writes make the writer
    ``full``: ``wait_for_room`` waits until one ends. ``drain`` returns as soon as the writes
    ended (woken by their futures) and gives up at its timeout on one that does not end."""
    from storage.migrate import upgrade

    url = f"sqlite:///{tmp_path}/locked.db"
    await upgrade(url)
    store = await Store.open(url, pool_size=2)
    log = SessionLog(store)
    writer = _writer(log, max_pending_log_writes=2)
    try:
        warm = [await _ctx(log, f"s{i}") for i in range(3)]
        for ctx in warm:
            await writer.finish(ctx, 200, REPLY, None)
        lock = sqlite3.connect(tmp_path / "locked.db", isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        try:
            ended = []
            for ctx in warm[:2]:
                again = await _ctx(log, ctx.session.session_id)
                again.messages = [*ctx.messages, REPLY, {"role": "user", "content": "more"}]
                again.digests, again.chain = digests_and_chain(again.messages)
                ended.append(writer.finish(again, 200, REPLY, None))
            assert writer.full
            room = asyncio.ensure_future(writer.wait_for_room())
            await asyncio.sleep(0.3)
            assert not room.done(), "room was made while both writes waited for the lock"
        finally:
            lock.execute("COMMIT")
            lock.close()
        await asyncio.wait_for(room, 15)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await writer.drain(timeout_s=15)
        assert all(e.done() for e in ended) and not writer._pending
        assert loop.time() - started < 5
        stuck = writer.spawn(asyncio.sleep(30))
        started = loop.time()
        await writer.drain(timeout_s=0.2)
        assert 0.15 < loop.time() - started < 2 and not stuck.done()
        stuck.cancel()
        assert 'context_proxy_database_errors_total{where="backpressure"}' in writer.metrics.render()[0].decode()
    finally:
        await store.close()


async def test_a_refused_request_keeps_only_its_record(log: SessionLog) -> None:
    """A request whose key the provider refused: its write (a task: it deletes what the request
    stored itself) keeps the record and none of the messages."""
    writer = _writer(log)
    ctx = await _ctx(log, "refused")
    ctx.refused = True
    await writer.finish(ctx, 401, None, None, error="the upstream refused the client's key (401)")
    assert await _requests(log, "refused") == [ctx.request_id]
    session = await log.store.find_session("refused", "t")
    assert session is not None and (await log.store.session_summary(session)).message_count == 0


async def test_a_reply_that_cannot_be_logged_is_reported_not_raised(log: SessionLog,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """What building the rows raises (a reply orjson cannot write: an integer beyond 64 bits, which
    no parsed reply holds; one nested deeper than it writes is written, ``proxy.json_depth``) is
    the write's failure: logged, and the future resolves."""
    writer = _writer(log)
    odd: dict[str, Any] = {"role": "assistant", "content": "x", "n": 2**70}
    ctx = await _ctx(log, "odd")
    with caplog.at_level(logging.ERROR, logger="context_proxy.pipeline"):
        await writer.finish(ctx, 200, odd, None)
    assert any(r.getMessage() == "logging the reply failed" for r in caplog.records)


async def test_finish_looks_the_running_loop_up_once(log: SessionLog, monkeypatch: pytest.MonkeyPatch) -> None:
    """``finish`` takes the running loop once (on Python 3.11 each lookup is a ``getpid`` system
    call) for its future and the queued write: it took two; the write is stored as before."""
    writer = _writer(log)
    ctx = await _ctx(log, "once")
    real = asyncio.get_running_loop
    looked_up: list[int] = []

    def counting() -> asyncio.AbstractEventLoop:
        looked_up.append(1)
        return real()

    monkeypatch.setattr(asyncio, "get_running_loop", counting)
    ended = writer.finish(ctx, 200, REPLY, None, after_answer=True)
    assert len(looked_up) == 1
    monkeypatch.setattr(asyncio, "get_running_loop", real)
    await ended
    assert await _requests(log, "once") == [ctx.request_id]


def test_the_record_is_built_by_position_in_the_fields_order() -> None:
    """``log_writer._record`` passes ``RequestRecord``'s fields by position: in this order (a
    field added or moved fails here, not in a stored row)."""
    import dataclasses

    from storage.records import RequestRecord

    assert [f.name for f in dataclasses.fields(RequestRecord)] == [
        "id", "session_pk", "model", "status", "latency_ms", "stream", "usage", "added_messages", "first_added_seq",
        "tokens_client", "tokens_forwarded", "defenses", "event_ids", "error", "created_at", "finish_reason",
        "overflow_retries"]


async def test_the_record_holds_the_requests_values(log: SessionLog) -> None:
    """``_record`` of a request: each value in its field (the same record as by keyword)."""
    from proxy.compaction.base import Prepared
    from proxy.forward.log_writer import _record
    from proxy.forward.session_log import LoggedRequest
    from storage.records import RequestRecord

    ctx = await _ctx(log, "record")
    ctx.prepared = Prepared(b"{}", 11, 7, ("offload",), ("ev_1",), None, frozenset(), None, None)
    ctx.retries = 2
    ctx.stream = True
    usage = {"prompt_tokens": 3}
    record = _record(ctx, 12.5, 200, usage, LoggedRequest(4, 9), "bad\x00", "stop")
    assert record == RequestRecord(
        id=ctx.request_id, session_pk=ctx.session.pk, model="m", status=200, latency_ms=12.5, stream=True,
        usage=usage, added_messages=4, first_added_seq=9, tokens_client=11, tokens_forwarded=7,
        defenses=["offload"], event_ids=["ev_1"], error="bad", created_at=None, finish_reason="stop",
        overflow_retries=2)
