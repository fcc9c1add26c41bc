"""proxy/upstream/client.py over the aiohttp transport on a real socket: what is sent and how replies are read."""

from __future__ import annotations

import asyncio
import gzip
import zlib

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.errors import UpstreamTimeout, UpstreamUnreachable
from proxy.upstream.aiohttp_transport import aiohttp_error
from proxy.upstream.client import Upstream
from proxy.upstream.httpx_transport import HttpxTransport

BODY = b'{"id": "chatcmpl-1", "choices": []}' * 20


async def _serve(reply: bytes, seen: list[bytes], *, stall: bool = False) -> tuple[asyncio.Server, str]:
    """A one-response-per-request HTTP/1.1 server on a free port; ``seen`` gets each raw request."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")), 0)
        seen.append(head + await reader.readexactly(length))
        if stall:
            await asyncio.sleep(30)
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


def _response(body: bytes, encoding: str | None) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    if encoding:
        head += b"content-encoding: " + encoding.encode() + b"\r\n"
    return head + b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body


@pytest.mark.parametrize("encoding, encode", [(None, lambda b: b), ("gzip", gzip.compress), ("deflate", zlib.compress),
                                              ("deflate", lambda b: zlib.compress(b)[2:-4])])
async def test_a_compressed_reply_is_read_decoded_and_the_request_goes_as_given(encoding, encode) -> None:
    """Asked for ``identity``, an upstream may compress all the same: the body is read decoded
    (httpx did that before), so the proxy parses and logs JSON, not gzip bytes."""
    seen: list[bytes] = []
    server, url = await _serve(_response(encode(BODY), encoding), seen)
    upstream = Upstream(url, pool_size=4, connect_timeout_s=2, read_timeout_s=2)
    try:
        resp = await upstream.send("POST", "/files/a%2Fb%20c?x=%20y&z=1+2", headers=[("accept-encoding", "identity")],
                                   content=b"{}")
        assert resp.status_code == 200 and await resp.aread() == BODY
        await resp.aclose()
    finally:
        await upstream.aclose()
        server.close()
    assert seen[0].startswith(b"POST /v1/files/a%2Fb%20c?x=%20y&z=1+2 HTTP/1.1\r\n")  # as the client wrote it
    assert b"content-type" not in seen[0].lower()  # nothing the client did not send


async def _expect_failure(url: str, error: type[Exception]) -> None:
    upstream = Upstream(url, pool_size=4, connect_timeout_s=1, read_timeout_s=0.3)
    try:
        with pytest.raises(error):
            await upstream.send("POST", "/chat/completions", headers=[], content=b"{}")
    finally:
        await upstream.aclose()


async def test_a_stalled_upstream_times_out_and_a_refused_one_is_unreachable() -> None:
    server, url = await _serve(b"", [], stall=True)
    try:
        await _expect_failure(url, UpstreamTimeout)  # no answer within the read timeout
    finally:
        server.close()  # the listening socket closes now (the stalled handler is left to sleep)
    await _expect_failure(url, UpstreamUnreachable)  # nobody listens there any more


def test_timeouts_are_mapped_before_connection_errors() -> None:
    """``TimeoutError`` is an ``OSError`` in Python 3.11, and aiohttp's timeouts are client errors."""
    import aiohttp

    assert isinstance(aiohttp_error(aiohttp.ServerTimeoutError("read")), UpstreamTimeout)
    assert isinstance(aiohttp_error(TimeoutError()), UpstreamTimeout)
    assert isinstance(aiohttp_error(aiohttp.ServerDisconnectedError()), UpstreamUnreachable)
    assert isinstance(aiohttp_error(aiohttp.ClientPayloadError("cut")), UpstreamUnreachable)


async def test_a_cookie_the_upstream_sets_is_never_sent_with_a_later_request() -> None:
    """One upstream client serves every client of the proxy: a ``Set-Cookie`` answered to one
    must not ride along with the next request (someone else's, maybe). The header itself still
    reaches the client that got it (``response_headers`` keeps it)."""
    seen: list[bytes] = []
    reply = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nset-cookie: session=secret-of-client-a; Path=/\r\n"
             b"content-length: 2\r\nconnection: close\r\n\r\n{}")
    server, url = await _serve(reply, seen)
    url = url.replace("127.0.0.1", "localhost")  # a name: aiohttp's jar ignores cookies of IP addresses
    upstream = Upstream(url, pool_size=4, connect_timeout_s=2, read_timeout_s=2)
    try:
        for _ in range(2):
            resp = await upstream.send("POST", "/chat/completions", headers=[], content=b"{}")
            assert resp.headers.get("set-cookie", "").startswith("session=secret-of-client-a")
            await resp.aread()
            await resp.aclose()
    finally:
        await upstream.aclose()
        server.close()
    assert len(seen) == 2 and b"cookie" not in seen[1].lower()


async def test_the_httpx_transport_keeps_no_cookies_either() -> None:
    import httpx

    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("cookie"))
        return httpx.Response(200, headers={"set-cookie": "session=secret-of-client-a; Path=/"}, content=b"{}")

    upstream = Upstream("https://api.example.com/v1", pool_size=2, connect_timeout_s=1, read_timeout_s=1,
                        transport=HttpxTransport(httpx.MockTransport(handler), pool_size=2, connect_timeout_s=1,
                                                  read_timeout_s=1, keepalive_s=4.0))
    try:
        for _ in range(2):
            resp = await upstream.send("POST", "/chat/completions", headers=[], content=b"{}")
            assert resp.headers["set-cookie"].startswith("session=")  # still relayed to its client
            await resp.aread()
            await resp.aclose()
    finally:
        await upstream.aclose()
    assert seen == [None, None]


async def test_a_response_nobody_closes_gives_its_pool_slot_back_once_it_is_garbage() -> None:
    """A response dropped without ``aclose`` frees its pool slot (and its tenant's) when it is
    collected: the next request of a full pool gets it instead of ``ProxyBusy``."""
    import gc

    from proxy.errors import ProxyBusy

    server, url = await _serve(_response(BODY, None), [])
    upstream = Upstream(url, pool_size=2, connect_timeout_s=0.2, read_timeout_s=5, tenant_pool_share=1.0)
    try:
        held = [await upstream.send("POST", "/chat/completions", headers=[], content=b"{}", tenant="t")
                for _ in range(2)]
        assert await held[0].aread() == BODY
        with pytest.raises(ProxyBusy):  # both slots held
            await upstream.send("POST", "/chat/completions", headers=[], content=b"{}", tenant="t")
        await held[1].aclose()
        held.clear()  # the first one never closed
        gc.collect()
        for _ in range(2):  # both slots free again, the tenant's share too
            again = await upstream.send("POST", "/chat/completions", headers=[], content=b"{}", tenant="t")
            await again.aread()
            await again.aclose()
        assert upstream.slots._tenants == {}
    finally:
        await upstream.aclose()
        server.close()


def _reference_request_headers(headers, *, upstream_api_key, identity, key_header="authorization"):  # type: ignore[no-untyped-def]
    """``forward_request_headers`` as it was written before its one-pass form (the reference)."""
    from proxy.upstream.headers import _REQUEST_DROPPED, _REQUEST_DROPPED_UNDER_KEY, connection_tokens

    lows = [name.lower() for name, _ in headers]
    named = connection_tokens(headers) if "connection" in lows else frozenset()
    dropped = _REQUEST_DROPPED if upstream_api_key is None else _REQUEST_DROPPED_UNDER_KEY
    out = [(name, value) for (name, value), low in zip(headers, lows, strict=True)
           if not (low in dropped or low in named or low.startswith("x-context-proxy-")
                   or (identity and low == "accept-encoding"))]
    if upstream_api_key is not None:
        out.append((key_header, upstream_api_key if key_header == "x-api-key" else f"Bearer {upstream_api_key}"))
    if identity:
        out.append(("accept-encoding", "identity"))
    return out


def _reference_response_headers(pairs, *, keep_encoding, shared_key=False):  # type: ignore[no-untyped-def]
    """``response_headers`` as it was written before its one-pass form (the reference)."""
    from proxy.upstream.headers import (
        _RESPONSE_DROPPED,
        _RESPONSE_DROPPED_DECODED,
        OPERATOR_RESPONSE_HEADERS,
        OPERATOR_RESPONSE_PREFIXES,
        connection_tokens,
    )

    lows = [name.lower() for name, _ in pairs]
    named = connection_tokens(pairs) if "connection" in lows else frozenset()
    dropped = _RESPONSE_DROPPED if keep_encoding else _RESPONSE_DROPPED_DECODED
    out: dict[str, str] = {}
    for (_, value), low in zip(pairs, lows, strict=True):
        if low in dropped or low in named:
            continue
        if shared_key and (low in OPERATOR_RESPONSE_HEADERS or low.startswith(OPERATOR_RESPONSE_PREFIXES)):
            continue
        out[low] = out[low] + ", " + value if low in out else value
    return out


_HEADER_SETS = [
    [],
    [("Host", "x"), ("Content-Type", "application/json"), ("Authorization", "Bearer k"), ("Content-Length", "3")],
    [("content-type", "a"), ("X-Session-Id", "s"), ("x-context-proxy-compact-tool", "1"), ("Accept-Encoding", "gzip"),
     ("api-key", "k"), ("X-HTTP-Method-Override", "DELETE"), ("OpenAI-Organization", "o")],
    [("X-Foo", "1"), ("Connection", "X-Foo, keep-alive"), ("x-bar", "2"), ("Keep-Alive", "5"), ("x-foo", "3")],
    [("connection", ""), ("x-a", "1"), ("Connection", " , "), ("X-A", "2")],
    [("x-ratelimit-remaining", "1"), ("Set-Cookie", "a=1"), ("set-cookie", "b=2"), ("Date", "d"), ("Server", "s"),
     ("Content-Encoding", "gzip"), ("Transfer-Encoding", "chunked"), ("request-id", "r"), ("CONNECTION", "request-id")],
]


@pytest.mark.parametrize("pairs", _HEADER_SETS)
def test_the_one_pass_header_filters_keep_what_the_two_pass_ones_kept(pairs: list[tuple[str, str]]) -> None:
    """``forward_request_headers`` and ``response_headers`` lower each name once in one pass (a
    second only when a ``Connection`` header names others): the same headers as before, in order."""
    from proxy.upstream.headers import forward_request_headers, response_headers

    for key in (None, "sk-proxy"):
        for identity in (False, True):
            for key_header in ("authorization", "x-api-key"):
                kwargs = {"upstream_api_key": key, "identity": identity, "key_header": key_header}
                assert forward_request_headers(pairs, **kwargs) == _reference_request_headers(pairs, **kwargs)  # type: ignore[arg-type]
                assert forward_request_headers(iter(pairs), **kwargs) == _reference_request_headers(pairs, **kwargs)  # type: ignore[arg-type]
    for keep_encoding in (False, True):
        for shared_key in (False, True):
            expected = _reference_response_headers(pairs, keep_encoding=keep_encoding, shared_key=shared_key)
            assert response_headers(_Pairs(pairs), keep_encoding=keep_encoding, shared_key=shared_key) == expected
            # aiohttp's own headers: their ``items()`` view is read again (not copied) for a second pass
            multi = CIMultiDictProxy(CIMultiDict(pairs))
            assert response_headers(multi, keep_encoding=keep_encoding, shared_key=shared_key) == expected


class _Pairs:
    """Headers whose ``items()`` gives each pair as sent (as aiohttp's multidict does)."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = pairs

    def items(self) -> list[tuple[str, str]]:
        return list(self.pairs)
