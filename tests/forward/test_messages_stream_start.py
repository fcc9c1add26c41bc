"""proxy/forward/messages_stream.py: a Messages stream's held start goes out before its events are
read (the first byte waits for no parsing), a relay closed at a chunk still logs what that chunk
carried, and holding splits a chunk only up to the first content block, its text deltas then read
by the template. A real store, session log and log writer; the upstream is a fake response."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.conversation.canonical import digests_and_chain
from proxy.forward.answers import Streamed
from proxy.forward.context import ChatContext
from proxy.forward.db_health import DatabaseHealth
from proxy.forward.log_writer import LogWriter
from proxy.forward.messages_start import StreamStart
from proxy.forward.messages_stream import MessagesStream
from proxy.forward.session_log import SessionLog, new_id
from proxy.settings import Settings
from proxy.telemetry.metrics import Metrics
from storage.records import SessionRecord
from tests.fakes.anthropic import reply, text
from tests.fakes.anthropic.cache import CacheUsage
from tests.fakes.anthropic.compose import compose
from tests.fakes.anthropic.thinking import ThinkingSigner
from tests.fakes.anthropic.wire import message_object, sse_event, stream_events, usage_object
from tests.test_text_template import Counted


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


async def _relay(log: SessionLog, parts: list[bytes]) -> tuple[StreamStart, Streamed, LogWriter, SessionRecord]:
    resp = _Parts(parts)
    settings = Settings()
    start = await StreamStart.read(resp, 1 << 20, {})  # type: ignore[arg-type]
    messages = [{"role": "user", "content": "hi"}]
    digests, chain = digests_and_chain(messages)
    session = await log.open_session("t", "s", "messages")
    ctx = ChatContext(request_id=new_id("req"), tenant="t", session=session, body={"model": "m", "stream": True},
                      raw=b"", messages=messages, digests=digests, chain=chain, upstream_headers=[], stream=True,
                      started=time.perf_counter(), session_log=log)
    writer = LogWriter(settings, log, Metrics(), DatabaseHealth(log.store))
    streams = MessagesStream(settings, None, writer, None, None)  # type: ignore[arg-type]
    return start, streams.relay(ctx, resp, {}, start, "/v1/messages"), writer, session  # type: ignore[arg-type]


async def _logged(log: SessionLog, writer: LogWriter, session: SessionRecord) -> tuple[str | None, Any]:
    """The request record's error and the assistant message logged (``None``: none)."""
    await writer.drain()
    rows, _ = await log.store.list_requests(session.pk, 10, None)
    leaf = await log.store.branch_leaf(session.pk, None)
    assert len(rows) == 1 and leaf is not None
    return rows[0].error, (leaf.message if leaf.role == "assistant" else None)


async def _close(streamed: Streamed) -> None:
    assert streamed.close is not None
    await streamed.close()


async def test_the_start_goes_out_before_its_events_are_read(log: SessionLog) -> None:
    events = _events()
    at = next(i for i, e in enumerate(events) if e.startswith(b"event: content_block_delta")) + 1
    first, rest = b"".join(events[:at]), events[at:]  # up to the first text delta: one read
    start, streamed, writer, session = await _relay(log, [first, *rest])
    assert start.held == [first] and not start.assembler.message()["content"]  # held, not read
    assert await anext(streamed.chunks) == first
    assert start.assembler.message()["content"] == []  # out before it was read
    assert b"".join([part async for part in streamed.chunks]) == b"".join(rest)
    await _close(streamed)
    error, reply = await _logged(log, writer, session)
    assert error is None and reply == {"role": "assistant", "content": [{"type": "text", "text": "Hello there"}]}


@pytest.mark.parametrize("where", ["held start", "message_stop", "before the first byte"])
async def test_a_relay_closed_at_a_chunk_logs_what_the_client_was_sent(log: SessionLog, where: str) -> None:
    """One event a chunk; the client leaves after the held start, after the chunk that carries
    ``message_stop`` (complete all the same), or before the first byte (the start as held)."""
    events = _events()
    start, streamed, writer, session = await _relay(log, list(events))
    got: list[bytes] = []
    if where == "message_stop":
        while not (got and got[-1].startswith(b"event: message_stop")):
            got.append(await anext(streamed.chunks))
    elif where == "held start":
        got = [await anext(streamed.chunks) for _ in start.held]
    await _close(streamed)
    error, reply = await _logged(log, writer, session)
    assert reply is not None and reply["content"], where  # as far as the client got it
    text = reply["content"][0]["text"]
    if where == "message_stop":
        assert error is None and text == "Hello there" and "x_context_proxy" not in reply
    else:
        assert error is not None and "Hello there".startswith(text)


def _long_text_events() -> tuple[list[bytes], str]:
    """A stream of one text block in 30 deltas (``text_pieces``: three words a delta), and its text."""
    words = " ".join(f"word{i}" for i in range(90))
    body: Any = {"model": "m", "max_tokens": 512, "messages": [{"role": "user", "content": "hi"}]}
    composed = compose(body, reply(text(words)), ThinkingSigner())
    usage = usage_object(CacheUsage(10, 0, 0), composed.output_tokens, "5m")
    message = message_object("msg_01x", "m", composed.content, composed.stop_reason, None, usage)
    return [sse_event(name, data) for name, data in stream_events(message)], words


async def test_the_held_start_splits_its_chunk_up_to_the_first_content_block_and_keeps_the_rest() -> None:
    """The whole stream in one chunk: holding reads message_start, ping and content_block_start
    (the event that ends it); the deltas and the end are left unsplit in ``tail``."""
    events, _ = _long_text_events()
    whole = b"".join(events)
    start = await StreamStart.read(_Parts([whole]), 1 << 20, {})  # type: ignore[arg-type]
    assert start.held == [whole] and start.overflow is None and not start.ended
    assert [e.event for e in start.events] == ["message_start", "ping", "content_block_start"]
    assert start.tail == b"".join(events[3:]) and start.splitter.idle


async def test_the_held_chunk_s_text_deltas_are_read_by_the_template_in_the_relay(log: SessionLog) -> None:
    """The whole stream in one chunk, relayed: the first delta is read whole (the template learned
    from it), the 29 others by the template, and the logged reply is the text."""
    events, words = _long_text_events()
    deltas = sum(e.startswith(b"event: content_block_delta") for e in events)
    start, streamed, writer, session = await _relay(log, [b"".join(events)])
    start.assembler.template = counted = Counted()
    assert b"".join([part async for part in streamed.chunks]) == b"".join(events)
    await _close(streamed)
    assert deltas == 30 and counted.read == deltas - 1
    error, logged = await _logged(log, writer, session)
    assert error is None and logged == {"role": "assistant", "content": [{"type": "text", "text": words}]}
