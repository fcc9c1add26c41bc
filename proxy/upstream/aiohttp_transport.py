"""The production transport: one shared ``aiohttp.ClientSession`` (``UpstreamTransport``).

Measured on this machine (issue 2 and ``tests/benchmarks``): httpx over the ``httpx-aiohttp``
transport serves about 1,500 requests/s at 16 concurrent requests against about 560 for httpx's
own pool, and aiohttp's client used directly costs less again (0.4-0.5 ms of CPU a request
against 0.7 ms through httpx). So the proxy sends through aiohttp, behind ``AiohttpResponse``
(httpx's names: ``status_code``, ``headers``, ``aread``, ``aiter_raw``, ``aclose``). aiohttp's
exceptions never leave this module: they become ``UpstreamError``s (``aiohttp_error``).
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import ssl
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import certifi
import yarl
from aiohttp.client_proto import ResponseHandler
from aiohttp.streams import EofStream
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.errors import UpstreamError, UpstreamUnreachable
from proxy.upstream.transport import OS_ERRORS, upstream_error

_SKIP_CONTENT_TYPE = ("Content-Type",)
"""aiohttp's automatic header the proxy never adds: a body goes with the client's content type, or none."""

TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, *OS_ERRORS)
"""What aiohttp raises when a connection fails (mapped by ``aiohttp_error``)."""


def aiohttp_error(exc: BaseException) -> UpstreamError:
    """Our error for one of ``TRANSPORT_ERRORS`` (``proxy.upstream.transport.upstream_error``)."""
    return upstream_error(exc, refused=(aiohttp.ClientConnectorError,),
                          closed=(aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError))


def tls_context() -> ssl.SSLContext:
    """The CAs httpx trusts (as ``httpx.create_ssl_context()`` builds them, httpx 0.28):
    ``SSL_CERT_FILE``, else ``SSL_CERT_DIR``, else certifi's; aiohttp alone would use the system store."""
    if os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    if os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    return ssl.create_default_context(cafile=certifi.where())


class AiohttpResponse:
    """An upstream response read through aiohttp (``UpstreamResponse``). ``headers``: aiohttp's
    case-insensitive multidict (``items()`` gives a repeated name once per value)."""

    __slots__ = ("_resp", "headers", "status_code")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status_code: int = resp.status
        self.headers: CIMultiDictProxy[str] = resp.headers

    async def aread(self) -> bytes:
        """The whole body, decoded when the upstream compressed it (``gzip``/``deflate``) although
        asked for ``identity``, as ``httpx.Response.aread`` does; corrupt compressed data raises
        ``UpstreamUnreachable`` (502), as a connection failing mid-body does."""
        try:
            data = await self._resp.read()
        except TRANSPORT_ERRORS as exc:
            raise aiohttp_error(exc) from exc
        encoding = self.headers.get("content-encoding", "").strip().lower()
        if encoding in ("gzip", "x-gzip", "deflate") and data:
            try:
                return zlib.decompressobj(wbits=47).decompress(data)  # 47: gzip or zlib, auto-detected
            except zlib.error:
                if encoding == "deflate":
                    try:
                        return zlib.decompressobj(wbits=-15).decompress(data)  # raw deflate (some servers)
                    except zlib.error:
                        pass
                raise UpstreamUnreachable(
                    f"The upstream provider closed the connection: the upstream sent corrupt {encoding} data"
                ) from None
        return data

    def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (``RawChunks``); a connection reset or a stalled read
        mid-body raises ``UpstreamUnreachable``/``UpstreamTimeout``."""
        return RawChunks(self._resp.content)

    async def aclose(self) -> None:
        """Release a response read to its end (its connection back to the pool), close any other.
        A response read to its end whose connection aiohttp already gave back (at the body's end:
        ``closed``, no ``connection`` left; most) is left as it is: ``release`` would only mark
        its read stream closed, through a ``set_exception`` that was about 1% of a small
        request's instructions (callgrind)."""
        resp = self._resp
        if resp.content.is_eof():
            if not resp.closed or resp.connection is not None:
                resp.release()
        else:
            resp.close()


class RawChunks:
    """The chunks of an aiohttp body as ``content.iter_any()`` gives them (``readany`` until it
    gives ``b""`` or raises ``EofStream``), aiohttp's errors raised as ours (``aiohttp_error``).
    One object whose ``__anext__`` reads, in place of aiohttp's iterator wrapped in an async
    generator of ours: each chunk of a stream went through both (a step of each, and a generator
    registered with the loop's async-generator hooks for each response)."""

    __slots__ = ("_read",)

    def __init__(self, content: aiohttp.StreamReader) -> None:
        self._read = content.readany

    def __aiter__(self) -> RawChunks:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = await self._read()
        except EofStream:
            raise StopAsyncIteration from None
        except TRANSPORT_ERRORS as exc:
            raise aiohttp_error(exc) from exc
        if not chunk:
            raise StopAsyncIteration
        return chunk


PARKED = math.inf
"""``QuietResumeHandler._read_deadline`` when its timer awaits no read (``_drop_timeout``)."""


class QuietResumeHandler(ResponseHandler):
    """aiohttp's connection protocol whose ``resume_reading`` does nothing when nothing is paused.

    aiohttp's body reader calls ``resume_reading`` after taking each buffered piece whenever its
    buffer is below the low-water mark, paused or not: once for every HTTP chunk of a streamed
    body (a chunk an SSE event, as providers send them). Unpaused, and on a response whose parser
    was never paused, aiohttp's own method changes nothing: the parser holds unparsed bytes only
    after its own pause, and the socket is read already. It still runs ``data_received(b"")``
    through the parser and the transport's ``resume_reading``: about 4,000 instructions a chunk
    (callgrind, a streamed request of 24 chunks: 1,909,191 to 1,809,686). Once a response's
    parser was paused it is aiohttp's own for the rest of that response: the parser's pause can
    outlive ``_reading_paused`` (set at a chunk's end, on aiohttp's count of buffered chunks, it
    is taken only at the next body bytes, maybe of the next socket read, whose rest the parser
    then holds with no flag set, for this method's ``data_received(b"")`` to parse). Paused
    (flow control or a full buffer), or with a WebSocket reader, it is aiohttp's own too.

    Its read timeout keeps one timer while reads come (``_reschedule_timeout``, ``_on_read_timeout``)
    where aiohttp's makes a new one at every read, and across the requests of a pooled connection
    (``_drop_timeout``) where aiohttp's makes one a request."""

    _paused_parser: object = None
    """The parser (``_parser``) this connection last paused: aiohttp makes one a response."""

    _read_deadline: float = 0.0
    """When the read timeout is due (``loop.time()``, seconds): the armed timer's time, moved on
    by each read since it was armed (``_reschedule_timeout``); ``PARKED`` while no read is awaited
    (``_drop_timeout``)."""

    def _reschedule_timeout(self) -> None:
        """aiohttp's, once a timer is armed: the read deadline moved on without a new timer.
        aiohttp cancels the read timer and arms a new one at every read of a body (each a timer
        made, started, stopped and closed in uvloop: about 2 us; a stream reads once an event as
        a model writes it). Here the timer stays, and when it fires before the deadline it is armed
        again for the rest (``_on_read_timeout``): the response still fails once ``read_timeout``
        seconds pass without a read, as with aiohttp's. A new deadline before the armed timer (a
        shorter ``read_timeout``) arms a new one, as aiohttp does."""
        timeout = self._read_timeout
        handle = self._read_timeout_handle
        if timeout and handle is not None:
            deadline = self._loop.time() + timeout
            if deadline >= handle.when():  # (when it fires: uvloop's whole milliseconds included)
                self._read_deadline = deadline
                return
        super()._reschedule_timeout()
        if timeout and self._read_timeout_handle is not None:  # (armed by aiohttp, ``timeout`` from now)
            self._read_deadline = self._loop.time() + timeout

    def _drop_timeout(self) -> None:
        """aiohttp's (the timer cancelled) when the connection is going away (closed, lost, failed:
        no transport, ``_should_close``); otherwise the timer is kept, parked: it awaits no read
        (``_read_deadline`` is ``PARKED``), and when it fires it is dropped and does nothing. aiohttp
        drops the timer at a body's end, and at a pause of reading, then arms a new one at the
        next request on the connection (or the resume): each a timer made and cancelled (about 2
        us, ``_reschedule_timeout``). Parked, the next request's start moves its deadline instead.
        A connection in the pool holds one parked timer at most, until it fires (``read_timeout``
        after it was armed) or the connection closes."""
        if self._read_timeout_handle is None:
            return
        if self.transport is None or self._should_close or getattr(self, "_connection_lost_called", False):
            super()._drop_timeout()
            return
        self._read_deadline = PARKED

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        handle = self._read_timeout_handle  # (an aiohttp that drops it before it notes the loss: parked)
        if handle is not None:
            handle.cancel()
            self._read_timeout_handle = None

    def _on_read_timeout(self) -> None:
        """aiohttp's, once the deadline passed; else the timer armed again for what is left, or
        dropped when parked (``_drop_timeout``)."""
        if self._read_deadline == PARKED:
            self._read_timeout_handle = None
            return
        left = self._read_deadline - self._loop.time()
        if left > 0:  # read since it was armed (a millisecond at least: uvloop runs a shorter timer at
            # once, and this would fire again and again until the clock's millisecond turns: review)
            self._read_timeout_handle = self._loop.call_later(max(left, 0.001), self._on_read_timeout)
            return
        self._read_timeout_handle = None
        super()._on_read_timeout()

    def pause_reading(self) -> None:
        self._paused_parser = self._parser
        super().pause_reading()

    def resume_reading(self, resume_parser: bool = True) -> None:
        if (self._reading_paused or self._buffer_paused or self._payload_parser is not None
                or self._paused_parser is self._parser):
            super().resume_reading(resume_parser)


def quiet_resume(connector: aiohttp.BaseConnector) -> None:
    """Make ``connector`` open its connections with ``QuietResumeHandler`` where its protocol
    factory is aiohttp 3.x's ``functools.partial(ResponseHandler, loop=...)`` and a protocol it
    makes has the attributes the overrides read; otherwise (another aiohttp) nothing changes."""
    factory = getattr(connector, "_factory", None)
    if not (isinstance(factory, functools.partial) and factory.func is ResponseHandler):
        return
    quiet = functools.partial(QuietResumeHandler, *factory.args, **factory.keywords)
    probe = quiet()
    if all(hasattr(probe, name) for name in ("_reading_paused", "_buffer_paused", "_payload_parser", "_parser",
                                             "_loop", "_read_timeout", "_read_timeout_handle", "_should_close",
                                             "transport")):
        connector._factory = quiet  # type: ignore[assignment]


def session_request(session: aiohttp.ClientSession) -> Callable[..., Awaitable[aiohttp.ClientResponse]]:
    """What ``AiohttpTransport.send`` awaits to send a request: the coroutine function
    ``session.request`` wraps, ``session._request`` (aiohttp 3.x), when ``session``'s class has
    one; else ``session.request``. Both take the same arguments and give the same
    ``ClientResponse`` or raise the same errors: ``request`` only wraps the coroutine in a
    ``_RequestContextManager`` (a typed generic alias whose call fails to set ``__orig_class__``
    on the slotted object, and a ``**kwargs`` dict): about 5,000 instructions a request
    (callgrind), for an ``async with`` the proxy never uses."""
    private = getattr(type(session), "_request", None)
    request: Callable[..., Awaitable[aiohttp.ClientResponse]] = (
        session._request if inspect.iscoroutinefunction(private) else session.request)
    return request


class AiohttpTransport:
    """``UpstreamTransport`` over one ``aiohttp.ClientSession``, created in the app's lifespan.

    ``pool_size``: connections at most. Timeouts: ``connect_timeout_s`` for a pooled connection
    and the TCP connect; ``read_timeout_s`` from the request's last byte to the response and
    between two reads of it (a stalled stream). Writing the request has no timeout of its own:
    an upstream that accepts a connection but never reads a body larger than the socket buffers
    holds that request. ``keepalive_s``: idle connections are closed after it (shorter than the
    server's own: uvicorn closes at 5 s, and a connection the server closed fails the next
    request with "Server disconnected").
    """

    def __init__(self, *, pool_size: int, connect_timeout_s: float, read_timeout_s: float, keepalive_s: float) -> None:
        connector = aiohttp.TCPConnector(limit=pool_size, keepalive_timeout=keepalive_s, ttl_dns_cache=60,
                                         ssl=tls_context())
        quiet_resume(connector)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s,
                                          sock_read=read_timeout_s),
            auto_decompress=False,  # bytes are relayed as the upstream sent them
            trust_env=False,
            # one client serves every tenant: a cookie the upstream sets goes back to the client
            # that got it (in the response headers), never into a jar sent with others' requests
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self._request = session_request(self._session)

    async def send(self, method: str, url: yarl.URL, *, headers: list[tuple[str, str]],
                   content: bytes | None) -> AiohttpResponse:
        """``headers`` as given and no ``Content-Type`` of aiohttp's: the client's own goes through,
        else none (``skip_auto_headers``, asked for only then: with a ``Content-Type`` there it
        changes nothing, and it costs aiohttp a copy of the headers and two multidicts, about
        11,000 instructions a request, callgrind)."""
        sent = CIMultiDict(headers)  # (what aiohttp makes of a list; the lookup below is then one call)
        skip = None if "Content-Type" in sent else _SKIP_CONTENT_TYPE
        try:
            resp = await self._request(method, url, headers=sent, data=content, allow_redirects=False,
                                       skip_auto_headers=skip)
        except TRANSPORT_ERRORS as exc:
            raise aiohttp_error(exc) from exc
        return AiohttpResponse(resp)

    async def aclose(self) -> None:
        await self._session.close()
