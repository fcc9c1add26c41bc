"""Client faults (issue 5, point 5): a client that disconnects mid-stream cancels the upstream request
(the proxy's connection to the upstream closes while the upstream still had chunks to send), and the
partial reply is logged, marked ``x_context_proxy.partial``."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson

from tests.e2e.conftest import CLIENT_KEY, Proxy, Upstream
from tests.reliability.probes import TALLY, ServeProcess, connections_to
from tests.support.polling import wait_for
from tests.support.sockets import read_response, recv_until

REPLY = " ".join(f"word{i}" for i in range(200))


def _stream_request(proxy: Proxy, session_id: str, content: str) -> socket.socket:
    """A raw socket that has sent one streaming chat request (so the test can hang up at will)."""
    assert proxy.server.port is not None
    body = orjson.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": content}]})
    raw = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
           b"authorization: Bearer " + CLIENT_KEY.encode() + b"\r\nx-session-id: " + session_id.encode() + b"\r\n"
           b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    sock = socket.create_connection(("127.0.0.1", proxy.server.port), timeout=10)
    sock.sendall(raw)
    return sock


def _wait_logged(http: httpx.Client, session_id: str, failure: str) -> None:
    """Wait (10 s at most) for the session's first request record."""
    logged = wait_for(lambda: http.get(f"/sessions/{session_id}").json().get("request_count", 0) >= 1, 10, 0.05)
    assert logged, failure


def test_disconnect_mid_stream_cancels_upstream_and_logs_partial(proxy_factory: Callable[..., Proxy], upstream: Upstream) -> None:
    proxy = proxy_factory()
    port = upstream.server.port
    assert port is not None
    upstream.state.script.append({"role": "assistant", "content": REPLY})
    upstream.state.chunk_delay_s = 0.05  # about 70 chunks: 3.5 s if nobody hangs up
    sock = _stream_request(proxy, "hangup", "Tell me a story")
    recv_until(sock, lambda received: received.count(b"data: ") >= 4)
    assert connections_to(port) >= 1  # the proxy is streaming from the upstream
    t0 = time.monotonic()
    sock.close()  # the client hangs up after a few chunks
    wait_for(lambda: connections_to(port) == 0, 2)
    closed_after = time.monotonic() - t0
    assert connections_to(port) == 0, "the upstream request was not cancelled"
    assert closed_after < 1.0
    with proxy.http() as http:
        _wait_logged(http, "hangup", "the disconnected request was never logged")
        messages = http.get("/sessions/hangup/messages").json()["data"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    partial = messages[-1]
    assert partial["x_context_proxy"]["partial"] is True
    assert partial["content"] and REPLY.startswith(partial["content"].strip()) and len(partial["content"]) < len(REPLY)
    TALLY.add("faults_injected")
    TALLY.note("upstream_closed_after_client_hangup_ms", round(closed_after * 1000))


def test_disconnect_before_the_first_byte_is_logged_and_releases_upstream(proxy_factory: Callable[..., Proxy], upstream: Upstream) -> None:
    """The client hangs up while the proxy still waits for the upstream's first event: when the
    stream then starts, the relay is cancelled before its first step; the request is logged all
    the same (record with the disconnect, the client's message) and the upstream response closed."""
    proxy = proxy_factory()
    port = upstream.server.port
    assert port is not None and proxy.server.port is not None
    upstream.state.fail_next.append(("delay", 1.0))  # the upstream answers after 1 s
    upstream.state.chunk_delay_s = 0.05
    sock = _stream_request(proxy, "early-hangup", "Are you there?")
    time.sleep(0.3)
    sock.close()  # gone before the upstream's first byte
    with proxy.http() as http:
        _wait_logged(http, "early-hangup", "the request whose client left early was never logged")
        records = http.get("/sessions/early-hangup/requests").json()["data"]
        messages = http.get("/sessions/early-hangup/messages").json()["data"]
    assert records[0]["error"] == "client disconnected"
    assert (messages[0]["role"], messages[0]["content"]) == ("user", "Are you there?")
    assert all(m.get("x_context_proxy", {}).get("partial") for m in messages[1:])  # nothing logged as complete
    wait_for(lambda: connections_to(port) == 0, 3)
    assert connections_to(port) == 0, "the upstream response was not released"
    TALLY.add("faults_injected")


def _idle_connection_closed_within(serve_url: str, wait_s: float) -> bool:
    """Send one request on a raw keep-alive connection, then wait up to ``wait_s`` idle: did the
    server close it in that time?"""
    host, port = serve_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        status, _, _ = read_response(sock)  # the whole response: what is left is only the close
        assert status == 200
        sock.settimeout(wait_s)
        try:
            return sock.recv(1) == b""  # EOF: the server closed it
        except TimeoutError:
            return False  # still open
    finally:
        sock.close()


def test_idle_client_connections_outlive_client_pools(tmp_path: Path, upstream: Upstream, sqlite_database_url: str) -> None:
    """``http_keep_alive_s`` reaches the server: an idle connection stays open past 5 s by default
    (clients such as httpx expire theirs at 5 s, so they close first and never send a request on a
    connection the server is closing: the load run's ``ReadError``s), and closes when set shorter."""
    base = upstream.server.url + "/v1"
    default = ServeProcess(tmp_path, base, sqlite_database_url).start()
    short = ServeProcess(tmp_path, base, sqlite_database_url, CONTEXT_PROXY_HTTP_KEEP_ALIVE_S="1").start()
    try:
        assert not _idle_connection_closed_within(default.url, 6.0)
        assert _idle_connection_closed_within(short.url, 5.0)  # after 1 s, however loaded the machine
    finally:
        default.stop()
        short.stop()
