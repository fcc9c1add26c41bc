"""The client to the provider: ``Upstream``, one per app, built in the lifespan.

It owns what every request to the upstream shares: the transport (``UpstreamTransport``: aiohttp in
production, an injected httpx transport or fake in tests), the pool slots (``PoolShare``: how many
requests at once, and one tenant's share of them), the parsed URLs of the paths sent to, and the
base URL every request stays on (``proxy.upstream.urls``). Errors: ``UpstreamError`` only (the
transport maps its library's), or ``ProxyBusy`` when no pool slot is free in time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any

import yarl

from proxy.admission import PoolShare
from proxy.upstream.aiohttp_transport import AiohttpTransport
from proxy.upstream.transport import UpstreamResponse, UpstreamTransport
from proxy.upstream.urls import join, upstream_base

__all__ = ["HeldResponse", "Upstream"]

URL_MEMO_PATHS = 256
"""Parsed upstream URLs kept per path (building one was ~2% of a small request's CPU)."""
URL_MEMO_PATH_CHARS = 256
"""Longer paths (query strings of pass-through calls) are parsed each time, never kept."""


class HeldResponse:
    """A transport's response holding a pool slot until ``aclose``, or until it is garbage when
    nobody closes it (``__del__``; ``weakref.finalize`` did the same for 5 times the instructions)
    (``UpstreamResponse``; every read is the transport response's own, no layer added per chunk)."""

    __slots__ = ("_release", "_resp", "aiter_raw", "aread", "headers", "status_code")

    def __init__(self, resp: UpstreamResponse, release: Callable[[], None]) -> None:
        self._resp = resp
        self._release = release
        self.status_code: int = resp.status_code
        self.headers: Mapping[str, str] = resp.headers
        # the transport response's own methods, bound: no coroutine layer of ours per read
        self.aread: Callable[[], Coroutine[Any, Any, bytes]] = resp.aread
        """The whole body (``UpstreamResponse.aread``)."""
        self.aiter_raw: Callable[[], AsyncIterator[bytes]] = resp.aiter_raw
        """The body as it arrives (``UpstreamResponse.aiter_raw``)."""

    async def aclose(self) -> None:
        try:
            await self._resp.aclose()
        finally:
            self._release()  # the pool slot (``PoolShare``; idempotent)

    def __del__(self) -> None:
        self._release()  # a response dropped unclosed gives its slot back too (idempotent)


class Upstream:
    """One shared client to the provider, created in the app's lifespan.

    ``send`` returns a streaming ``UpstreamResponse`` that the caller reads or iterates and must
    ``aclose``. Raises ``UpstreamUnreachable`` (502) or ``UpstreamTimeout`` (504), never another
    library's exception. Pool: ``pool_size`` requests at once (``PoolShare``),
    ``tenant_pool_share`` of them (a fraction, at least one) for one tenant; a slot not free
    within ``connect_timeout_s`` raises ``ProxyBusy`` (503): the proxy is full, the provider did
    not time out. The slot is held until ``aclose`` (or, for a response nobody closes, until it
    is garbage). Timeouts: see ``AiohttpTransport``. ``transport``: any ``UpstreamTransport``
    (tests wrap an httpx transport in ``proxy.upstream.httpx_transport.HttpxTransport``); ``None``: aiohttp.
    ``slots``: another ``Upstream``'s (two upstreams on one transport share its connections, so
    they share one pool and one tenant share of it); ``None``: a pool of this one's own.
    Memo: the parsed URL of at most ``URL_MEMO_PATHS`` paths of at most ``URL_MEMO_PATH_CHARS``
    characters (cleared whole when full).
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
        transport: UpstreamTransport | None = None,
        slots: PoolShare | None = None,
    ) -> None:
        self.slots = slots if slots is not None else PoolShare(pool_size, int(pool_size * tenant_pool_share))
        self._slot_timeout_s = connect_timeout_s
        self.base = upstream_base(base_url)  # requests go there only (``proxy.upstream.urls``)
        self.base_url = str(self.base)
        self._urls: dict[str, yarl.URL] = {}  # path -> parsed URL (the chat path, mostly)
        self.transport: UpstreamTransport = transport if transport is not None else AiohttpTransport(
            pool_size=pool_size, connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s,
            keepalive_s=keepalive_s)

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
    ) -> HeldResponse:
        """Send ``content`` to ``path`` (already percent-encoded, query included) with ``headers``,
        in a pool slot of ``tenant``'s share (``None``: of the pool only); raises ``ProxyBusy``
        when no slot is free in time, ``BadRequest`` for a path off the upstream, ``UpstreamError``
        when the upstream fails (see the class docstring)."""
        release = await self.slots.acquire(tenant, self._slot_timeout_s)
        try:
            resp = await self.transport.send(method, self._url(path), headers=headers, content=content)
        except BaseException:
            release()
            raise
        return HeldResponse(resp, release)

    async def aclose(self) -> None:
        await self.transport.aclose()
