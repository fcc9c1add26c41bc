"""The HTTP client to the provider: one shared ``aiohttp.ClientSession``.

Measured on this machine (issue 2 and ``tests/benchmarks``): httpx over the ``httpx-aiohttp``
transport serves about 1,500 requests/s at 16 concurrent requests against about 560 for httpx's
own pool, and aiohttp's client used directly costs less again (the issue's anchors: 0.4-0.5 ms
of CPU a request against 0.7 ms through httpx; ``tests/benchmarks`` shows the proxy's figures).
So the proxy sends through aiohttp, behind a small response type with httpx's names
(``status_code``, ``headers``, ``aread``, ``aiter_raw``, ``aclose``). An injected httpx
transport (benchmarks: in-process runs and the httpx row) switches to an ``httpx.AsyncClient``
with the same interface. Transport errors are translated here into ``UpstreamUnreachable``
(502) / ``UpstreamTimeout`` (504); ``TRANSPORT_ERRORS`` are the exceptions a body read can raise.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import weakref
import zlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import aiohttp
import httpx
import yarl

from proxy.admission import PoolShare
from proxy.errors import UpstreamTimeout, UpstreamUnreachable
from proxy.upstream.urls import join, upstream_base

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
"""Headers that describe one connection, never forwarded (RFC 9110 section 7.6.1)."""

PROXY_HEADERS = frozenset({"x-session-id"})
"""Headers addressed to this proxy, not to the provider."""

OWN_RESPONSE_HEADERS = frozenset({"date", "server"})
"""Set by the proxy's own server; the upstream's copies would be duplicates."""

OPERATOR_RESPONSE_HEADERS = frozenset({"openai-organization", "openai-project", "set-cookie"})
OPERATOR_RESPONSE_PREFIXES = ("x-ratelimit-",)
"""Response headers about the operator's account (its organization, project, rate limits, cookies):
with a shared upstream key (``upstream_api_key``) they are the operator's, never passed to tenants."""


def connection_tokens(pairs: Iterable[tuple[str, str]]) -> frozenset[str]:
    """Header names (lower case) listed in the ``Connection`` headers of ``pairs``: hop-by-hop for
    this one connection, so never forwarded (RFC 9110 section 7.6.1)."""
    names: set[str] = set()
    for name, value in pairs:
        if name.lower() == "connection":
            names.update(token.strip().lower() for token in value.split(","))
    names.discard("")
    return frozenset(names)

URL_MEMO_PATHS = 256
"""Parsed upstream URLs kept per path (building one was ~2% of a small request's CPU)."""
URL_MEMO_PATH_CHARS = 256
"""Longer paths (query strings of pass-through calls) are parsed each time, never kept."""

TRANSPORT_ERRORS = (httpx.HTTPError, aiohttp.ClientError, OSError, asyncio.TimeoutError)
"""What reading an upstream response can raise when the connection fails (``translate`` them)."""


def forward_request_headers(
    headers: Iterable[tuple[str, str]], *, upstream_api_key: str | None, identity: bool
) -> list[tuple[str, str]]:
    """Client headers to send upstream: hop-by-hop (those the ``Connection`` header names too) and
    proxy headers dropped.

    With ``upstream_api_key`` the client's ``Authorization`` is replaced by the proxy's key. With
    ``identity`` the upstream is asked not to compress (the proxy reads chat replies to log them).
    """
    headers = headers if isinstance(headers, (list, tuple)) else list(headers)
    named = connection_tokens(headers)
    out: list[tuple[str, str]] = []
    for name, value in headers:
        low = name.lower()
        if low in HOP_BY_HOP or low in PROXY_HEADERS or low.startswith("x-context-proxy-") or low in named:
            continue
        if upstream_api_key is not None and low in ("authorization", "api-key", "x-api-key", "openai-organization", "openai-project"):
            continue  # the proxy's key: the client chooses neither the credentials nor the billed project
        if identity and low == "accept-encoding":
            continue
        out.append((name, value))
    if upstream_api_key is not None:
        out.append(("authorization", f"Bearer {upstream_api_key}"))
    if identity:
        out.append(("accept-encoding", "identity"))
    return out


def response_headers(headers: Any, *, keep_encoding: bool, shared_key: bool = False) -> dict[str, str]:
    """Upstream response headers to pass back (content type, request id, rate limits, retry-after…).

    ``headers``: an ``httpx.Headers`` or aiohttp's ``CIMultiDictProxy`` (repeated names joined
    with ``", "``). Hop-by-hop ones are dropped, those the ``Connection`` header names too; with
    ``shared_key`` (the proxy's own upstream key) the operator's account headers as well
    (``OPERATOR_RESPONSE_HEADERS``)."""
    out: dict[str, str] = {}
    pairs = list(headers.multi_items() if isinstance(headers, httpx.Headers) else headers.items())
    named = connection_tokens(pairs)
    for name, value in pairs:
        low = name.lower()
        if low in HOP_BY_HOP or low in OWN_RESPONSE_HEADERS or (not keep_encoding and low == "content-encoding") or low in named:
            continue
        if shared_key and (low in OPERATOR_RESPONSE_HEADERS or low.startswith(OPERATOR_RESPONSE_PREFIXES)):
            continue
        if low in out:
            out[low] += ", " + value
        else:
            out[low] = value
    return out


class AiohttpResponse:
    """An upstream response read through aiohttp, under httpx's names (what the proxy uses).

    ``status_code``: the HTTP status. ``headers``: aiohttp's case-insensitive multidict.
    ``aread()``: the whole body (bytes); ``aiter_raw()``: the body as it arrives, undecoded.
    ``aclose()``: release the connection to the pool when the body was read to its end, else
    close it (so a stream the client left is cancelled upstream too); idempotent. Reads raise
    aiohttp's exceptions (``TRANSPORT_ERRORS``; ``translate`` maps them).
    """

    __slots__ = ("__weakref__", "_release", "_resp", "headers", "status_code")

    def __init__(self, resp: aiohttp.ClientResponse, release: Callable[[], None] | None = None) -> None:
        self._resp = resp
        self._release = release
        self.status_code = resp.status
        self.headers = resp.headers

    async def aread(self) -> bytes:
        """The whole body, decoded when the upstream compressed it (``gzip``/``deflate``) although
        asked for ``identity``, as ``httpx.Response.aread`` does; corrupt compressed data raises
        ``aiohttp.ClientPayloadError`` (a transport error: ``translate`` makes it a 502)."""
        data = await self._resp.read()
        encoding = self.headers.get("content-encoding", "").strip().lower()
        if encoding in ("gzip", "x-gzip", "deflate") and data:
            try:
                return zlib.decompressobj(wbits=47).decompress(data)  # 47: gzip or zlib, auto-detected
            except zlib.error:
                if encoding != "deflate":
                    raise aiohttp.ClientPayloadError("the upstream sent corrupt gzip data") from None
                return zlib.decompressobj(wbits=-15).decompress(data)  # raw deflate (some servers)
        return data

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        async for chunk in self._resp.content.iter_any():
            yield chunk

    async def aclose(self) -> None:
        resp = self._resp
        if resp.content.is_eof():
            resp.release()
        else:
            resp.close()
        if self._release is not None:
            self._release()  # the pool slot (``PoolShare``)


class HeldHttpxResponse:
    """An ``httpx.Response`` whose ``aclose`` also gives back its pool slot (``PoolShare``);
    every other attribute is the response's."""

    __slots__ = ("__weakref__", "_release", "_resp")

    def __init__(self, resp: httpx.Response, release: Callable[[], None]) -> None:
        self._resp = resp
        self._release = release

    def __getattr__(self, name: str) -> Any:
        return getattr(self._resp, name)

    async def aclose(self) -> None:
        try:
            await self._resp.aclose()
        finally:
            self._release()


class Upstream:
    """One shared client to the provider, created in the app's lifespan.

    ``send`` returns a streaming response (``AiohttpResponse``, or an ``httpx.Response`` with an
    injected ``transport``) that the caller reads or iterates and must ``aclose``. Raises
    ``UpstreamUnreachable`` or ``UpstreamTimeout``; never another library's exception.
    Pool: ``pool_size`` requests at once (``PoolShare``), ``tenant_pool_share`` of them (a fraction,
    at least one) for one tenant; a slot not free within ``connect_timeout_s`` raises ``ProxyBusy``
    (503): the proxy is full, the provider did not time out. The slot is held until ``aclose``
    (or, for a response nobody closes, until it is garbage).
    Timeouts: ``connect_timeout_s`` for a pooled connection (waiting for one included) and the
    TCP connect, ``read_timeout_s`` from the request's last byte to the response and between two
    reads of it (a stalled stream). Writing the request has no timeout of its own (as before,
    through httpx's aiohttp transport): an upstream that accepts a connection but never reads
    a body larger than the socket buffers holds that request.
    """

    def __init__(
        self,
        base_url: str,
        *,
        pool_size: int,
        connect_timeout_s: float,
        read_timeout_s: float,
        keepalive_s: float = 4.0,
        tenant_pool_share: float = 1.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.slots = PoolShare(pool_size, int(pool_size * tenant_pool_share))
        self._slot_timeout_s = connect_timeout_s
        self.base = upstream_base(base_url)  # requests go there only (``proxy.upstream.urls``)
        self.base_url = str(self.base)
        self._urls: dict[str, yarl.URL] = {}  # path -> parsed URL (the chat path, mostly)
        self._client: httpx.AsyncClient | None = None
        self._session: aiohttp.ClientSession | None = None
        if transport is not None:
            limits = httpx.Limits(max_connections=pool_size, max_keepalive_connections=pool_size, keepalive_expiry=keepalive_s)
            timeout = httpx.Timeout(connect=connect_timeout_s, read=read_timeout_s, write=read_timeout_s, pool=connect_timeout_s)
            self._client = httpx.AsyncClient(transport=transport, timeout=timeout, limits=limits, trust_env=False,
                                             cookies=_no_cookies())
            return
        # an idle connection the server already closed fails the next request ("Server
        # disconnected"): keep idle connections shorter than the server does (uvicorn: 5 s)
        # certifi's CAs, as httpx trusted before (aiohttp alone would use the system store)
        connector = aiohttp.TCPConnector(limit=pool_size, keepalive_timeout=keepalive_s, ttl_dns_cache=60,
                                         ssl=httpx.create_ssl_context())
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s,
                                          sock_read=read_timeout_s),
            auto_decompress=False,  # bytes are relayed as the upstream sent them
            trust_env=False,
            skip_auto_headers=("Content-Type",),  # the client's own goes through, else none
            # one client serves every tenant: a cookie the upstream sets goes back to the client
            # that got it (in the response headers), never into a jar sent with others' requests
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    def url(self, path: str) -> str:
        """The upstream URL for ``path`` (relative to ``/v1``, e.g. ``/chat/completions``; raises
        ``BadRequest`` for one that would leave the upstream, see ``proxy.upstream.urls.join``)."""
        return str(self._url(path))

    def _url(self, path: str) -> yarl.URL:
        url = self._urls.get(path)
        if url is None:
            url = join(self.base, path)
            if len(path) <= URL_MEMO_PATH_CHARS:  # paths come from clients (the passthrough routes)
                if len(self._urls) >= URL_MEMO_PATHS:
                    self._urls.clear()
                self._urls[path] = url
        return url

    async def send(
        self,
        method: str,
        path: str,
        *,
        headers: list[tuple[str, str]],
        content: bytes | None,
        tenant: str | None = None,
    ) -> AiohttpResponse | HeldHttpxResponse:
        """Send ``content`` to ``path`` (already percent-encoded, query included) with ``headers``,
        in a pool slot of ``tenant``'s share (``None``: of the pool only); raises ``ProxyBusy``
        when no slot is free in time (see the class docstring)."""
        release = await self.slots.acquire(tenant, self._slot_timeout_s)
        try:
            if self._session is not None:
                resp = await self._session.request(method, self._url(path), headers=headers, data=content,
                                                   allow_redirects=False)
                held: AiohttpResponse | HeldHttpxResponse = AiohttpResponse(resp, release)
            else:
                assert self._client is not None
                request = self._client.build_request(method, self.url(path), headers=headers, content=content)
                held = HeldHttpxResponse(await self._client.send(request, stream=True), release)
        except BaseException as exc:
            release()
            raise translate(exc) from exc
        weakref.finalize(held, release)  # a response dropped unclosed gives its slot back too
        return held

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._client is not None:
            await self._client.aclose()


def _no_cookies() -> http.cookiejar.CookieJar:
    """A cookie jar that keeps nothing (its policy allows no domain)."""
    return http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


def translate(exc: BaseException) -> BaseException:
    """Map an aiohttp/httpx transport error to our 502/504 errors; other exceptions unchanged."""
    if isinstance(exc, (httpx.TimeoutException, asyncio.TimeoutError, TimeoutError)):
        # before the connection errors: aiohttp's timeouts are ``ClientError`` subclasses too
        return UpstreamTimeout(f"The upstream provider did not answer in time ({type(exc).__name__}).")
    if isinstance(exc, (httpx.ConnectError, aiohttp.ClientConnectorError)):
        return UpstreamUnreachable(f"The upstream provider could not be reached: {_describe(exc)}")
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError,
                        httpx.RemoteProtocolError, httpx.ReadError, ConnectionError)):
        return UpstreamUnreachable(f"The upstream provider closed the connection: {_describe(exc)}")
    if isinstance(exc, (httpx.HTTPError, aiohttp.ClientError)):
        return UpstreamUnreachable(f"Upstream transport error: {_describe(exc)}")
    return exc


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[:300]
