"""uvicorn's keep-alive timeout with one timer a connection (``proxy.server.keep_alive``), under a
real uvicorn server with the proxy's server options and raw sockets: a connection that keeps
sending requests stays open past the timeout, an idle one closes when uvicorn's would, and the
timer is kept across the connection's requests (uvicorn's own makes one a request)."""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy.server import http_guard
from proxy.server.http_guard import GuardedHttpToolsProtocol
from tests.e2e.conftest import CLIENT_KEY, Upstream
from tests.fakes.server import UvicornServer
from tests.support.sockets import read_response, recv_until

HEALTH = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"


def _closed_after(sock: socket.socket, within_s: float) -> float | None:
    """Seconds until the server closes ``sock`` (EOF), or ``None`` if it is still open after ``within_s``."""
    started = time.monotonic()
    sock.settimeout(within_s)
    try:
        return time.monotonic() - started if sock.recv(1) == b"" else None
    except TimeoutError:
        return None


def test_a_busy_connection_outlives_the_keep_alive_timeout_and_closes_once_idle_that_long(
        bounded: Callable[..., UvicornServer]) -> None:
    """Keep-alive 1 s: requests 0.3 s apart for 2.4 s are all answered on one connection (the
    timer, fired while the connection was busy or idle for less, did not close it); once idle,
    it closes about 1 s after the last answer."""
    server = bounded(http_keep_alive_s=1.0)
    sock = socket.create_connection((server.host, server.port), timeout=10)
    try:
        for _ in range(8):
            sock.sendall(HEALTH)
            status, _, _ = read_response(sock)
            assert status == 200
            time.sleep(0.3)
        closed = _closed_after(sock, 5.0)
    finally:
        sock.close()
    assert closed is not None and 0.4 <= closed <= 2.5, closed  # (1 s after the last answer, 0.3 s of it slept)


def test_a_request_longer_than_the_keep_alive_timeout_is_answered_on_its_connection(
        bounded: Callable[..., UvicornServer], upstream: Upstream) -> None:
    """Keep-alive 1 s, a chat request whose upstream answers after 2 s, sent 0.2 s after an
    answer on the same connection: the timer armed by that answer fires while the request is in
    progress and leaves the connection open; it closes about 1 s after the chat answer."""
    server = bounded(http_keep_alive_s=1.0)
    body = orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Slowly, please."}]})
    chat = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + CLIENT_KEY.encode() + b"\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
    sock = socket.create_connection((server.host, server.port), timeout=10)
    try:
        sock.sendall(HEALTH)
        assert read_response(sock)[0] == 200
        time.sleep(0.2)
        upstream.state.fail_next.append(("delay", 2.0))
        started = time.monotonic()
        sock.sendall(chat)
        status, _, answer = read_response(sock)
        took = time.monotonic() - started
        closed = _closed_after(sock, 5.0)
    finally:
        sock.close()
    assert status == 200 and b"chat.completion" in answer, answer[:300]
    assert took >= 1.9  # (the upstream's delay: past the keep-alive timeout armed before it)
    assert closed is not None and 0.6 <= closed <= 2.5, closed


def test_a_connection_keeps_one_keep_alive_timer_across_its_requests(
        bounded: Callable[..., UvicornServer], monkeypatch: pytest.MonkeyPatch) -> None:
    timers: list[Any] = []  # (the handles themselves: ids of freed ones would be reused)
    complete = GuardedHttpToolsProtocol.on_response_complete

    def recorded(self: GuardedHttpToolsProtocol) -> None:
        complete(self)
        timers.append(self.timeout_keep_alive_task)

    monkeypatch.setattr(GuardedHttpToolsProtocol, "on_response_complete", recorded)
    server = bounded(http_keep_alive_s=30.0)
    sock = socket.create_connection((server.host, server.port), timeout=10)
    try:
        for _ in range(10):
            sock.sendall(HEALTH)
            assert read_response(sock)[0] == 200
        for _ in range(100):  # (the server notes the last answer complete after its bytes are out)
            if len(timers) == 10:
                break
            time.sleep(0.02)
    finally:
        sock.close()
    assert len(timers) == 10 and all(t is not None for t in timers)
    assert len({id(t) for t in timers}) == 1  # uvicorn's own: a new timer for each of the 10
    for _ in range(100):  # the client closed: the server cancels the timer (else it holds the protocol 30 s)
        if timers[0].cancelled():
            break
        time.sleep(0.02)
    assert timers[0].cancelled()


def _responses(sock: socket.socket, count: int, timeout_s: float = 10.0) -> list[int]:
    """Statuses of the next ``count`` responses on ``sock`` (each framed by ``content-length``)."""
    def parsed(got: bytes) -> list[int] | None:
        statuses = []
        while got:
            head, sep, rest = got.partition(b"\r\n\r\n")
            if not sep:
                return None
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                           if line.lower().startswith(b"content-length:")), 0)
            if len(rest) < length:
                return None
            statuses.append(int(head.split(b" ")[1]))
            got = rest[length:]
        return statuses if len(statuses) >= count else None

    return parsed(recv_until(sock, lambda got: parsed(got) is not None, timeout_s)) or []


def _uvicorn_0_46_on_response_complete(self: HttpToolsProtocol) -> None:
    """uvicorn 0.29 to 0.46's ``HttpToolsProtocol.on_response_complete`` (pyproject admits
    ``uvicorn>=0.29``): it starts a pipelined request itself; ``_start_asgi_task`` came in 0.47."""
    self.server_state.total_requests += 1
    if self.transport.is_closing():
        return
    self._unset_keepalive_if_required()
    self.flow.resume_reading()
    if self.pipeline:
        cycle, app = self.pipeline.pop()
        task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)
    else:
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)


def _as_uvicorn_0_46(monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed ``HttpToolsProtocol`` made to start requests as uvicorn 0.29 to 0.46's does:
    no ``_start_asgi_task`` method (``on_headers_complete`` started a request's task inline: the
    installed one is given the method for that call only), ``on_response_complete`` 0.46's; the
    same where the proxy keeps uvicorn's functions (``http_guard``'s module names)."""
    start = HttpToolsProtocol._start_asgi_task
    headers_complete = HttpToolsProtocol.on_headers_complete
    response_complete = HttpToolsProtocol.on_response_complete

    def on_headers_complete(self: HttpToolsProtocol) -> None:
        self._start_asgi_task = functools.partial(start, self)  # type: ignore[method-assign]
        try:
            headers_complete(self)
        finally:
            del self._start_asgi_task

    monkeypatch.delattr(HttpToolsProtocol, "_start_asgi_task")
    monkeypatch.setattr(HttpToolsProtocol, "on_headers_complete", on_headers_complete)
    monkeypatch.setattr(HttpToolsProtocol, "on_response_complete", _uvicorn_0_46_on_response_complete)
    for name, installed, old in (("_on_headers_complete", headers_complete, on_headers_complete),
                                 ("_on_response_complete", response_complete, _uvicorn_0_46_on_response_complete)):
        if getattr(http_guard, name) is installed:
            monkeypatch.setattr(http_guard, name, old)


@pytest.mark.parametrize("uvicorn_version", ["installed", "0.29-0.46"])
def test_pipelined_requests_are_all_answered_and_the_connection_then_closes_when_idle(
        bounded: Callable[..., UvicornServer], monkeypatch: pytest.MonkeyPatch, uvicorn_version: str) -> None:
    """Three requests sent back to back before any answer (HTTP pipelining: uvicorn queues the
    second and third and starts each when the one before it is answered) are all answered on the
    connection, which closes about 1 s (the keep-alive timeout) after the last answer; with the
    installed uvicorn and with the oldest the project admits (its ``on_response_complete`` in
    place of the installed one's, no ``_start_asgi_task``: with uvicorn 0.44 itself, a copy of
    0.47+'s ``on_response_complete`` that calls it raised AttributeError and the second request
    was never answered)."""
    if uvicorn_version != "installed":
        if not hasattr(HttpToolsProtocol, "_start_asgi_task"):
            pytest.skip("the installed uvicorn is older than 0.47 (its own case is the other one)")
        _as_uvicorn_0_46(monkeypatch)
    server = bounded(http_keep_alive_s=1.0)
    sock = socket.create_connection((server.host, server.port), timeout=10)
    try:
        sock.sendall(HEALTH * 3)
        statuses = _responses(sock, 3, timeout_s=5.0)
        closed = _closed_after(sock, 5.0)
    finally:
        sock.close()
    assert statuses == [200, 200, 200]
    assert closed is not None and 0.6 <= closed <= 2.5, closed
