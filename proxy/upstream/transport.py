"""What the proxy needs of an upstream connection: the transport protocol and its one error mapping.

A transport sends one request to a URL of the configured upstream and returns an
``UpstreamResponse`` (status, headers, the body read whole or as it arrives, ``aclose``). Two
implement it: ``proxy.upstream.aiohttp_transport.AiohttpTransport`` (production) and
``proxy.upstream.httpx_transport.HttpxTransport`` (an injected ``httpx`` transport: tests and the
benchmarks' httpx row); a test may pass any object with this shape (a fake provider in-process).

Errors: ``send``, ``aread`` and ``aiter_raw`` raise ``UpstreamError`` subclasses only
(``UpstreamTimeout``, 504; ``UpstreamUnreachable``, 502), never aiohttp's, httpx's or ``OSError``:
each transport maps its library's exceptions with ``upstream_error`` where they occur, so no
caller handles another library's exception types. ``asyncio.CancelledError`` passes through.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import aiohttp
import httpx
import yarl

from proxy.errors import UpstreamError, UpstreamTimeout, UpstreamUnreachable

TRANSPORT_ERRORS = (httpx.HTTPError, aiohttp.ClientError, OSError, asyncio.TimeoutError)
"""What aiohttp and httpx raise when a connection fails: the transports map them (``upstream_error``)."""

DESCRIPTION_CHARS = 300
"""An error's text is cut to this many characters in the message a client gets."""


class UpstreamResponse(Protocol):
    """One upstream response, its body not yet read.

    ``status_code``: the HTTP status. ``headers``: case-insensitive lookups; ``items()`` gives every
    header (a repeated name as one value joined with ``", "`` or once per value).
    ``aread()``: the whole body (bytes), decoded when the upstream compressed it although asked for
    ``identity``. ``aiter_raw()``: the body as it arrives, undecoded. ``aclose()``: give the
    connection back (to the pool when the body was read to its end, else closed, so a stream the
    client left is cancelled upstream too); idempotent, never raises a transport error.
    Reads raise ``UpstreamError`` only (module docstring).
    """

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def aread(self) -> bytes: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class UpstreamTransport(Protocol):
    """Sends requests to the upstream; one instance serves every request of the app.

    ``send``: ``url`` already checked to be on the upstream (``proxy.upstream.urls.join``), its path
    and query sent byte for byte; ``headers`` as given (no header added but what the HTTP library
    must); ``content`` the body or ``None``. Returns when the response's headers arrived; raises
    ``UpstreamError`` only. ``aclose``: close every connection (at the app's shutdown).
    """

    async def send(self, method: str, url: yarl.URL, *, headers: list[tuple[str, str]],
                   content: bytes | None) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...


def upstream_error(exc: BaseException) -> UpstreamError:
    """Our error for an exception of ``TRANSPORT_ERRORS`` (aiohttp, httpx, ``OSError``, timeouts):
    a timeout is ``UpstreamTimeout``, anything else ``UpstreamUnreachable`` (its message says
    which, in at most ``DESCRIPTION_CHARS`` of the library's text). Transports call it in
    ``except TRANSPORT_ERRORS as exc: raise upstream_error(exc) from exc``."""
    if isinstance(exc, (httpx.TimeoutException, asyncio.TimeoutError, TimeoutError)):
        # before the connection errors: aiohttp's timeouts are ``ClientError`` subclasses too
        return UpstreamTimeout(f"The upstream provider did not answer in time ({type(exc).__name__}).")
    if isinstance(exc, (httpx.ConnectError, aiohttp.ClientConnectorError)):
        return UpstreamUnreachable(f"The upstream provider could not be reached: {_describe(exc)}")
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError,
                        httpx.RemoteProtocolError, httpx.ReadError, ConnectionError)):
        return UpstreamUnreachable(f"The upstream provider closed the connection: {_describe(exc)}")
    return UpstreamUnreachable(f"Upstream transport error: {_describe(exc)}")


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[:DESCRIPTION_CHARS]
