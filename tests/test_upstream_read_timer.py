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


class _KeepAliveServer:
    """A server answering each request on a connection with a small body, keeping the connection;
    the requests numbered in ``stall`` (from 0) get no answer. ``connections``: how many it accepted."""

    def __init__(self, stall: frozenset[int] = frozenset()) -> None:
        self.stall = stall
        self.connections = 0
        self.requests = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> yarl.URL:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return yarl.URL(f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                              if line.startswith(b"content-length:"))
                await reader.readexactly(length)
                n, self.requests = self.requests, self.requests + 1
                if n in self.stall:
                    await reader.read()  # (no answer: open until the client closes it)
                    return
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        assert self.server is not None
        self.server.close()


async def _one(transport: object, url: yarl.URL) -> tuple[bytes, object]:
    """A request's body and the protocol of the one connection pooled after it."""
    resp = await transport.send("POST", url, headers=[("content-type", "application/json")],  # type: ignore[attr-defined]
                                content=b"{}")
    body = b"".join([chunk async for chunk in resp.aiter_raw()])
    await resp.aclose()
    pooled = [protocol for conns in transport._session.connector._conns.values()  # type: ignore[attr-defined]
              for protocol, _ in conns]
    assert len(pooled) == 1
    return body, pooled[0]


async def test_a_pooled_connection_keeps_one_read_timer_across_its_requests() -> None:
    """At a body's end the timer is parked, not dropped (``QuietResumeHandler._drop_timeout``), and
    the next request on the connection moves its deadline: one timer for ten requests, where
    aiohttp's own handler makes one a request. The same connection either way, the same bodies."""
    from proxy.upstream.aiohttp_transport import AiohttpTransport

    timers: dict[str, list[object]] = {"ours": [], "plain": []}
    for kind in ("ours", "plain"):
        server = _KeepAliveServer()
        url = await server.start()
        transport = AiohttpTransport(pool_size=2, connect_timeout_s=5, read_timeout_s=5, keepalive_s=4)
        if kind == "plain":
            _aiohttps_own(transport)
        try:
            for _ in range(10):
                body, protocol = await _one(transport, url)
                assert body == b"{}"
                handle = protocol._read_timeout_handle  # type: ignore[attr-defined]
                if handle is not None and all(handle is not kept for kept in timers[kind]):
                    timers[kind].append(handle)
                for_next = protocol
            assert server.connections == 1
        finally:
            await transport.aclose()
            server.close()
        if kind == "ours":
            assert for_next._read_timeout_handle is None  # type: ignore[attr-defined]  # cancelled at the close
            assert timers["ours"][0].cancelled()  # type: ignore[attr-defined]
    assert len(timers["ours"]) == 1
    assert timers["plain"] == []  # aiohttp's own: dropped at each body's end (a new one at each start)


async def test_a_parked_timer_that_fires_leaves_the_pooled_connection_as_it_was() -> None:
    """A read timeout of 0.2 s and the connection idle in the pool for 0.5 s: the parked timer fires
    and is dropped; the connection is not failed, and the next request goes on it and is answered."""
    from proxy.upstream.aiohttp_transport import AiohttpTransport

    server = _KeepAliveServer()
    url = await server.start()
    transport = AiohttpTransport(pool_size=2, connect_timeout_s=5, read_timeout_s=0.2, keepalive_s=4)
    try:
        body, protocol = await _one(transport, url)
        assert protocol._read_timeout_handle is not None  # type: ignore[attr-defined]  # parked
        await asyncio.sleep(0.5)
        assert protocol._read_timeout_handle is None  # type: ignore[attr-defined]  # fired, dropped
        assert protocol.exception() is None and protocol.is_connected()  # type: ignore[attr-defined]
        again, protocol_again = await _one(transport, url)
    finally:
        await transport.aclose()
        server.close()
    assert (body, again) == (b"{}", b"{}") and protocol_again is protocol and server.connections == 1


async def test_a_request_on_a_connection_with_a_parked_timer_still_times_out_on_time() -> None:
    """The parked timer, armed by the first request, fires before the second request's deadline
    and is armed again for the rest: the second request, unanswered, fails with ``UpstreamTimeout``
    0.3 s after it was sent, not when the first request's timer was due."""
    server = _KeepAliveServer(stall=frozenset({1}))
    url = await server.start()
    upstream = Upstream(str(url).rstrip("/"), pool_size=2, connect_timeout_s=2, read_timeout_s=0.3)
    try:
        resp = await upstream.send("POST", "/chat/completions", headers=[], content=b"{}")
        await resp.aread()
        await resp.aclose()
        await asyncio.sleep(0.15)  # (the parked timer is due 0.15 s into the second request)
        sent = time.monotonic()
        with pytest.raises(UpstreamError) as caught:
            await upstream.send("POST", "/chat/completions", headers=[], content=b"{}")
        waited = time.monotonic() - sent
        _ours(caught.value, UpstreamTimeout)
    finally:
        await upstream.aclose()
        server.close()
    assert server.connections == 1
    assert 0.28 <= waited < 0.6, waited
