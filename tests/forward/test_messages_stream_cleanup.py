"""A Messages stream relayed to its end through ``send_stream`` (``proxy.routes.answer``): its
cleanup (the reply logged, the upstream response released) ends as it did when ``close`` ran it
under ``send_stream``'s shield, after the body's end was sent: a failure in logging the reply does
not cost the client the end of its body nor the upstream response its release (and a reply nested
deeper than the recursive helpers go is no such failure: it is logged), and a client that leaves
while the relay releases the upstream response does not stop that release halfway."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from proxy.forward.messages_start import StreamStart
from proxy.forward.messages_stream import MessagesStream
from proxy.routes.answer import send_stream
from proxy.settings import Settings
from proxy.upstream.client import HeldResponse
from proxy.upstream.httpx_transport import HttpxResponse
from tests.fakes.anthropic.wire import message_object, sse_event, stream_events
from tests.forward.test_messages_stream_hold_reference import _Context, _Writer
from tests.support.values import nested, same
from tests.test_streaming import Parts

_USAGE = {"input_tokens": 10, "output_tokens": 3}
_SENT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class _Sent(list):  # type: ignore[type-arg]
    """An ASGI ``send`` keeping what it is sent."""

    async def __call__(self, message: dict) -> None:  # type: ignore[type-arg]
        self.append(message)


def _stream(blocks: list[dict[str, Any]]) -> list[bytes]:
    message = message_object("msg_01", "m", blocks, "end_turn", None, _USAGE)
    return [sse_event(name, data) for name, data in stream_events(message)]


async def _stay() -> dict[str, str]:
    await asyncio.sleep(3600)  # (the client stays)
    return {"type": "http.disconnect"}


async def test_a_reply_nested_deeper_than_the_recursive_helpers_go_is_logged_whole_and_relayed_unchanged() -> None:
    """A tool call whose input nests 500 arrays deep: past ``hash_view``'s recursion and orjson's
    writer. Before, logging it raised ``RecursionError`` (``close`` raised it after ``send_stream``
    had sent the body's end and released the upstream response): the reply was never logged.
    Now it is logged, once, its input whole (the same value); the client's stream is the
    upstream's bytes, ended, and the upstream response released, as before."""
    deep = "[" * 500 + "]" * 500
    events = [
        sse_event("message_start", {"type": "message_start", "message": message_object(
            "msg_01", "m", [], None, None, _USAGE)}),
        sse_event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {
            "type": "tool_use", "id": "toolu_01", "name": "f", "input": {}}}),
        sse_event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {
            "type": "input_json_delta", "partial_json": '{"a": ' + deep + "}"}}),
        sse_event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        sse_event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use",
                                                                       "stop_sequence": None},
                                    "usage": {"output_tokens": 3}}),
        sse_event("message_stop", {"type": "message_stop"}),
    ]
    resp = Parts(*events)
    start = await StreamStart.read(resp, 1 << 20, _SENT)  # type: ignore[arg-type]
    writer = _Writer()
    streamed = MessagesStream(Settings(), None, writer, None, None).relay(  # type: ignore[arg-type]
        _Context(), resp, {}, start, "/v1/messages")  # type: ignore[arg-type]
    sent = _Sent()
    await send_stream(streamed, _stay, sent)  # type: ignore[arg-type]
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}  # the body's end is out
    assert b"".join(m.get("body", b"") for m in sent[1:]) == b"".join(events)
    assert resp.closed  # the upstream response released
    assert len(writer.finished) == 1 and writer.finished[0].get("error") is None
    (block,) = writer.finished[0]["reply"]["content"]
    assert block["id"] == "toolu_01" and same(block["input"], {"a": nested(500)})


class _FailingWriter(_Writer):
    """A ``LogWriter`` whose ``finish`` raises (a log that cannot be written, whatever the reason)."""

    def finish(self, ctx: Any, status: int, reply: Any, usage: Any, **kwargs: Any) -> None:
        raise RuntimeError("the log failed")


async def test_a_reply_the_log_fails_on_still_ends_the_client_s_body_and_releases_the_upstream() -> None:
    """Logging the reply raises (as a reply nested too deep for ``hash_view`` once did): ``close``
    raises it after ``send_stream`` sent the body's end and after the upstream response was
    released; the relay does not raise it before the body's end (the client would see its
    complete stream cut), nor skip the release."""
    events = _stream([{"type": "text", "text": "Hello there"}])
    resp = Parts(*events)
    start = await StreamStart.read(resp, 1 << 20, _SENT)  # type: ignore[arg-type]
    streamed = MessagesStream(Settings(), None, _FailingWriter(), None, None).relay(  # type: ignore[arg-type]
        _Context(), resp, {}, start, "/v1/messages")  # type: ignore[arg-type]
    sent = _Sent()
    with pytest.raises(RuntimeError, match="the log failed"):
        await send_stream(streamed, _stay, sent)  # type: ignore[arg-type]
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}  # the body's end is out
    assert b"".join(m.get("body", b"") for m in sent[1:]) == b"".join(events)
    assert resp.closed  # the upstream response released


class _SlowClose(httpx.AsyncByteStream):
    """An httpx response body cut after ``parts`` (a ``ReadError``: httpx leaves it open, unlike a
    body read to its end) whose ``aclose`` suspends (a connection closed: httpcore awaits the
    socket's close), telling ``closing`` when it starts; ``closed`` once it ended."""

    def __init__(self, parts: list[bytes], closing: asyncio.Event) -> None:
        self.parts = parts
        self.closing = closing
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part
        raise httpx.ReadError("connection reset")

    async def aclose(self) -> None:
        self.closing.set()
        await asyncio.sleep(0.05)
        self.closed = True


async def test_a_client_gone_while_the_upstream_response_is_released_does_not_stop_the_release() -> None:
    """The upstream fails mid-stream; the client has the ``error`` event the proxy sends and hangs
    up while the proxy closes the upstream response (on the httpx transport, whose close may
    suspend): ``send_stream``'s watcher cancels the task. Before, the release ran under
    ``send_stream``'s shield (the watcher itself stopped first): it ended. It must not be cut
    halfway (httpx marks its response closed first: a second ``aclose`` does nothing, and the
    connection is never closed)."""
    closing = asyncio.Event()
    body = _SlowClose(_stream([{"type": "text", "text": "Hello there"}])[:4], closing)
    raw = httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body,
                         request=httpx.Request("POST", "http://upstream/v1/messages"))
    released: list[bool] = []
    resp = HeldResponse(HttpxResponse(raw), lambda: released.append(True))  # type: ignore[arg-type]
    start = await StreamStart.read(resp, 1 << 20, _SENT)
    writer = _Writer()
    streamed = MessagesStream(Settings(), None, writer, None, None).relay(  # type: ignore[arg-type]
        _Context(), resp, {}, start, "/v1/messages")  # type: ignore[arg-type]

    async def receive() -> dict[str, str]:
        await closing.wait()  # the client leaves once the upstream response is being closed
        return {"type": "http.disconnect"}

    await send_stream(streamed, receive, _Sent())  # type: ignore[arg-type]
    for _ in range(50):  # (a release still running in the background is waited for)
        if body.closed:
            break
        await asyncio.sleep(0.01)
    assert body.closed, "the upstream response's close was cut halfway"
    assert released
    assert len(writer.finished) == 1 and "mid-stream" in writer.finished[0]["error"]
