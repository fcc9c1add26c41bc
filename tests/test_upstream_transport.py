"""proxy/upstream/transport.py and its two transports: every failure of a connection, at ``send``
or mid-body through ``aread``/``aiter_raw``, comes out as our ``UpstreamError`` (never aiohttp's,
httpx's or an ``OSError``), with the library's exception as its cause."""

from __future__ import annotations

import asyncio
import functools
import socket
import struct
import types
from collections.abc import AsyncIterator

import aiohttp
import httpx
import pytest
import respx
import yarl

from proxy.errors import ProxyBusy, UpstreamError, UpstreamTimeout, UpstreamUnreachable
from proxy.upstream.client import Upstream
from proxy.upstream.httpx_transport import HttpxTransport
from proxy.upstream.transport import UpstreamResponse

HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        b"10\r\ndata: {\"a\": 1}\n\n\r\n")
"""A streamed reply's head and its first chunk (16 bytes), the rest never sent."""


async def _serve(after_head: str) -> tuple[asyncio.Server, str]:
    """A server answering ``HEAD``, then: ``reset`` the connection (RST, as a crashed upstream or
    a load balancer cutting it) or ``stall`` (send nothing more)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                       if line.startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        writer.write(HEAD)
        await writer.drain()
        await asyncio.sleep(0.05)  # the first chunk arrives on its own
        if after_head == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        else:
            await asyncio.sleep(30)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


def _ours(exc: BaseException, kind: type[UpstreamError]) -> None:
    assert isinstance(exc, kind), repr(exc)
    assert not isinstance(exc, (aiohttp.ClientError, httpx.HTTPError, OSError))
    assert exc.__cause__ is not None  # the library's own exception, for the traceback


async def _read_stream(resp: UpstreamResponse) -> list[bytes]:
    return [chunk async for chunk in resp.aiter_raw()]


@pytest.mark.parametrize("read", ["aiter_raw", "aread"])
async def test_a_connection_reset_mid_body_raises_our_error_through_aiohttp(read: str) -> None:
    server, url = await _serve("reset")
    upstream = Upstream(url, pool_size=2, connect_timeout_s=2, read_timeout_s=5)
    try:
        resp = await upstream.send("POST", "/chat/completions", headers=[], content=b"{}")
        assert resp.status_code == 200
        with pytest.raises(UpstreamError) as caught:
            await (_read_stream(resp) if read == "aiter_raw" else resp.aread())
        _ours(caught.value, UpstreamUnreachable)
        assert caught.value.status == 502
        await resp.aclose()
        assert upstream.slots._all.free == 2  # the pool slot is back
    finally:
        await upstream.aclose()
        server.close()


async def test_a_stream_that_stalls_mid_body_times_out_with_our_error() -> None:
    server, url = await _serve("stall")
    upstream = Upstream(url, pool_size=2, connect_timeout_s=2, read_timeout_s=0.3)
    try:
        resp = await upstream.send("POST", "/chat/completions", headers=[], content=b"{}")
        chunks = resp.aiter_raw()
        assert (await anext(chunks)).startswith(b"data:")
        with pytest.raises(UpstreamError) as caught:
            await anext(chunks)
        _ours(caught.value, UpstreamTimeout)
        await resp.aclose()
    finally:
        await upstream.aclose()
        server.close()


async def test_corrupt_gzip_is_our_502_and_nobody_listening_is_unreachable() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 9\r\nconnection: close\r\n\r\nnot gzip!")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    upstream = Upstream(f"http://127.0.0.1:{port}/v1", pool_size=2, connect_timeout_s=1, read_timeout_s=1)
    try:
        resp = await upstream.send("GET", "/models", headers=[], content=None)
        with pytest.raises(UpstreamUnreachable, match="corrupt gzip"):
            await resp.aread()
        await resp.aclose()
        server.close()
        await server.wait_closed()
        with pytest.raises(UpstreamError) as caught:
            await upstream.send("GET", "/models", headers=[], content=None)
        _ours(caught.value, UpstreamUnreachable)
    finally:
        await upstream.aclose()


class _CutStream(httpx.AsyncByteStream):
    """A body whose connection fails after its first chunk, as httpx reports it."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'data: {"a": 1}\n\n'
        raise httpx.ReadError("connection reset by peer")


@respx.mock(assert_all_called=True)
async def test_the_httpx_transport_maps_its_errors_too(respx_mock: respx.MockRouter) -> None:
    route = respx_mock.post("https://api.example.com/v1/chat/completions")
    route.side_effect = [httpx.Response(200, stream=_CutStream()), httpx.Response(200, stream=_CutStream()),
                         httpx.ConnectError("refused"), httpx.ReadTimeout("slow")]
    upstream = Upstream("https://api.example.com/v1", pool_size=2, connect_timeout_s=1, read_timeout_s=1,
                        transport=HttpxTransport(httpx.AsyncHTTPTransport(), pool_size=2, connect_timeout_s=1,
                                                  read_timeout_s=1, keepalive_s=4.0))  # respx patches httpx's transports
    try:
        for read in ("aiter_raw", "aread"):
            resp = await upstream.send("POST", "/chat/completions", headers=[], content=b"{}")
            with pytest.raises(UpstreamError) as caught:
                await (_read_stream(resp) if read == "aiter_raw" else resp.aread())
            _ours(caught.value, UpstreamUnreachable)
            await resp.aclose()
        for kind in (UpstreamUnreachable, UpstreamTimeout):
            with pytest.raises(UpstreamError) as caught:
                await upstream.send("POST", "/chat/completions", headers=[], content=b"{}")
            _ours(caught.value, kind)
        assert upstream.slots._all.free == 2  # every slot back
    finally:
        await upstream.aclose()


class _FakeResponse:
    status_code = 201

    def __init__(self) -> None:
        self.headers = {"content-type": "application/json"}
        self.closed = False

    async def aread(self) -> bytes:
        return b"{}"

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        yield b"{}"

    async def aclose(self) -> None:
        self.closed = True


class _FakeTransport:
    """Any object of ``UpstreamTransport``'s shape can stand for the provider (in-process tests)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, list[tuple[str, str]], bytes | None]] = []
        self.responses: list[_FakeResponse] = []

    async def send(self, method: str, url: yarl.URL, *, headers: list[tuple[str, str]],
                   content: bytes | None) -> _FakeResponse:
        self.sent.append((method, str(url), headers, content))
        self.responses.append(_FakeResponse())
        return self.responses[-1]

    async def aclose(self) -> None:
        pass


async def test_an_upstream_transport_of_our_protocol_is_used_as_it_is_and_holds_a_pool_slot() -> None:
    transport = _FakeTransport()
    upstream = Upstream("http://fake.test/v1", pool_size=1, connect_timeout_s=0.1, read_timeout_s=1, transport=transport)
    resp = await upstream.send("POST", "/chat/completions?x=%20", headers=[("a", "b")], content=b"{}")
    assert (resp.status_code, await resp.aread()) == (201, b"{}")
    assert transport.sent == [("POST", "http://fake.test/v1/chat/completions?x=%20", [("a", "b")], b"{}")]
    with pytest.raises(ProxyBusy):  # the one slot is held until the response is closed
        await upstream.send("GET", "/models", headers=[], content=None)
    await resp.aclose()
    assert transport.responses[0].closed
    again = await upstream.send("GET", "/models", headers=[], content=None)
    await again.aclose()
    await upstream.aclose()


def test_the_production_modules_import_no_httpx() -> None:
    """httpx is the tests' transport: the app, the CLI and the upstream client load none of it."""
    import subprocess
    import sys

    code = ("import sys, proxy.app, proxy.cli, proxy.upstream.client, proxy.upstream.headers; "
            "print(sorted(m for m in sys.modules if m == 'httpx' or m.startswith('httpx.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_create_app_wraps_an_httpx_transport_and_keeps_ours() -> None:
    from proxy.app import _transport
    from proxy.settings import Settings

    wrapped = _transport(Settings(), httpx.MockTransport(lambda request: httpx.Response(200)))
    assert isinstance(wrapped, HttpxTransport)
    ours = _FakeTransport()
    assert _transport(Settings(), ours) is ours and _transport(Settings(), None) is None


def test_each_transport_maps_its_own_library() -> None:
    from proxy.upstream.aiohttp_transport import aiohttp_error
    from proxy.upstream.httpx_transport import httpx_error

    assert isinstance(httpx_error(httpx.ReadTimeout("slow")), UpstreamTimeout)
    assert "could not be reached" in httpx_error(httpx.ConnectError("refused")).message
    assert "closed the connection" in httpx_error(httpx.RemoteProtocolError("cut")).message
    assert "could not be reached" in aiohttp_error(aiohttp.ClientConnectorError(
        aiohttp.client_reqrep.ConnectionKey("h", 1, False, True, None, None, None), OSError(111, "refused"))).message
    assert "closed the connection" in aiohttp_error(aiohttp.ServerDisconnectedError()).message
    assert isinstance(aiohttp_error(aiohttp.ServerTimeoutError("read")), UpstreamTimeout)


async def _keep_alive_server(reply: bytes, heads: list[bytes], connections: list[int],
                             answer: bytes | None = None) -> tuple[asyncio.Server, yarl.URL]:
    """A server answering each request of a connection with 200 and ``reply`` (or with the raw
    ``answer``, head included); the requests (head and body) go in ``heads``, each connection it
    accepts in ``connections``."""
    answer = answer or b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(reply), reply)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(id(writer))
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            length = next((int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                           if line.startswith(b"content-length:")), 0)
            heads.append(head + await reader.readexactly(length))
            writer.write(answer)
            await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, yarl.URL(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions")


async def test_aiohttp_sends_the_bytes_a_session_skipping_content_type_sent_asking_to_skip_only_without_one() -> None:
    """``AiohttpTransport.send`` asks aiohttp to skip its automatic ``Content-Type`` only when the
    headers carry none (the fast path: no ``skip_auto_headers``, which would cost aiohttp a copy of
    the headers): the upstream gets, byte for byte, what a session skipping it on every request
    (the transport's former configuration) sends, with or without the client's content type."""
    from proxy.upstream.aiohttp_transport import AiohttpTransport

    heads: list[bytes] = []
    server, url = await _keep_alive_server(b'{}', heads, [])
    transport = AiohttpTransport(pool_size=4, connect_timeout_s=5, read_timeout_s=5, keepalive_s=4)
    reference = aiohttp.ClientSession(auto_decompress=False, trust_env=False, skip_auto_headers=("Content-Type",),
                                      cookie_jar=aiohttp.DummyCookieJar())
    asked: list[object] = []
    request = transport._request

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(kwargs.get("skip_auto_headers"))
        return request(*args, **kwargs)

    transport._request = spy
    cases = [("POST", [("content-type", "application/json"), ("authorization", "Bearer k"),
                       ("accept-encoding", "identity")], b'{"a": 1}'),
             ("POST", [("Content-Type", "text/plain"), ("x-a", "1"), ("x-a", "2")], b"hi"),
             ("POST", [("authorization", "Bearer k")], b'{"a": 1}'),  # no content type: none added
             ("GET", [("accept", "application/json")], None),
             ("POST", [], None)]
    try:
        for method, headers, body in cases:
            resp = await transport.send(method, url, headers=headers, content=body)
            await resp.aread()
            await resp.aclose()
            async with reference.request(method, url, headers=headers, data=body, allow_redirects=False) as ref:
                await ref.read()
            ours, theirs = heads[-2], heads[-1]
            assert ours == theirs, (ours, theirs)
            assert (b"content-type:" in ours.lower()) == any(k.lower() == "content-type" for k, _ in headers)
    finally:
        await transport.aclose()
        await reference.close()
        server.close()
    assert asked == [None, None, ("Content-Type",), ("Content-Type",), ("Content-Type",)]


async def test_a_response_read_to_its_end_is_not_released_again_and_its_connection_is_reused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``AiohttpResponse.aclose`` of a response read to its end leaves aiohttp's ``release`` alone
    (the fast path: aiohttp gave the connection back at the body's end); the next request goes on
    the same connection, as after ``release``, and none is left acquired."""
    from proxy.upstream.aiohttp_transport import AiohttpTransport

    connections: list[int] = []
    released: list[object] = []
    release = aiohttp.ClientResponse.release

    def counting(self: aiohttp.ClientResponse) -> object:
        released.append(self)
        return release(self)

    monkeypatch.setattr(aiohttp.ClientResponse, "release", counting)
    server, url = await _keep_alive_server(b'{"a":1}', [], connections)
    transport = AiohttpTransport(pool_size=4, connect_timeout_s=5, read_timeout_s=5, keepalive_s=4)
    try:
        for _ in range(3):
            resp = await transport.send("POST", url, headers=[("content-type", "application/json")], content=b"{}")
            assert await resp.aread() == b'{"a":1}'
            await resp.aclose()
        assert released == [] and len(connections) == 1  # never released again; one connection, reused
        connector = transport._session.connector
        assert connector is not None and not connector._acquired  # none left acquired
    finally:
        await transport.aclose()
        server.close()


async def test_the_transport_awaits_the_sessions_request_coroutine_and_gets_what_request_gives() -> None:
    """``AiohttpTransport.send`` awaits ``ClientSession._request`` itself (the fast path: without
    ``request``'s context-manager wrapper); the upstream gets the same bytes and the answer is the
    same (status, headers, body) as through the public ``request``. A session class without a
    ``_request`` coroutine function gets the public ``request``."""
    from proxy.upstream.aiohttp_transport import AiohttpTransport, session_request

    heads: list[bytes] = []
    server, url = await _keep_alive_server(b'{"ok":true}', heads, [])
    fast = AiohttpTransport(pool_size=4, connect_timeout_s=5, read_timeout_s=5, keepalive_s=4)
    public = AiohttpTransport(pool_size=4, connect_timeout_s=5, read_timeout_s=5, keepalive_s=4)
    public._request = public._session.request
    assert fast._request.__func__ is aiohttp.ClientSession._request  # type: ignore[attr-defined]
    called: list[str] = []
    request = fast._request

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        called.append(args[0])
        return request(*args, **kwargs)

    fast._request = spy
    answers = []
    try:
        for transport in (fast, public):
            resp = await transport.send("POST", url, headers=[("content-type", "application/json"), ("x-a", "1")],
                                        content=b'{"a": 1}')
            answers.append((resp.status_code, sorted(resp.headers.items()), await resp.aread()))
            await resp.aclose()
    finally:
        await fast.aclose()
        await public.aclose()
        server.close()
    assert called == ["POST"]  # the fast path taken once, by the fast transport alone
    assert heads[0] == heads[1]
    assert answers[0] == answers[1] and answers[0][2] == b'{"ok":true}'

    class Plain:  # a session class whose ``_request`` is no coroutine function (or none at all)
        _request = None

        async def request(self, *args: object, **kwargs: object) -> None: ...

    class Without:
        async def request(self, *args: object, **kwargs: object) -> None: ...

    for session in (Plain(), Without()):
        assert session_request(session) == session.request  # type: ignore[arg-type]


async def _chunked_server(chunks: list[bytes]) -> tuple[asyncio.Server, yarl.URL]:
    """A keep-alive server answering each request with ``chunks``, each an HTTP chunk of its own
    (``transfer-encoding: chunked``), as providers stream SSE events."""
    answer = b"".join([b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
                       *(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks), b"0\r\n\r\n"])
    return await _keep_alive_server(b"", [], [], answer)


async def _streamed(transport: object, url: yarl.URL, wait_s: float = 0.0) -> bytes:
    """The body of one streamed answer read through ``transport.send`` and ``aiter_raw``; with
    ``wait_s``, read only after that long (the upstream's bytes pile up in aiohttp's buffer)."""
    resp = await transport.send("POST", url, headers=[("content-type", "application/json")],  # type: ignore[attr-defined]
                                content=b'{"stream":true}')
    await asyncio.sleep(wait_s)
    body = b"".join([chunk async for chunk in resp.aiter_raw()])
    await resp.aclose()
    return body


async def test_a_streamed_body_is_read_without_aiohttps_empty_resume_per_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The transport's connections resume reading only when something is paused
    (``QuietResumeHandler``): a streamed answer of 300 HTTP chunks gives the same bytes as through
    aiohttp's own ``ResponseHandler``, which feeds its parser an empty ``data_received`` after each
    chunk it hands over; ours feeds none."""
    from aiohttp.client_proto import ResponseHandler

    from proxy.upstream.aiohttp_transport import AiohttpTransport, QuietResumeHandler

    empty: list[type] = []
    received = ResponseHandler.data_received

    def counting(self: ResponseHandler, data: bytes) -> None:
        if not data:
            empty.append(type(self))
        received(self, data)

    monkeypatch.setattr(ResponseHandler, "data_received", counting)
    events = [b'data: {"choices":[{"delta":{"content":"w%d "}}]}\n\n' % i for i in range(300)]
    server, url = await _chunked_server(events)
    ours = AiohttpTransport(pool_size=2, connect_timeout_s=5, read_timeout_s=5, keepalive_s=4)
    plain = AiohttpTransport(pool_size=2, connect_timeout_s=5, read_timeout_s=5, keepalive_s=4)
    connector = plain._session.connector
    assert connector is not None and connector._factory.func is QuietResumeHandler  # type: ignore[attr-defined]
    connector._factory = functools.partial(ResponseHandler, *connector._factory.args,  # type: ignore[attr-defined]
                                           **connector._factory.keywords)  # type: ignore[attr-defined]
    try:
        bodies = [await _streamed(t, url, wait_s=0.05) for t in (ours, plain)]
    finally:
        await ours.aclose()
        await plain.aclose()
        server.close()
    assert bodies[0] == bodies[1] == b"".join(events)
    assert QuietResumeHandler not in empty  # the fast path: no empty feed on our connection
    assert empty.count(ResponseHandler) >= 250  # aiohttp's: about one a chunk (all 300 were buffered)


async def test_a_body_that_outruns_its_reader_is_paused_and_resumed_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body larger than aiohttp's buffer, read only after it piled up: aiohttp pauses reading the
    socket, and the connection's ``resume_reading`` (ours: paused, so aiohttp's own) starts it again;
    every byte arrives (a resume skipped while paused would stall until the read timeout)."""
    from aiohttp.client_proto import ResponseHandler

    from proxy.upstream.aiohttp_transport import AiohttpTransport

    paused: list[object] = []
    pause = ResponseHandler.pause_reading

    def counting(self: ResponseHandler) -> None:
        paused.append(self)
        pause(self)

    monkeypatch.setattr(ResponseHandler, "pause_reading", counting)
    chunks = [bytes([65 + i % 26]) * 16_384 for i in range(192)]  # 3 MiB in 16 KiB chunks
    server, url = await _chunked_server(chunks)
    transport = AiohttpTransport(pool_size=2, connect_timeout_s=5, read_timeout_s=2, keepalive_s=4)
    try:
        body = await asyncio.wait_for(_streamed(transport, url, wait_s=0.3), 20)
        again = await asyncio.wait_for(_streamed(transport, url), 20)  # the same connection, after the pauses
    finally:
        await transport.aclose()
        server.close()
    assert body == again == b"".join(chunks)
    assert paused  # the buffer did fill: aiohttp paused the socket at least once


def test_quiet_resume_leaves_another_aiohttps_factory_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """``quiet_resume`` changes a connector's protocol factory only when it is aiohttp 3.x's
    ``partial(ResponseHandler, ...)`` making protocols with the flags the override reads."""
    from aiohttp.client_proto import ResponseHandler

    import proxy.upstream.aiohttp_transport as transport_module
    from proxy.upstream.aiohttp_transport import quiet_resume

    class Other(ResponseHandler):
        pass

    class Bare:  # a protocol without one of the flags (an older aiohttp's)
        def __init__(self, loop: object) -> None:
            self.loop = loop
            self._reading_paused = self._buffer_paused = False

    for factory in (functools.partial(Other, loop=None), Other, functools.partial(Bare, loop=None)):
        connector = types.SimpleNamespace(_factory=factory)
        quiet_resume(connector)  # type: ignore[arg-type]
        assert connector._factory is factory
    aiohttps = functools.partial(ResponseHandler, loop=None)
    monkeypatch.setattr(transport_module, "QuietResumeHandler", Bare)  # as if the flags were gone
    connector = types.SimpleNamespace(_factory=aiohttps)
    quiet_resume(connector)  # type: ignore[arg-type]
    assert connector._factory is aiohttps
    monkeypatch.undo()
    quiet_resume(connector)  # type: ignore[arg-type]
    assert connector._factory.func is transport_module.QuietResumeHandler  # this aiohttp's: replaced


@pytest.mark.skipif(aiohttp.http_parser.HttpResponseParser is aiohttp.http_parser.HttpResponseParserPy,
                    reason="aiohttp's pure-Python parser (AIOHTTP_NO_EXTENSIONS) stalls here through its own ResponseHandler too")
async def test_a_body_paused_on_its_chunk_count_at_a_read_boundary_ends_without_a_stall() -> None:
    """aiohttp pauses on the count of buffered HTTP chunks (16,384 by default) from the chunk's end,
    outside its body callback: at the end of a socket read the parser keeps that pause and takes
    it at the first body of the next read, holding the rest of that read (here the last chunk's
    CRLF and the terminating chunk) while nothing is marked paused. aiohttp's own
    ``resume_reading`` (after the reader takes a chunk) feeds the parser and the body ends; a
    resume skipped as a no-op leaves the end unread until the read timeout."""
    from aiohttp.client_proto import ResponseHandler

    from proxy.upstream.aiohttp_transport import AiohttpTransport

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:"))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"1\r\nx\r\n" * 16_385)
        await writer.drain()
        await asyncio.sleep(0.3)  # the client has read the first part and paused on its chunk count
        writer.write(b"1\r\ny\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()  # keep-alive: the connection stays open until the client closes it

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = yarl.URL(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/")
    ours = AiohttpTransport(pool_size=2, connect_timeout_s=5, read_timeout_s=2, keepalive_s=4)
    plain = AiohttpTransport(pool_size=2, connect_timeout_s=5, read_timeout_s=2, keepalive_s=4)
    connector = plain._session.connector
    assert connector is not None
    connector._factory = functools.partial(ResponseHandler, *connector._factory.args,  # type: ignore[attr-defined]
                                           **connector._factory.keywords)  # type: ignore[attr-defined]
    try:
        bodies = [await asyncio.wait_for(_streamed(t, url, wait_s=0.15), 10) for t in (plain, ours)]
    finally:
        await ours.aclose()
        await plain.aclose()
        server.close()
    assert bodies[0] == bodies[1] == b"x" * 16_385 + b"y"
