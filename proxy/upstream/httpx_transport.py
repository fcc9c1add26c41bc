"""``UpstreamTransport`` over an injected ``httpx`` transport (tests' ``MockTransport`` or
``ASGITransport``, the benchmarks' httpx row): ``create_app(..., upstream_transport=...)``.

httpx's exceptions never leave this module: they become ``UpstreamError``s (``httpx_error``).
"""

from __future__ import annotations

import asyncio
import http.cookiejar
from collections.abc import AsyncIterator

import httpx
import yarl

from proxy.errors import UpstreamError
from proxy.upstream.transport import OS_ERRORS, upstream_error

TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (httpx.HTTPError, *OS_ERRORS)
"""What httpx raises when a connection fails (mapped by ``httpx_error``)."""


def httpx_error(exc: BaseException) -> UpstreamError:
    """Our error for one of ``TRANSPORT_ERRORS`` (``proxy.upstream.transport.upstream_error``)."""
    return upstream_error(exc, timeouts=(httpx.TimeoutException,), refused=(httpx.ConnectError,),
                          closed=(httpx.RemoteProtocolError, httpx.ReadError))


class HttpxResponse:
    """An ``httpx.Response`` opened with ``stream=True`` (``UpstreamResponse``). ``headers``:
    ``httpx.Headers`` (``items()`` joins a repeated name's values with ``", "``)."""

    __slots__ = ("_resp", "headers", "status_code")

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self.status_code: int = resp.status_code
        self.headers: httpx.Headers = resp.headers

    async def aread(self) -> bytes:
        """The whole body, decoded by httpx (``content-encoding``)."""
        try:
            return await self._resp.aread()
        except TRANSPORT_ERRORS as exc:
            raise httpx_error(exc) from exc

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.aiter_raw():
                yield chunk
        except TRANSPORT_ERRORS as exc:
            raise httpx_error(exc) from exc

    async def aclose(self) -> None:
        """Close the response (a body read to its end: httpx closed it then, nothing to do). Shielded:
        httpx marks its response closed before it closes the stream, so a close a cancel cut
        halfway is never done by a second ``aclose`` (a relay's own cleanup runs unshielded)."""
        if not self._resp.is_closed:
            await asyncio.shield(self._close())

    async def _close(self) -> None:
        try:
            await self._resp.aclose()
        except TRANSPORT_ERRORS:
            pass  # closing a broken connection: it is gone either way


class HttpxTransport:
    """``UpstreamTransport`` over ``transport`` through one ``httpx.AsyncClient`` (no cookies kept,
    no environment proxies). ``pool_size``, ``connect_timeout_s``, ``read_timeout_s``,
    ``keepalive_s``: as ``AiohttpTransport``'s (httpx's write timeout is the read timeout)."""

    def __init__(self, transport: httpx.AsyncBaseTransport, *, pool_size: int, connect_timeout_s: float,
                 read_timeout_s: float, keepalive_s: float) -> None:
        limits = httpx.Limits(max_connections=pool_size, max_keepalive_connections=pool_size,
                              keepalive_expiry=keepalive_s)
        timeout = httpx.Timeout(connect=connect_timeout_s, read=read_timeout_s, write=read_timeout_s,
                                pool=connect_timeout_s)
        self._client = httpx.AsyncClient(transport=transport, timeout=timeout, limits=limits, trust_env=False,
                                         cookies=_no_cookies())

    async def send(self, method: str, url: yarl.URL, *, headers: list[tuple[str, str]],
                   content: bytes | None) -> HttpxResponse:
        try:
            request = self._client.build_request(method, str(url), headers=headers, content=content)
            return HttpxResponse(await self._client.send(request, stream=True))
        except TRANSPORT_ERRORS as exc:
            raise httpx_error(exc) from exc

    async def aclose(self) -> None:
        await self._client.aclose()


def _no_cookies() -> http.cookiejar.CookieJar:
    """A cookie jar that keeps nothing (its policy allows no domain)."""
    return http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
