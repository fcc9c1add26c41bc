"""Issue 16 item 3: a global budget for request bodies held at once (503 ``proxy_busy`` with
``retry-after`` beyond it), and a cap on what a streamed reply reassembles for the log (the logged
reply marked truncated, the relay unchanged)."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx

from proxy.app import create_app
from proxy.server.http_guard import server_options
from proxy.settings import Settings
from tests.conftest import SHARED_DIR
from tests.e2e.conftest import Upstream
from tests.fakes.server import UvicornServer
from tests.support.polling import wait_for
from tests.support.sockets import read_response

AUTH = b"authorization: Bearer sk-test-memory-0123456789\r\n"


def _server(upstream: Upstream, database_url: str, **overrides: Any) -> UvicornServer:
    settings = Settings(upstream_url=upstream.url, database_url=database_url, tiktoken_cache_dir=str(SHARED_DIR / "tiktoken"),
                        **overrides)
    return UvicornServer(create_app(settings), **server_options(settings)).start()


def _answer(sock: socket.socket) -> tuple[int, bytes, bytes]:
    status, head, body = read_response(sock, 10)
    return status, head.lower(), body


def test_bodies_past_the_budget_are_refused_with_retry_after(upstream: Upstream, sqlite_database_url: str) -> None:
    server = _server(upstream, sqlite_database_url, max_held_body_bytes=1_000_000)
    try:
        held = socket.create_connection((server.host, server.port))  # 800 kB declared, half sent: 400 kB held
        held.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" + AUTH
                     + b"content-type: application/json\r\ncontent-length: 800000\r\n\r\n" + b" " * 400_000)
        time.sleep(0.3)
        with socket.create_connection((server.host, server.port)) as other:  # 400 + 700 kB received > 1 MB
            other.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" + AUTH
                          + b"content-type: application/json\r\ncontent-length: 700000\r\n\r\n" + b" " * 700_000)
            status, head, body = _answer(other)
        assert status == 503 and b"retry-after: 1" in head
        assert json.loads(body)["error"]["code"] == "proxy_busy"
        chunked = httpx.post(server.url + "/v1/chat/completions", headers={"authorization": "Bearer sk-test-memory-0123456789"},
                             content=iter([b" " * 200_000] * 4), timeout=10)  # chunked: counted as it arrives
        assert chunked.status_code == 503 and chunked.json()["error"]["code"] == "proxy_busy", chunked.text
        held.close()  # the held body goes: the budget is free again
        time.sleep(0.3)
        body_ok = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x" * 300_000}]}
        r = httpx.post(server.url + "/v1/chat/completions", json=body_ok, timeout=30,
                       headers={"authorization": "Bearer sk-test-memory-0123456789"})
        assert r.status_code == 200, r.text
        with socket.create_connection((server.host, server.port)) as big:  # past max_body_bytes: still a 413
            big.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" + AUTH + b"content-length: 1000000000\r\n\r\n")
            assert _answer(big)[0] == 413
    finally:
        server.stop()


def test_declared_but_unsent_bodies_hold_nothing(upstream: Upstream, sqlite_database_url: str) -> None:
    """Two sockets declaring 64 MiB bodies (the largest allowed) and sending none of it, with the
    default 128 MiB budget: a chat with a body is still served (a length is a promise, not bytes)."""
    server = _server(upstream, sqlite_database_url)
    silent = []
    try:
        for _ in range(2):
            sock = socket.create_connection((server.host, server.port))
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" + AUTH
                         + b"content-type: application/json\r\ncontent-length: 67108864\r\n\r\n")
            silent.append(sock)
        time.sleep(0.3)
        r = httpx.post(server.url + "/v1/chat/completions", timeout=30, headers={"authorization": "Bearer sk-test-memory-0123456789"},
                       json={"model": "gpt-4o", "messages": [{"role": "user", "content": "still served"}]})
        assert r.status_code == 200, r.text
        # the silent ones hold nothing; the served one gives its bytes back when its ASGI call returns,
        # a moment after the client has the answer (polled: the suite once read 72 bytes still held)
        budget = server.config.app.state.body_budget
        assert wait_for(lambda: budget.held_bytes == 0 or None, 5.0), budget.held_bytes
    finally:
        for sock in silent:
            sock.close()
        server.stop()


def test_a_streamed_reply_is_reassembled_up_to_the_cap_and_relayed_whole(upstream: Upstream, sqlite_database_url: str) -> None:
    reply = " ".join(f"word{i}" for i in range(3000))
    upstream.state.script.append({"role": "assistant", "content": reply})
    server = _server(upstream, sqlite_database_url, stream_log_max_bytes=4096)
    try:
        headers = {"authorization": "Bearer sk-test-memory-0123456789", "x-session-id": "capped"}
        body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "a long story"}]}
        text = ""
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=headers, timeout=30) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        text += choice["delta"].get("content") or ""
        assert text == reply  # the client got every byte
        with httpx.Client(base_url=server.url, headers=headers) as http:
            deadline = time.monotonic() + 10
            while (r := http.get("/sessions/capped")).status_code != 200 or r.json()["request_count"] < 1:
                assert time.monotonic() < deadline, r.text
                time.sleep(0.05)
            messages = http.get("/sessions/capped/messages").json()["data"]
        logged = messages[-1]
        assert logged["role"] == "assistant"
        assert reply.startswith(logged["content"]) and 0 < len(logged["content"]) < 4096
        assert logged["x_context_proxy"] == {"truncated": True, "kept_bytes": 4096}
    finally:
        server.stop()
