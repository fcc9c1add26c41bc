"""Client faults (issue 5, point 5): a client that disconnects mid-stream cancels the upstream request
(the proxy's connection to the upstream closes while the upstream still had chunks to send), and the
partial reply is logged, marked ``x_context_proxy.partial``."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import orjson

from tests.e2e.conftest import CLIENT_KEY, Proxy, Upstream
from tests.reliability.probes import TALLY, connections_to

REPLY = " ".join(f"word{i}" for i in range(200))


def test_disconnect_mid_stream_cancels_upstream_and_logs_partial(proxy_factory: Callable[..., Proxy], upstream: Upstream) -> None:
    proxy = proxy_factory()
    port = upstream.server.port
    assert port is not None
    upstream.state.script.append({"role": "assistant", "content": REPLY})
    upstream.state.chunk_delay_s = 0.05  # about 70 chunks: 3.5 s if nobody hangs up
    body = orjson.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "Tell me a story"}]})
    raw = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
           b"authorization: Bearer " + CLIENT_KEY.encode() + b"\r\nx-session-id: hangup\r\n"
           b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert proxy.server.port is not None
    sock = socket.create_connection(("127.0.0.1", proxy.server.port))
    sock.sendall(raw)
    received = b""
    while received.count(b"data: ") < 4:
        received += sock.recv(65536)
    assert connections_to(port) >= 1  # the proxy is streaming from the upstream
    t0 = time.monotonic()
    sock.close()  # the client hangs up after a few chunks
    while connections_to(port) > 0 and time.monotonic() - t0 < 2:
        time.sleep(0.02)
    closed_after = time.monotonic() - t0
    assert connections_to(port) == 0, "the upstream request was not cancelled"
    assert closed_after < 1.0
    with proxy.http() as http:
        deadline = time.monotonic() + 10
        while http.get("/sessions/hangup").json().get("request_count", 0) < 1:
            assert time.monotonic() < deadline, "the disconnected request was never logged"
            time.sleep(0.05)
        messages = http.get("/sessions/hangup/messages").json()["data"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    partial = messages[-1]
    assert partial["x_context_proxy"]["partial"] is True
    assert partial["content"] and REPLY.startswith(partial["content"].strip()) and len(partial["content"]) < len(REPLY)
    TALLY.add("faults_injected")
    TALLY.note("upstream_closed_after_client_hangup_ms", round(closed_after * 1000))
