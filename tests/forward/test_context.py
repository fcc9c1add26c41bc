"""``ChatContext.start_append``: the one way the client's messages are written before the reply
(a stream's first byte, a compaction's ``ensure_logged``), once per request."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any

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
