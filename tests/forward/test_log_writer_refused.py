"""proxy/forward/log_writer.py: a refused request's cleanup waits for the writes already pending.

The cleanup (``Store.record_refused``) keeps what a request recorded by then relies on; a request
answered before the refusal, its write still pending, must be recorded first (issue 18, F2: its
forwarded body named an artifact the cleanup deleted). A real store and session log; no sockets.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from proxy.conversation.canonical import digests_and_chain
from proxy.forward.context import ChatContext
from proxy.forward.db_health import DatabaseHealth
from proxy.forward.log_writer import LogWriter
from proxy.forward.session_log import LoggedRequest, SessionLog, new_id
from proxy.settings import Settings
from proxy.telemetry.metrics import Metrics
from storage.refused import RequestWrites


async def _ctx(log: SessionLog, *, refused: bool = False) -> ChatContext:
    messages = [{"role": "user", "content": "hello"}]
    digests, chain = digests_and_chain(messages)
    session = await log.open_session("t", "s")
    return ChatContext(request_id=new_id("req"), tenant="t", session=session,
                       body={"model": "m", "messages": messages}, raw=b"", messages=messages, digests=digests,
                       chain=chain, upstream_headers=[], stream=False, started=time.perf_counter(), session_log=log,
                       refused=refused)


async def test_a_refused_requests_cleanup_starts_after_the_writes_pending_when_it_finished(log: SessionLog) -> None:
    writer = LogWriter(Settings(), log, Metrics(), DatabaseHealth(log.store))
    order: list[str] = []
    gate = asyncio.Event()

    async def earlier_write() -> None:  # another request's write, pending (say, a slow commit)
        await gate.wait()
        order.append("earlier write")

    writer.spawn(earlier_write())
    finish_refused = log.finish_refused

    async def noted(session: Any, record: Any, logged: LoggedRequest | None, writes: RequestWrites) -> list[str]:
        order.append("cleanup")
        return await finish_refused(session, record, logged, writes)

    log.finish_refused = noted  # type: ignore[method-assign]
    ended = writer.finish(await _ctx(log, refused=True), 403, None, None, error="refused")
    for _ in range(5):  # let the refused write's task run as far as it goes
        await asyncio.sleep(0)
    assert order == []  # waiting for the earlier write
    gate.set()
    await asyncio.wait_for(ended, 10)
    assert order == ["earlier write", "cleanup"]
    later = writer.finish(await _ctx(log), 200, {"role": "assistant", "content": "hi"}, None)
    await asyncio.wait_for(later, 10)  # a write that is not refused waits for nothing
    assert not writer._pending


async def test_a_refused_request_with_nothing_pending_is_recorded_at_once(log: SessionLog) -> None:
    writer = LogWriter(Settings(), log, Metrics(), DatabaseHealth(log.store))
    ctx = await _ctx(log, refused=True)
    await asyncio.wait_for(writer.finish(ctx, 401, None, None, error="refused"), 10)
    session = await log.store.find_session("s", "t")
    assert session is not None
    rows, _ = await log.store.list_requests(session.pk, 10, None)
    assert [(r.id, r.status, r.added_messages) for r in rows] == [(ctx.request_id, 401, 0)]


async def test_after_the_answer_the_write_is_queued_in_the_next_loop_step_with_the_latency_of_now(
        log: SessionLog) -> None:
    """``after_answer``: the request is finished and pending at once; its rows are built and queued
    in the next step (the answer goes out first), before anything scheduled after it runs."""
    writer = LogWriter(Settings(), log, Metrics(), DatabaseHealth(log.store))
    ctx = await _ctx(log)
    queued: list[float] = []
    finish = log.finish

    def noted(*args: Any, **kwargs: Any) -> None:
        queued.append(args[5].latency_ms)  # (the record)
        finish(*args, **kwargs)

    log.finish = noted  # type: ignore[method-assign]
    ended = writer.finish(ctx, 200, {"role": "assistant", "content": "hi"}, None, after_answer=True)
    measured = (time.perf_counter() - ctx.started) * 1000
    time.sleep(0.05)  # noqa: ASYNC251  (the answer being sent, in this loop step: not in the latency)
    assert ctx.finished and ended in writer._pending and queued == []
    later: list[int] = []
    asyncio.get_running_loop().call_soon(lambda: later.append(len(queued)))  # what the answer leads to
    await asyncio.sleep(0)
    assert len(queued) == 1 and later == [1] and queued[0] <= measured
    await asyncio.wait_for(ended, 10)
    rows, _ = await log.store.list_requests(ctx.session.pk, 10, None)
    assert [(r.id, r.status) for r in rows] == [(ctx.request_id, 200)] and rows[0].latency_ms < 50
