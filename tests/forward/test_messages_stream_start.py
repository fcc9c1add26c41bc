"""proxy/forward/messages_stream.py: a Messages stream's held start goes out before its events are
read (the first byte waits for no parsing), and a relay closed at a chunk still logs what that
chunk carried. A real store, session log and log writer; the upstream is a fake response."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.conversation.canonical import digests_and_chain
from proxy.forward.context import ChatContext
from proxy.forward.db_health import DatabaseHealth
from proxy.forward.log_writer import LogWriter
from proxy.forward.messages_stream import MessagesStream, StreamStart
from proxy.forward.session_log import SessionLog, new_id
from proxy.settings import Settings
from proxy.telemetry.metrics import Metrics
from storage.store import Store
from tests.fakes.anthropic import reply, text
from tests.fakes.anthropic.cache import CacheUsage
from tests.fakes.anthropic.compose import compose
from tests.fakes.anthropic.thinking import ThinkingSigner
from tests.fakes.anthropic.wire import message_object, sse_event, stream_events, usage_object


class _Parts:
    """An upstream response whose body arrives as ``parts``."""

    status_code = 200

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts
        self.headers = {"content-type": "text/event-stream"}

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part

    async def aclose(self) -> None:
        pass


def _events() -> list[bytes]:
    body: Any = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    composed = compose(body, reply(text("Hello there")), ThinkingSigner())
    usage = usage_object(CacheUsage(10, 0, 0), composed.output_tokens, "5m")
    message = message_object("msg_01x", "m", composed.content, composed.stop_reason, None, usage)
    return [sse_event(name, data) for name, data in stream_events(message)]


@pytest.fixture
async def log(database_url: str) -> AsyncIterator[SessionLog]:
    store = await Store.open(database_url, pool_size=2)
    try:
        yield SessionLog(store)
    finally:
        await store.close()


@pytest.mark.parametrize("close_after", [1, None])
async def test_the_start_goes_out_before_its_events_are_read(log: SessionLog, close_after: int | None) -> None:
    events = _events()
    at = next(i for i, e in enumerate(events) if e.startswith(b"event: content_block_delta")) + 1
    first, rest = b"".join(events[:at]), events[at:]  # up to the first text delta: one read
    resp = _Parts([first, *rest])
    settings = Settings()
    start = await StreamStart.read(resp, 1 << 20, {})  # type: ignore[arg-type]
    assert start.held == [first] and not start.assembler.message()["content"]  # held, not read
    messages = [{"role": "user", "content": "hi"}]
    digests, chain = digests_and_chain(messages)
    session = await log.open_session("t", "s", "messages")
    ctx = ChatContext(request_id=new_id("req"), tenant="t", session=session, body={"model": "m", "stream": True},
                      raw=b"", messages=messages, digests=digests, chain=chain, upstream_headers=[], stream=True,
                      started=time.perf_counter(), session_log=log)
    writer = LogWriter(settings, log, Metrics(), DatabaseHealth(log.store))
    streams = MessagesStream(settings, None, writer, None, None)  # type: ignore[arg-type]
    streamed = streams.relay(ctx, resp, {}, start, "/v1/messages")  # type: ignore[arg-type]
    relay = streamed.chunks
    assert await anext(relay) == first
    assert start.assembler.message()["content"] == []  # out before it was read
    if close_after == 1:
        assert streamed.close is not None
        await streamed.close()  # the client left at the first chunk
    else:
        assert b"".join([part async for part in relay]) == b"".join(rest)
        assert streamed.close is not None
        await streamed.close()
    await writer.drain()
    rows, _ = await log.store.list_requests(session.pk, 10, None)
    content = start.assembler.message()["content"]
    assert len(rows) == 1 and len(content) == 1 and content[0]["type"] == "text"
    if close_after is None:
        assert content[0]["text"] == "Hello there" and rows[0].error is None
    else:  # the first chunk's text, logged as a partial reply
        assert content[0]["text"] and "Hello there".startswith(content[0]["text"]) and rows[0].error is not None
