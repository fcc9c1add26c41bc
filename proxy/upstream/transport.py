"""What the proxy needs of an upstream connection: the transport protocol and its one error mapping.

A transport sends one request to a URL of the configured upstream and returns an
``UpstreamResponse`` (status, headers, the body read whole or as it arrives, ``aclose``). Two
implement it: ``proxy.upstream.aiohttp_transport.AiohttpTransport`` (production) and
``proxy.upstream.httpx_transport.HttpxTransport`` (an injected ``httpx`` transport: tests and the
benchmarks' httpx row); a test may pass any object with this shape (a fake provider in-process).

Errors: ``send``, ``aread`` and ``aiter_raw`` raise ``UpstreamError`` subclasses only
(``UpstreamTimeout``, 504; ``UpstreamUnreachable``, 502), never aiohttp's, httpx's or ``OSError``:
each transport maps its library's exceptions with ``upstream_error`` where they occur (naming
which of its classes are timeouts, refused connections and closed ones), so no caller handles
another library's exception types and nothing here imports aiohttp or httpx. ``asyncio.CancelledError`` passes through.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import yarl

from proxy.errors import UpstreamError, UpstreamTimeout, UpstreamUnreachable

OS_ERRORS: tuple[type[BaseException], ...] = (OSError, asyncio.TimeoutError)
"""What any transport may raise when a connection fails, besides its library's own errors."""
Classes = tuple[type[BaseException], ...]

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


def upstream_error(exc: BaseException, *, timeouts: Classes = (), refused: Classes = (),
                   closed: Classes = ()) -> UpstreamError:
    """Our error for a transport's exception (its library's, ``OS_ERRORS``): a timeout (one of
    ``timeouts``, or asyncio's) is ``UpstreamTimeout``, anything else ``UpstreamUnreachable``
    (its message says which: ``refused``, a connection that could not be made; ``closed``, one
    that broke; in at most ``DESCRIPTION_CHARS`` of the library's text). A transport calls it
    with its library's classes (``aiohttp_error``, ``httpx_error``)."""
    if isinstance(exc, (*timeouts, asyncio.TimeoutError, TimeoutError)):
        # before the connection errors: aiohttp's timeouts are ``ClientError`` subclasses too
        return UpstreamTimeout(f"The upstream provider did not answer in time ({type(exc).__name__}).")
    if isinstance(exc, refused):
        return UpstreamUnreachable(f"The upstream provider could not be reached: {_describe(exc)}")
    if isinstance(exc, (*closed, ConnectionError)):
        return UpstreamUnreachable(f"The upstream provider closed the connection: {_describe(exc)}")
    return UpstreamUnreachable(f"Upstream transport error: {_describe(exc)}")


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[:DESCRIPTION_CHARS]
