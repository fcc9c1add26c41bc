"""uvicorn's keep-alive timeout with one timer a connection (``proxy.server.keep_alive``), under a
real uvicorn server with the proxy's server options and raw sockets: a connection that keeps
sending requests stays open past the timeout, an idle one closes when uvicorn's would, and the
timer is kept across the connection's requests (uvicorn's own makes one a request)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from proxy.app import create_app
from proxy.server.http_guard import GuardedHttpToolsProtocol, server_options
from proxy.settings import Settings
from tests.conftest import SHARED_DIR
from tests.e2e.conftest import CLIENT_KEY, Upstream
from tests.fakes.server import UvicornServer
from tests.support.sockets import read_response

HEALTH = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"


@pytest.fixture
def serve(upstream: Upstream, sqlite_database_url: str) -> Iterator[Callable[..., UvicornServer]]:
    started: list[UvicornServer] = []

    def make(**overrides: Any) -> UvicornServer:
        settings = Settings(upstream_url=upstream.url, database_url=sqlite_database_url,
                            tiktoken_cache_dir=str(SHARED_DIR / "tiktoken"), **overrides)
        server = UvicornServer(create_app(settings), **server_options(settings)).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


def _closed_after(sock: socket.socket, within_s: float) -> float | None:
    """Seconds until the server closes ``sock`` (EOF), or ``None`` if it is still open after ``within_s``."""
    started = time.monotonic()
    sock.settimeout(within_s)
    try:
        return time.monotonic() - started if sock.recv(1) == b"" else None
    except TimeoutError:
        return None


def test_a_busy_connection_outlives_the_keep_alive_timeout_and_closes_once_idle_that_long(
        serve: Callable[..., UvicornServer]) -> None:
    """Keep-alive 1 s: requests 0.3 s apart for 2.4 s are all answered on one connection (the
    timer, fired while the connection was busy or idle for less, did not close it); once idle,
    it closes about 1 s after the last answer."""
    server = serve(http_keep_alive_s=1.0)
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
        serve: Callable[..., UvicornServer], upstream: Upstream) -> None:
    """Keep-alive 1 s, a chat request whose upstream answers after 2 s, sent 0.2 s after an
    answer on the same connection: the timer armed by that answer fires while the request is in
    progress and leaves the connection open; it closes about 1 s after the chat answer."""
    server = serve(http_keep_alive_s=1.0)
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
        serve: Callable[..., UvicornServer], monkeypatch: pytest.MonkeyPatch) -> None:
    timers: list[Any] = []  # (the handles themselves: ids of freed ones would be reused)
    complete = GuardedHttpToolsProtocol.on_response_complete

    def recorded(self: GuardedHttpToolsProtocol) -> None:
        complete(self)
        timers.append(self.timeout_keep_alive_task)

    monkeypatch.setattr(GuardedHttpToolsProtocol, "on_response_complete", recorded)
    server = serve(http_keep_alive_s=30.0)
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
