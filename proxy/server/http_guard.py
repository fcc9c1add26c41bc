"""The HTTP server's own bounds: uvicorn's httptools protocol with limits it does not have.

uvicorn bounds the idle time between two requests of a connection (``timeout_keep_alive``) and,
with h11 only, the size of an incomplete event (``h11_max_incomplete_event_size``). httptools (the
faster parser ``http="auto"`` picks) bounds neither header size nor count, and no server setting
bounds the time a request's headers or body take to arrive, or the number of open connections
(``limit_concurrency`` answers requests with a plain-text 503 once the connection count reaches it,
so idle sockets would make it refuse everyone). ``GuardedHttpToolsProtocol`` adds, per connection:

* request line + headers at most ``max_header_bytes`` (bytes) and ``max_headers`` fields: else 431;
  a chunked body's trailers (and any framing between two reads that carry body bytes) at most
  ``max_header_bytes`` too, counted with the headers' fields against ``max_headers``: else 431
  (trailers are not added to the request's headers);
* the headers complete within ``header_timeout_s`` of the connection (or of a kept-alive
  request's first byte): else 408 and closed; a request's body complete within ``body_timeout_s``
  of its headers: else 408 (if no response started) and closed; while the application has not
  read what arrived (uvicorn paused reading: the proxy is the slow one), the body's time restarts;
* at most ``max_connections`` open connections (those answered and lingering included): a new
  one past it closes, in this order, a lingering one; the connection that has waited longest
  without a request (idle, or sending headers slowly) if for ``EVICT_GRACE_S`` or more; the one
  receiving a body slowest (body bytes per second since its headers, over at least
  ``EVICT_GRACE_S``) if below ``EVICT_BELOW_BYTES_PER_S``, answered 503 (a body the proxy has
  not read yet is never counted slow); the longest waiting. Only a request whose body is complete
  (being served) or arriving fast is never closed: with only those open, the new connection is
  answered 503 and closed.

Errors are OpenAI's envelope (``proxy.errors``) with ``connection: close``. ``server_options``
returns the keyword arguments of ``uvicorn.run``/``uvicorn.Config`` for a ``Settings``; it also
has uvicorn's check of response header names skip the regex search for the names the proxy
sends with every answer (``proxy.server.header_names``): the same checks, fewer instructions.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any, ClassVar

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy.server.header_names import install_header_name_check
from proxy.server.keep_alive import KeepAliveTimer
from proxy.settings import Settings

log = logging.getLogger("context_proxy.http")

FD_RESERVE = 64
"""File descriptors kept for everything but client sockets (database, logs, tokenizer files)."""
LINGER_S = 2.0
"""Seconds a connection answered with one of our errors stays open to drain what the client sends."""
EVICT_GRACE_S = 1.0
"""Seconds a body's receive rate is averaged over at least (a body whose headers just came is not
judged on its first milliseconds; it still rates 0 until bytes arrive, after older silent ones)."""
EVICT_BELOW_BYTES_PER_S = 64 * 1024
"""With the connection cap reached, a connection whose body arrives slower than this (bytes per
second) may be closed to admit a new one."""


class _TooLarge(Exception):
    """Raised inside a parser callback: the request's headers passed a bound."""


def _response(status: int, reason: bytes, message: str, code: str, extra: bytes = b"") -> bytes:
    kind = "service_unavailable" if status == 503 else "invalid_request_error"
    body = orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n%s\r\n"
            % (status, reason, len(body), extra)) + body


class GuardedHttpToolsProtocol(KeepAliveTimer):
    """``HttpToolsProtocol`` with the bounds of the module docstring (class attributes, set by
    ``guarded_protocol``), its keep-alive timer kept across requests (``KeepAliveTimer``)."""

    max_header_bytes: ClassVar[int] = 64 * 1024
    max_headers: ClassVar[int] = 100
    header_timeout_s: ClassVar[float] = 10.0
    body_timeout_s: ClassVar[float] = 60.0
    max_connections: ClassVar[int] = 1024
    _waiting: ClassVar[dict[GuardedHttpToolsProtocol, None]]
    """Connections without a request in progress, longest waiting first (one dict per server class)."""
    _closing: ClassVar[dict[GuardedHttpToolsProtocol, None]]
    """Connections answered with one of our errors, lingering (``_answer_and_close``): evicted first."""
    _gone: ClassVar[list[int]]
    """[connections closed by an eviction whose ``connection_lost`` has not come yet]"""
    _receiving: ClassVar[dict[GuardedHttpToolsProtocol, None]]
    """Connections whose request's headers came and body is still arriving, oldest first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes: int | None = 0
        """Bytes received since the last request's headers completed (``None``: in a body)."""
        self._head_fields = 0
        self._evicted = False
        """Closed by an eviction, counted in ``_gone`` until ``connection_lost``."""
        self._waiting_since = 0.0
        """Loop time this connection last began to wait for a request (``_wait``)."""
        self._body_bytes = 0
        """Body bytes of the request being received (``on_body``)."""
        self._body_since = 0.0
        """Loop time its headers completed."""
        self._body_fed = False
        """``on_body`` ran during the current ``feed_data``."""
        self._loose_bytes = 0
        """Bytes received in a body since the last read that carried body bytes (chunked framing,
        trailers): bounded by ``max_header_bytes``."""
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_of: str | None = None
        """What the armed deadline waits for: ``"headers"`` or ``"body"``."""
        self._too_large = ""
        self._discarding = False
        """An error was answered: what the client still sends is read and dropped until it closes
        (``LINGER_S`` at most), so closing does not reset the connection before it reads the answer."""

    # --- connections ---
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        while self._live() > self.max_connections:  # a connection answered and lingering counts too
            if not self._evict_one():
                log.warning("connection refused: %d connections open, each serving a request or receiving "
                            "its body fast",
                            self._live() - 1)
                self._answer_and_close(_response(503, b"Service Unavailable", "The proxy is busy (too many open "
                                                 "connections); retry shortly.", "proxy_busy", b"retry-after: 1\r\n"))
                return
        self._wait()
        self._arm("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._waiting.pop(self, None)
        self._closing.pop(self, None)
        self._receiving.pop(self, None)
        if self._evicted:
            self._gone[0] -= 1
            self._evicted = False
        self._disarm()
        super().connection_lost(exc)

    def _live(self) -> int:
        """Open connections, not counting those an eviction closed (until their ``connection_lost``)."""
        return len(self.connections) - self._gone[0]

    def _drop(self, victim: GuardedHttpToolsProtocol) -> None:
        """Close ``victim`` now, not counted as open from here on (``_live``)."""
        if not victim._evicted:
            victim._evicted = True
            self._gone[0] += 1
        victim.transport.close()

    def _wait(self) -> None:
        self._waiting.pop(self, None)
        self._waiting[self] = None
        self._waiting_since = self.loop.time()

    def _evict_one(self) -> bool:
        """Close one connection to make room for ``self``: a lingering one, else one waiting (no
        request) for ``EVICT_GRACE_S`` or more, else the slowest body begun ``EVICT_GRACE_S`` or
        more ago, else of the longest waiting and the slowest body just begun the one there first
        (an idle connection loses nothing; a body in progress would get a 503; a client that has
        just connected is not closed for a body that began before it). False if none qualifies."""
        for closing in self._closing:
            self._closing.pop(closing)
            self._drop(closing)
            return True
        oldest = next((conn for conn in self._waiting if conn is not self), None)
        if oldest is not None and self.loop.time() - oldest._waiting_since >= EVICT_GRACE_S:
            self._close_waiting(oldest)
            return True
        victim = self._slowest_body(young=False)
        if victim is None:
            young = self._slowest_body(young=True)
            # of an idle connection and a body just begun, the one there first goes: an idle flood
            # older than a body loses nothing, and a client that connected a moment ago (its request
            # not read yet) is not closed for a silent body that began before it
            if oldest is not None and (young is None or oldest._waiting_since <= young._body_since):
                self._close_waiting(oldest)
                return True
            victim = young
        if victim is not None:
            log.warning("connection cap reached: closing a connection whose body arrives at %.0f bytes/s",
                        victim._body_bytes / max(self.loop.time() - victim._body_since, EVICT_GRACE_S))
            victim._abort(_response(503, b"Service Unavailable", "The proxy is at its connection limit and this "
                                    "request's body arrived too slowly; retry shortly.", "proxy_busy",
                                    b"retry-after: 1\r\n"))
            return True
        if oldest is not None:
            self._close_waiting(oldest)
            return True
        return False

    def _close_waiting(self, victim: GuardedHttpToolsProtocol) -> None:
        self._waiting.pop(victim)
        victim._disarm()
        self._drop(victim)

    def _slowest_body(self, *, young: bool) -> GuardedHttpToolsProtocol | None:
        """The connection in ``_receiving`` with the lowest body rate below
        ``EVICT_BELOW_BYTES_PER_S`` (the oldest of equals) among bodies begun less than
        ``EVICT_GRACE_S`` ago (``young``) or longer ago; not counting one whose reading is paused
        (the proxy has not read what came); ``None`` if none."""
        now = self.loop.time()
        # a body whose headers came a moment ago rates 0 until its first bytes come: it must not go
        # before a body that has trickled for a minute, nor before an idle connection (review)
        slowest, lowest = None, float(EVICT_BELOW_BYTES_PER_S)
        for conn in self._receiving:
            if conn is self or conn.flow.read_paused or (now - conn._body_since < EVICT_GRACE_S) != young:
                continue
            rate = conn._body_bytes / max(now - conn._body_since, EVICT_GRACE_S)
            if rate < lowest:
                slowest, lowest = conn, rate
        return slowest

    # --- deadlines ---
    def _arm(self, what: str) -> None:
        self._disarm()
        delay_s = self.header_timeout_s if what == "headers" else self.body_timeout_s
        self._deadline, self._deadline_of = self.loop.call_later(delay_s, self._expired), what

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = self._deadline_of = None

    def _rearm(self) -> None:
        """After the parser took a chunk: the deadline of what is still awaited, armed once (a
        request that arrives in one chunk arms none; a slow one cannot push its deadline on)."""
        if self._head_bytes:  # part of a request's head came, not all of it
            if self._deadline_of != "headers":
                self._arm("headers")
        elif self._head_bytes is None and self.cycle.more_body and not self.cycle.response_complete:
            if self._deadline_of != "body":
                self._arm("body")
        elif self._deadline is not None and self._deadline_of != "headers":
            self._disarm()

    def _expired(self) -> None:
        what, self._deadline, self._deadline_of = self._deadline_of, None, None
        if self.transport.is_closing():
            return
        in_body = what == "body"
        if in_body and self.flow.read_paused:
            # the application has not read what came (it is busy): the proxy is slow, not the client
            self._arm("body")
            return
        response = _response(408, b"Request Timeout", f"The request {what} did not arrive in time.", "request_timeout")
        if in_body:
            self._abort(response)
        else:
            self._answer_and_close(response)

    def _abort(self, response: bytes) -> None:
        """End the request whose body is arriving: answer ``response`` (closed after), or only
        close when a response is already under way; the application's ``receive`` ends
        (``http.disconnect``) and its late answer is not written after ours."""
        cycle = self.cycle
        if cycle is not None and cycle.response_started:
            self._disarm()
            self._receiving.pop(self, None)
            self._drop(self)  # nothing can be said any more
            return
        if cycle is not None:
            cycle.response_complete = True
            cycle.disconnected = True
            cycle.message_event.set()
        self._answer_and_close(response)

    def _answer_and_close(self, response: bytes) -> None:
        """Send ``response`` (``connection: close``), end our side, drop what the client still
        sends, and close after ``LINGER_S`` or when the client closes first."""
        self._disarm()
        self._discarding = True
        self._waiting.pop(self, None)
        self._receiving.pop(self, None)
        self._closing[self] = None
        transport = self.transport
        transport.write(response)
        if transport.can_write_eof():
            transport.write_eof()
        self.loop.call_later(LINGER_S, transport.close)

    # --- parsing ---
    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        self._unset_keepalive_if_required()
        in_body = self._head_bytes is None
        if not in_body:
            self._head_bytes += len(data)  # type: ignore[operator]
        self._body_fed = False
        try:
            self.parser.feed_data(data)
            # httptools keeps an unfinished header line itself: bound what arrived without an end
            if self._head_bytes is not None and self._head_bytes > self.max_header_bytes:
                self._too_large = f"The request line and headers are larger than {self.max_header_bytes} bytes."
                self._refuse_head()
                return
            if self._body_fed:
                self._loose_bytes = 0
            elif in_body and self._head_bytes is None:  # no body byte in this read: framing or trailers
                self._loose_bytes += len(data)
                if self._loose_bytes > self.max_header_bytes:
                    self._abort(_response(431, b"Request Header Fields Too Large", "The request's chunked framing or "
                                          f"trailers are larger than {self.max_header_bytes} bytes.",
                                          "request_header_fields_too_large"))
                    return
            # (nothing to arm or disarm when no head is partway and no deadline is armed: the
            # usual end of a read that carried a whole request)
            if (self._head_bytes != 0 or self._deadline is not None) and not self.transport.is_closing():
                self._rearm()
        except httptools.HttpParserCallbackError:
            if not self._too_large:
                raise
            if self._head_bytes is None:
                self._abort(_response(431, b"Request Header Fields Too Large", self._too_large,
                                      "request_header_fields_too_large"))
            else:
                self._refuse_head()
        except httptools.HttpParserError:
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def _refuse_head(self) -> None:
        self._answer_and_close(_response(431, b"Request Header Fields Too Large", self._too_large,
                                         "request_header_fields_too_large"))

    # (each callback calls ``HttpToolsProtocol``'s through a module name, not ``super()``: Python
    # 3.11 builds a ``super`` object for every such call, nine a request)
    def on_message_begin(self) -> None:
        _on_message_begin(self)
        self._head_fields = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_fields += 1
        if self._head_fields > self.max_headers:
            self._too_large = f"The request has more than {self.max_headers} header fields."
            raise _TooLarge
        if self._head_bytes is not None:  # a trailer (``None``: after the headers) is counted only
            _on_header(self, name, value)

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self._body_bytes, self._body_since, self._loose_bytes = 0, self.loop.time(), 0
        self._waiting.pop(self, None)
        self._receiving[self] = None
        _on_headers_complete(self)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        self._body_fed = True
        _on_body(self, body)

    def on_message_complete(self) -> None:
        if self._deadline is not None:
            self._disarm()
        self._head_bytes = 0
        self._receiving.pop(self, None)
        _on_message_complete(self)

    def on_response_complete(self) -> None:
        _on_response_complete(self)
        if not self.transport.is_closing() and not self.pipeline:
            # idle until the keep-alive timeout (uvicorn's) or the next request (``_wait``, inline)
            waiting = self._waiting
            waiting.pop(self, None)
            waiting[self] = None
            self._waiting_since = self.loop.time()


_on_message_begin = HttpToolsProtocol.on_message_begin
_on_header = HttpToolsProtocol.on_header
_on_headers_complete = HttpToolsProtocol.on_headers_complete
_on_body = HttpToolsProtocol.on_body
_on_message_complete = HttpToolsProtocol.on_message_complete
_on_response_complete = KeepAliveTimer.on_response_complete


def guarded_protocol(settings: Settings) -> type[GuardedHttpToolsProtocol]:
    """A ``GuardedHttpToolsProtocol`` class with ``settings``' bounds (one per server); uvicorn's
    response header name check installed (``install_header_name_check``)."""
    install_header_name_check()
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {
        "max_header_bytes": settings.http_max_header_bytes,
        "max_headers": settings.http_max_headers,
        "header_timeout_s": settings.http_header_timeout_s,
        "body_timeout_s": settings.http_body_timeout_s,
        "max_connections": connection_cap(settings),
        "_waiting": {},
        "_closing": {},
        "_receiving": {},
        "_gone": [0],
    })


def connection_cap(settings: Settings) -> int:
    """``http_max_connections``, lowered (and a warning logged) when the process's file-descriptor
    limit (raised to its hard limit first) cannot hold that many client sockets next to the upstream
    pool, the database pool and ``FD_RESERVE``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = settings.http_max_connections + settings.upstream_pool_size + 2 * settings.database_pool_size + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= need:
        return settings.http_max_connections
    cap = max(1, soft - (need - settings.http_max_connections))
    log.warning("http_max_connections lowered from %d to %d: the file-descriptor limit is %d",
                settings.http_max_connections, cap, soft)
    return cap


def server_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.run``/``uvicorn.Config`` for the proxy's bounds, no
    ``server`` header naming the software (a scanner's hint; each header costs uvicorn two regex
    checks an answer), and no ``X-Forwarded-For``/``X-Forwarded-Proto`` rewriting of the scope by
    uvicorn (its ``ProxyHeadersMiddleware``, on by default: one more coroutine and a scan of the
    headers on every request, about 6,000 instructions, callgrind). The app applies that
    middleware itself, with the same trust, on every route but the chat and Messages endpoints,
    which read neither the client's address nor the scheme (``proxy.server.forwarded``):
    Starlette's redirects and FastAPI's telemetry name the scheme, ``https`` behind a trusted
    TLS-terminating proxy."""
    return {
        "http": guarded_protocol(settings),
        "timeout_keep_alive": max(1, round(settings.http_keep_alive_s)),
        "server_header": False,  # no ``server: uvicorn`` on every answer (``date`` stays: RFC 9110 §6.6.1)
        "proxy_headers": False,
    }
