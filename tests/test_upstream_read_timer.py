"""The upstream read timeout on aiohttp's connections (``QuietResumeHandler._reschedule_timeout``,
``_on_read_timeout``): one timer while reads come, armed again when it fires before the deadline;
a stalled body still fails ``read_timeout_s`` after its last read, as with aiohttp's own handler."""

from __future__ import annotations

import asyncio
import functools
import time

import pytest
import yarl

from proxy.errors import UpstreamError, UpstreamTimeout
from proxy.upstream.client import Upstream
from tests.test_upstream_transport import _ours


async def _paced_server(chunks: int, every_s: float, then: str) -> tuple[asyncio.Server, yarl.URL]:
    """A server streaming ``chunks`` SSE events, one HTTP chunk each, ``every_s`` apart (each read
    on its own), then ``end`` the body or ``stall`` (send nothing more)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:"))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(chunks):
            event = b'data: {"n": %d}\n\n' % i
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(every_s)
        if then == "end":
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        await reader.read()  # (open until the client closes it)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, yarl.URL(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/")


def _aiohttps_own(transport: object) -> None:
    """Make ``transport`` (an ``AiohttpTransport``) open its connections with aiohttp's own ``ResponseHandler``."""
    from aiohttp.client_proto import ResponseHandler

    connector = transport._session.connector  # type: ignore[attr-defined]
    connector._factory = functools.partial(ResponseHandler, *connector._factory.args, **connector._factory.keywords)


async def test_a_stream_read_event_by_event_keeps_one_read_timer() -> None:
    """Each read of a body moves the read deadline on; the connection's timer stays
    (``QuietResumeHandler._reschedule_timeout``) where aiohttp's own makes a new one a read. The
    body is the same either way."""
    from proxy.upstream.aiohttp_transport import AiohttpTransport

    server, url = await _paced_server(12, 0.02, "end")
    ours = AiohttpTransport(pool_size=2, connect_timeout_s=5, read_timeout_s=5, keepalive_s=4)
    plain = AiohttpTransport(pool_size=2, connect_timeout_s=5, read_timeout_s=5, keepalive_s=4)
    _aiohttps_own(plain)
    timers: dict[object, list[object]] = {ours: [], plain: []}  # (the handles: a freed one's id is reused)
    bodies = []
    try:
        for transport in (ours, plain):
            resp = await transport.send("POST", url, headers=[("content-type", "application/json")], content=b"{}")
            protocol = resp._resp.connection.protocol  # type: ignore[attr-defined]
            chunks = []
            async for chunk in resp.aiter_raw():
                chunks.append(chunk)
                handle = protocol._read_timeout_handle
                if handle is not None and all(handle is not kept for kept in timers[transport]):
                    timers[transport].append(handle)
            await resp.aclose()
            bodies.append(b"".join(chunks))
    finally:
        await ours.aclose()
        await plain.aclose()
        server.close()
    assert bodies[0] == bodies[1] == b"".join(b'data: {"n": %d}\n\n' % i for i in range(12))
    assert len(timers[ours]) == 1  # one timer for the whole body
    assert len(timers[plain]) >= 10  # aiohttp's own: one a read


@pytest.mark.parametrize("every_s", [0.05, 0.12])
async def test_a_stream_that_keeps_coming_never_times_out_and_one_that_stalls_does_on_time(every_s: float) -> None:
    """A read timeout of 0.3 s: a body whose reads come ``every_s`` apart for longer than that is
    read whole (the timer, fired before the moved deadline, is armed again for the rest); when the
    body then stalls, ``UpstreamTimeout`` comes 0.3 s after the last read, not earlier, not much later."""
    server, url = await _paced_server(8, every_s, "stall")
    upstream = Upstream(str(url).rstrip("/"), pool_size=2, connect_timeout_s=2, read_timeout_s=0.3)
    try:
        resp = await upstream.send("POST", "/chat/completions", headers=[], content=b"{}")
        chunks = resp.aiter_raw()
        got = []
        last = 0.0
        with pytest.raises(UpstreamError) as caught:
            while True:
                got.append(await anext(chunks))
                last = time.monotonic()
        waited = time.monotonic() - last
        _ours(caught.value, UpstreamTimeout)
        await resp.aclose()
    finally:
        await upstream.aclose()
        server.close()
    assert b"".join(got) == b"".join(b'data: {"n": %d}\n\n' % i for i in range(8))  # all of it, no early timeout
    assert 0.28 <= waited < 0.6, waited


async def test_a_shorter_read_timeout_than_the_armed_timer_s_is_kept() -> None:
    """A deadline before the armed timer's (``read_timeout`` lowered between two reads) arms a new
    timer, as aiohttp's own does: the timeout comes when the shorter one says."""
    from proxy.upstream.aiohttp_transport import QuietResumeHandler

    loop = asyncio.get_running_loop()
    fired: list[float] = []
    protocol = QuietResumeHandler(loop=loop)
    protocol.set_exception = lambda exc, *a: fired.append(loop.time())  # type: ignore[method-assign]
    protocol.read_timeout = 10.0
    protocol.start_timeout()
    protocol.read_timeout = 0.1
    started = loop.time()
    protocol._reschedule_timeout()  # what a read does
    await asyncio.sleep(0.3)
    protocol._drop_timeout()
    assert len(fired) == 1 and 0.09 <= fired[0] - started < 0.25, (fired, started)


async def test_a_read_timer_that_fires_a_hair_early_waits_a_millisecond_at_least() -> None:
    """The timer firing less than a millisecond before the deadline (uvloop's timers have whole
    milliseconds) is armed again a millisecond on: a shorter delay would run at once, and again,
    until the clock's millisecond turned (about 100 runs, review)."""
    from proxy.upstream.aiohttp_transport import QuietResumeHandler

    loop = asyncio.get_running_loop()
    protocol = QuietResumeHandler(loop=loop)
    protocol.set_exception = lambda exc, *a: None  # type: ignore[method-assign]
    protocol.read_timeout = 5.0
    protocol.start_timeout()
    protocol._read_deadline = loop.time() + 0.0002  # (as if it fired 0.2 ms before the deadline)
    protocol._on_read_timeout()
    handle = protocol._read_timeout_handle
    assert handle is not None and handle.when() - loop.time() >= 0.0009
    protocol._drop_timeout()
