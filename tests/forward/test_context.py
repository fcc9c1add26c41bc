"""``ChatContext.start_append``: the one way the client's messages are written before the reply
(a stream's first byte, a compaction's ``ensure_logged``), once per request."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any

import pytest

from proxy.forward.context import ChatContext
from proxy.forward.session_log import LoggedRequest
from storage.records import SessionRecord


class _CountingLog:
    """A ``SessionLog`` stand-in that counts its ``append_request`` calls."""

    def __init__(self) -> None:
        self.appends = 0

    async def append_request(self, session: SessionRecord, messages: list[dict[str, Any]],
                             chain: list[str]) -> LoggedRequest:
        self.appends += 1
        await asyncio.sleep(0)
        return LoggedRequest(added=len(messages), first_added_seq=0)


def _ctx(log: _CountingLog) -> ChatContext:
    now = datetime.now(UTC)
    session = SessionRecord(pk=1, session_id="s", tenant="t", created_at=now, updated_at=now)
    return ChatContext(request_id="req_1", tenant="t", session=session, body={"model": "m"}, raw=b"{}",
                       messages=[{"role": "user", "content": "hi"}], digests=["d"], chain=["c"],
                       upstream_headers=[], stream=True, started=0.0, session_log=log)  # type: ignore[arg-type]


async def test_the_messages_are_written_once_whoever_starts_first() -> None:
    log = _CountingLog()
    ctx = _ctx(log)
    spawned: list[asyncio.Task[LoggedRequest]] = []

    def spawn(coro: Coroutine[Any, Any, LoggedRequest]) -> asyncio.Task[LoggedRequest]:
        spawned.append(asyncio.ensure_future(coro))
        return spawned[-1]

    first = ctx.start_append(spawn)  # the stream's first byte
    assert ctx.start_append(spawn) is first and len(spawned) == 1
    logged = await ctx.ensure_logged()  # then a compaction: the same write
    assert (log.appends, logged.added, ctx.append_task) == (1, 1, first)


async def test_ensure_logged_alone_starts_the_write() -> None:
    log = _CountingLog()
    ctx = _ctx(log)
    assert (await ctx.ensure_logged()).added == 1
    assert ctx.start_append() is ctx.append_task and log.appends == 1


async def test_the_pipeline_builds_each_field_from_its_source(
    inprocess_proxy: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ChatPipeline.handle`` passes the context's fields by position: each holds what its name
    says (the ids, the body and its bytes, the digests and chain hashes in their places, the flags)."""
    from proxy.conversation.canonical import digests_and_chain
    from proxy.forward.pipeline import ChatPipeline

    seen: list[ChatContext] = []
    run = ChatPipeline._run

    async def kept(self: ChatPipeline, ctx: ChatContext) -> Any:
        seen.append(ctx)
        return await run(self, ctx)

    monkeypatch.setattr(ChatPipeline, "_run", kept)
    body = {"model": "gpt-4o-mini", "messages": [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "hello"}]}
    resp = await inprocess_proxy.chat(body, headers={"x-session-id": "fields", "x-context-proxy-compact-tool": "on"})
    assert resp.status_code == 200
    (ctx,) = seen
    pipeline = inprocess_proxy.app.state.proxy.pipeline
    digests, chain = digests_and_chain(body["messages"])
    assert ctx.request_id == resp.headers["x-context-proxy-request-id"] and ctx.request_id.startswith("req_")
    assert ctx.tenant and ctx.session.session_id == "fields" and ctx.session.tenant == ctx.tenant
    assert ctx.body == body and ctx.messages == body["messages"] and ctx.raw == resp.request.content
    assert (ctx.digests, ctx.chain) == (digests, chain)
    assert ("content-type", "application/json") in ctx.upstream_headers  # the client's, forwarded
    assert ctx.stream is False and ctx.compact_tool is True and ctx.expanded is False
    assert ctx.started > 0 and ctx.session_log is pipeline.log and ctx.compactor is pipeline.compactor
    assert ctx.model == "gpt-4o-mini" and ctx.internal == [] and ctx.prepared is not None
