"""Issue 16 item 2: header size and count, header and body arrival deadlines, a connection cap and
idle sockets, against the proxy under a real uvicorn server (``proxy.server.http_guard.server_options``,
what ``context-proxy serve`` runs) and raw sockets; a healthy client is answered meanwhile."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.conftest import REPO_DIR, SHARED_DIR
from tests.e2e.conftest import Upstream
from tests.fakes.server import UvicornServer
from tests.support.ports import free_port

KEY = {"authorization": "Bearer sk-test-bounds-0123456789"}


def _connect(server: UvicornServer) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=10)
    return sock


def _read_all(sock: socket.socket, timeout_s: float = 10.0) -> bytes:
    """What the server sends until it closes the connection (fails after ``timeout_s``)."""
    sock.settimeout(timeout_s)
    out = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return out
        out += chunk


def _trickle(sock: socket.socket, piece: Callable[[int], bytes], every_s: float, for_s: float = 5.0) -> tuple[bytes, float]:
    """Send ``piece(i)`` every ``every_s`` until the server answers (or ``for_s`` passes); returns
    its whole answer and the seconds until it began."""
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < for_s:
        readable, _, _ = select.select([sock], [], [], every_s)
        if readable:
            break
        try:
            sock.sendall(piece(i))
        except (BrokenPipeError, ConnectionResetError):
            break
        i += 1
    answered = time.monotonic() - started
    return _read_all(sock), answered


def _status_and_error(raw: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower(), head
    return int(head.split(b" ", 2)[1]), json.loads(body)["error"]


def _healthy(server: UvicornServer, until: threading.Event, waits: list[float]) -> None:
    """A healthy client: a new connection and ``GET /healthz`` in a loop, each wait recorded."""
    while not until.is_set():
        started = time.monotonic()
        r = httpx.get(server.url + "/healthz", timeout=5)
        assert r.status_code == 200
        waits.append(time.monotonic() - started)
        time.sleep(0.05)


def test_oversized_headers_and_too_many_fields_get_431(bounded: Callable[..., UvicornServer]) -> None:
    server = bounded(http_max_header_bytes=8 * 1024, http_max_headers=20)
    with _connect(server) as sock:  # a 2 MB header value: refused after the first 8 KiB
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-big: ")
        try:
            for _ in range(32):
                sock.sendall(b"a" * 65536)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed by the server before all of it was sent: what is wanted
        status, error = _status_and_error(_read_all(sock))
    assert status == 431 and error["code"] == "request_header_fields_too_large"
    assert "8192 bytes" in error["message"]
    with _connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + b"".join(b"x-h%d: v\r\n" % i for i in range(30)) + b"\r\n")
        status, error = _status_and_error(_read_all(sock))
    assert status == 431 and "more than 20 header fields" in error["message"]
    # within the bounds, the same server answers
    assert httpx.get(server.url + "/healthz", headers={f"x-h{i}": "v" for i in range(10)}).status_code == 200


def test_headers_sent_a_line_at_a_time_are_timed_out(bounded: Callable[..., UvicornServer]) -> None:
    server = bounded(http_header_timeout_s=1.0)
    stop, waits = threading.Event(), []
    healthy = threading.Thread(target=_healthy, args=(server, stop, waits))
    healthy.start()
    try:
        with _connect(server) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")  # then a header line every 0.3 s
            raw, elapsed = _trickle(sock, lambda i: b"x-slow-%d: v\r\n" % i, 0.3)
            status, error = _status_and_error(raw)
    finally:
        stop.set()
        healthy.join()
    assert status == 408 and error["code"] == "request_timeout" and "headers" in error["message"]
    assert 0.9 < elapsed < 2.5, elapsed
    assert waits and max(waits) < 1.0, waits


def test_a_silent_connection_is_closed_after_the_header_timeout(bounded: Callable[..., UvicornServer]) -> None:
    server = bounded(http_header_timeout_s=0.5)
    with _connect(server) as sock:
        started = time.monotonic()
        status, _ = _status_and_error(_read_all(sock))
        assert status == 408 and time.monotonic() - started < 2


def test_a_body_sent_a_byte_at_a_time_is_timed_out(bounded: Callable[..., UvicornServer]) -> None:
    server = bounded(http_body_timeout_s=1.0)
    stop, waits = threading.Event(), []
    healthy = threading.Thread(target=_healthy, args=(server, stop, waits))
    healthy.start()
    try:
        with _connect(server) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-test-0123456789\r\n"
                         b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n")
            raw, elapsed = _trickle(sock, lambda i: b" ", 0.2)  # a byte every 0.2 s
            status, error = _status_and_error(raw)
    finally:
        stop.set()
        healthy.join()
    assert status == 408 and "body" in error["message"]
    assert 0.9 < elapsed < 2.5, elapsed
    assert waits and max(waits) < 1.0, waits


CHAT_HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-test-bounds-0123456789\r\n"
             b"content-type: application/json\r\n")


def _chunked(sock: socket.socket, body: bytes) -> None:
    sock.sendall(CHAT_HEAD + b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(body), body) + b"0\r\n")


def test_chunked_trailers_are_bounded_like_headers(bounded: Callable[..., UvicornServer], upstream: Upstream) -> None:
    """Trailers count against ``http_max_header_bytes`` and ``http_max_headers``: one endless
    trailer line is refused with a 431 after about the bound, with the loop free meanwhile; a small
    trailer is accepted and not added to the request's headers."""
    server = bounded(http_max_header_bytes=8 * 1024, http_max_headers=20)
    stop, waits = threading.Event(), []
    healthy = threading.Thread(target=_healthy, args=(server, stop, waits))
    healthy.start()
    sent = 0
    try:
        with _connect(server) as sock:
            _chunked(sock, b"{}")
            sock.sendall(b"x-trailer: ")
            try:
                for _ in range(512):  # 32 MB offered, 64 KiB a write, until the answer comes
                    if select.select([sock], [], [], 0)[0]:
                        break
                    sock.sendall(b"a" * 65536)
                    sent += 65536
                    time.sleep(0.001)
            except (BrokenPipeError, ConnectionResetError):
                pass
            status, error = _status_and_error(_read_all(sock))
    finally:
        stop.set()
        healthy.join()
    assert status == 431 and error["code"] == "request_header_fields_too_large" and "trailers" in error["message"]
    assert sent < 4 * 1024 * 1024, sent  # refused after about the bound (the rest is dropped, then closed)
    assert waits and max(waits) < 1.0, waits
    with _connect(server) as sock:  # many trailer fields: the header count covers them
        _chunked(sock, b"{}")
        sock.sendall(b"".join(b"x-t%d: v\r\n" % i for i in range(30)) + b"\r\n")
        status, error = _status_and_error(_read_all(sock))
    assert status == 431 and "more than 20 header fields" in error["message"]
    upstream.state.script.append({"role": "assistant", "content": "ok"})
    with _connect(server) as sock:  # a small trailer: served, the trailer not among the forwarded headers
        _chunked(sock, json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode())
        sock.sendall(b"x-trailing-field: 1\r\n\r\n")
        sock.settimeout(10)
        head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert "x-trailing-field" not in {k.lower() for k in upstream.state.chat_requests[-1].headers}


def test_slow_bodies_cannot_fill_the_connection_cap(bounded: Callable[..., UvicornServer]) -> None:
    """With the cap reached by connections whose bodies do not come, a new client is answered
    (the slowest body is closed with a 503 ``proxy_busy``); a flood of them leaves a healthy client
    answered within a second."""
    server = bounded(http_max_connections=3, http_body_timeout_s=30)
    slow = [_connect(server) for _ in range(3)]
    try:
        for sock in slow:  # each in a request: headers complete, 1 of 10 body bytes sent
            sock.sendall(CHAT_HEAD + b"content-length: 10\r\n\r\n{")
        time.sleep(0.2)
        started = time.monotonic()
        assert httpx.get(server.url + "/healthz", timeout=5).status_code == 200
        assert time.monotonic() - started < 1.0
        status, error = _status_and_error(_read_all(slow[0]))  # the oldest of the equally slow ones
        assert status == 503 and error["code"] == "proxy_busy" and "too slowly" in error["message"]
    finally:
        for sock in slow:
            sock.close()
    stop, waits = threading.Event(), []
    healthy = threading.Thread(target=_healthy, args=(server, stop, waits))
    healthy.start()
    flood: list[socket.socket] = []
    most = 0
    try:
        for _ in range(60):  # 20 times the cap, each a silent body
            sock = _connect(server)
            try:
                sock.sendall(CHAT_HEAD + b"content-length: 10\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
            flood.append(sock)
            time.sleep(0.02)
            server_side = [c for c in psutil.Process().net_connections("tcp")
                           if c.laddr and c.laddr.port == server.port and c.status == psutil.CONN_ESTABLISHED]
            most = max(most, len(server_side))
    finally:
        stop.set()
        healthy.join()
        for sock in flood:
            sock.close()
    assert len(waits) > 5 and max(waits) < 1.0, waits
    assert most <= 3 + 2, most  # the cap (answered victims are closed, not left lingering past it)


def test_requests_being_served_are_kept_past_the_cap(bounded: Callable[..., UvicornServer], upstream: Upstream) -> None:
    """Connections whose request is complete and being served (streams held open upstream) are
    never closed for a new one: past the cap it is answered 503 and the streams finish."""
    gate = threading.Event()
    upstream.state.stream_gate = gate
    upstream.state.stream_gate_timeout_s = 20
    server = bounded(http_max_connections=3)
    busy = [_connect(server) for _ in range(3)]
    body = json.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hold"}]}).encode()
    try:
        for sock in busy:
            sock.sendall(CHAT_HEAD + b"content-length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 10
        while len(upstream.state.chat_requests) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with _connect(server) as extra:
            status, error = _status_and_error(_read_all(extra))
        assert status == 503 and error["code"] == "proxy_busy"
        gate.set()
        for sock in busy:  # untouched: each stream completes
            raw = _read_until(sock, b"data: [DONE]")
            assert raw.startswith(b"HTTP/1.1 200") and b"proxy_busy" not in raw
    finally:
        gate.set()
        for sock in busy:
            sock.close()


def test_answers_carry_a_date_and_name_no_server_software(bounded: Callable[..., UvicornServer]) -> None:
    """As ``context-proxy serve`` runs it: an answer has the ``date`` header HTTP asks of an origin
    server with a clock, and no ``server`` header naming the software behind it (uvicorn's
    ``server: uvicorn``, off: it tells a scanner which versions to try, and costs every answer a
    header)."""
    server = bounded()
    body = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]}).encode()
    with _connect(server) as sock:
        sock.sendall(CHAT_HEAD + b"content-length: %d\r\n\r\n%s" % (len(body), body))
        raw = _read_until(sock, b"\r\n\r\n")
    head = raw.split(b"\r\n\r\n", 1)[0].lower().split(b"\r\n")
    assert head[0].startswith(b"http/1.1 200"), head[0]
    names = [line.split(b":", 1)[0] for line in head[1:]]
    assert b"date" in names and b"x-context-proxy-request-id" in names
    assert b"server" not in names, names


def _read_until(sock: socket.socket, marker: bytes, timeout_s: float = 10.0) -> bytes:
    sock.settimeout(timeout_s)
    out = b""
    while marker not in out:
        chunk = sock.recv(65536)
        if not chunk:
            break
        out += chunk
    return out


def test_serve_idle_socket_flood_keeps_descriptors_bounded_and_answers_a_healthy_client(
    upstream: Upstream, tmp_path: Path,
) -> None:
    """``context-proxy serve`` with a cap of 200 connections: 3,000 idle sockets (never a byte sent)
    leave the server's descriptors bounded, and a healthy client is answered within a second
    throughout (the longest-idle connection makes room for it)."""
    port = free_port()
    env = os.environ | {"TIKTOKEN_CACHE_DIR": str(SHARED_DIR / "tiktoken"), "CONTEXT_PROXY_HTTP_MAX_CONNECTIONS": "200",
                        "CONTEXT_PROXY_HTTP_HEADER_TIMEOUT_S": "5"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--upstream-url", upstream.url, "--database-url", f"sqlite:///{tmp_path / 'proxy.db'}"],
        cwd=REPO_DIR, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    idle: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        server = psutil.Process(proc.pid)
        fds_before = server.num_fds()
        waits: list[float] = []
        most_fds = fds_before
        for i in range(3000):
            sock = socket.socket()
            sock.setblocking(False)
            try:
                sock.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            idle.append(sock)
            if i % 250 == 249:
                started = time.monotonic()
                assert httpx.get(url + "/healthz", timeout=5).status_code == 200
                waits.append(time.monotonic() - started)
                most_fds = max(most_fds, server.num_fds())
        time.sleep(0.5)
        most_fds = max(most_fds, server.num_fds())
        started = time.monotonic()
        assert httpx.get(url + "/healthz", timeout=5).status_code == 200
        waits.append(time.monotonic() - started)
    finally:
        for sock in idle:
            sock.close()
        proc.terminate()
        proc.wait(30)
    assert most_fds <= fds_before + 200 + 5, (fds_before, most_fds)
    assert max(waits) < 1.0, waits
