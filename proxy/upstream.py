"""The HTTP client to the provider: one shared httpx client over aiohttp's connection pool.

Measured on this machine (issue 2): httpx over the ``httpx-aiohttp`` transport serves about
1,500 requests/s at 16 concurrent requests against about 560 for httpx's own pool, so the proxy
keeps httpx's API (tests use respx and httpx transports) but not its default transport.
Transport errors are translated here into ``UpstreamUnreachable`` (502) / ``UpstreamTimeout`` (504).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from proxy.errors import UpstreamTimeout, UpstreamUnreachable

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
"""Headers addressed to this proxy, not to the provider."""


def forward_request_headers(
    headers: Iterable[tuple[str, str]], *, upstream_api_key: str | None, identity: bool
) -> list[tuple[str, str]]:
    """Client headers to send upstream: hop-by-hop and proxy headers dropped.

    With ``upstream_api_key`` the client's ``Authorization`` is replaced by the proxy's key. With
    ``identity`` the upstream is asked not to compress (the proxy reads chat replies to log them).
    """
    out: list[tuple[str, str]] = []
    for name, value in headers:
        low = name.lower()
        if low in HOP_BY_HOP or low in PROXY_HEADERS or low.startswith("x-context-proxy-"):
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


def response_headers(headers: httpx.Headers, *, keep_encoding: bool) -> dict[str, str]:
    """Upstream response headers to pass back (content type, request id, rate limits, retry-after…)."""
    out: dict[str, str] = {}
    for name, value in headers.multi_items():
        low = name.lower()
        if low in HOP_BY_HOP or low in OWN_RESPONSE_HEADERS or (not keep_encoding and low == "content-encoding"):
            continue
        if low in out:
            out[low] += ", " + value
        else:
            out[low] = value
    return out


class Upstream:
    """One shared client to the provider, created in the app's lifespan.

    ``send`` returns a streaming ``httpx.Response`` (the caller reads or iterates it and must
    ``aclose`` it). Raises ``UpstreamUnreachable`` or ``UpstreamTimeout``; never another library's
    exception.
    """

    def __init__(
        self,
        base_url: str,
        *,
        pool_size: int,
        connect_timeout_s: float,
        read_timeout_s: float,
        keepalive_s: float = 4.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # an idle connection the server already closed fails the next request ("Server
        # disconnected"): keep idle connections shorter than the server does (uvicorn: 5 s)
        limits = httpx.Limits(max_connections=pool_size, max_keepalive_connections=pool_size, keepalive_expiry=keepalive_s)
        timeout = httpx.Timeout(connect=connect_timeout_s, read=read_timeout_s, write=read_timeout_s, pool=connect_timeout_s)
        self._client = httpx.AsyncClient(
            transport=transport or AiohttpTransport(limits=limits, trust_env=False),
            timeout=timeout,
            limits=limits,
            trust_env=False,
        )

    def url(self, path: str) -> str:
        """The upstream URL for ``path`` (relative to ``/v1``, e.g. ``/chat/completions``)."""
        return self.base_url + path

    async def send(
        self,
        method: str,
        path: str,
        *,
        headers: list[tuple[str, str]],
        content: bytes | None,
        params: Mapping[str, str] | str | None = None,
    ) -> httpx.Response:
        request = self._client.build_request(method, self.url(path), headers=headers, content=content, params=params)
        try:
            return await self._client.send(request, stream=True)
        except BaseException as exc:
            raise translate(exc) from exc

    async def aclose(self) -> None:
        await self._client.aclose()


def translate(exc: BaseException) -> BaseException:
    """Map an httpx/aiohttp transport error to our 502/504 errors; other exceptions unchanged."""
    cause = exc.__cause__
    if isinstance(exc, httpx.ConnectError) or isinstance(cause, aiohttp.ClientConnectorError):
        return UpstreamUnreachable(f"The upstream provider could not be reached: {_describe(exc)}")
    if isinstance(cause, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)) or isinstance(
        exc, (httpx.RemoteProtocolError, httpx.ReadError)
    ):
        return UpstreamUnreachable(f"The upstream provider closed the connection: {_describe(exc)}")
    if isinstance(exc, (httpx.TimeoutException, asyncio.TimeoutError, TimeoutError)):
        return UpstreamTimeout(f"The upstream provider did not answer in time ({type(exc).__name__}).")
    if isinstance(exc, httpx.HTTPError):
        return UpstreamUnreachable(f"Upstream transport error: {_describe(exc)}")
    return exc


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[:300]
