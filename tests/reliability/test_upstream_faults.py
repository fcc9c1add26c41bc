"""Upstream faults (issue 5, point 4): connection refused (502), connect and read timeouts (504, the
configured seconds), 5xx passed through exactly once (no retry), a stream cut mid-way and a stream
that stalls mid-way (an in-band error event, never a clean-looking truncated stream), and no
connection leak after hundreds of faults."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import orjson
import pytest

from tests.e2e.conftest import Proxy, Upstream
from tests.reliability.probes import TALLY, assert_envelope, connections_to

BODY = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Tell me a long story " + "please " * 20}]}
LONG_REPLY = " ".join(f"word{i}" for i in range(120))


@pytest.fixture
def database_url(sqlite_database_url: str) -> str:
    """Upstream faults do not depend on the database: SQLite only (the log paths run on both elsewhere)."""
    return sqlite_database_url


@pytest.fixture
def blackhole() -> Iterator[str]:
    """A listening socket whose accept queue is full: a new connection's SYN is dropped, so
    connecting hangs until the client's connect timeout."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    fillers = []
    port = server.getsockname()[1]
    for _ in range(4):  # fill the queue (Linux keeps backlog + 1)
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(s)
    time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        for s in fillers:
            s.close()
        server.close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def sse_of(resp: httpx.Response) -> tuple[list[dict], bool]:
    """Data events of a stream and whether it ended with ``[DONE]``."""
    events, done = [], False
    for line in resp.iter_lines():
        if line.startswith("data: "):
            if line == "data: [DONE]":
                done = True
            else:
                events.append(orjson.loads(line[6:]))
    return events, done


@pytest.mark.parametrize("stream", [False, True])
def test_connection_refused_is_502(proxy_factory: Callable[..., Proxy], stream: bool) -> None:
    proxy = proxy_factory(upstream_url=closed_port_url())
    with proxy.http() as http:
        t0 = time.monotonic()
        r = http.post("/v1/chat/completions", json=BODY | {"stream": stream})
    assert assert_envelope(r, 502)["code"] == "upstream_unreachable"
    assert time.monotonic() - t0 < 5
    TALLY.add("faults_injected")


def test_connect_timeout_is_504_within_the_setting(proxy_factory: Callable[..., Proxy], blackhole: str) -> None:
    proxy = proxy_factory(upstream_url=blackhole, upstream_connect_timeout_s=0.5)
    with proxy.http() as http:
        t0 = time.monotonic()
        r = http.post("/v1/chat/completions", json=BODY)
        took = time.monotonic() - t0
    assert assert_envelope(r, 504)["code"] == "upstream_timeout", r.text
    assert 0.4 < took < 3, took
    TALLY.add("faults_injected")


@pytest.mark.parametrize("stream", [False, True])
def test_read_timeout_is_504_within_the_setting(proxy_factory: Callable[..., Proxy], upstream: Upstream, stream: bool) -> None:
    proxy = proxy_factory(upstream_read_timeout_s=0.5)
    upstream.state.fail_next.append(("delay", 5))  # no headers for 5 s
    with proxy.http() as http:
        t0 = time.monotonic()
        r = http.post("/v1/chat/completions", json=BODY | {"stream": stream})
        took = time.monotonic() - t0
    assert assert_envelope(r, 504)["code"] == "upstream_timeout"
    assert 0.4 < took < 3, took
    TALLY.add("faults_injected")


@pytest.mark.parametrize("status", [500, 502, 503, 529])
@pytest.mark.parametrize("stream", [False, True])
def test_5xx_is_passed_through_once_without_retry(proxy_factory: Callable[..., Proxy], upstream: Upstream, status: int, stream: bool) -> None:
    proxy = proxy_factory()
    body = {"error": {"message": f"upstream says {status}", "type": "server_error", "param": None, "code": None}}
    upstream.state.fail_next.append(("status", status, body, {"retry-after": "3"}))
    with proxy.http() as http:
        r = http.post("/v1/chat/completions", json=BODY | {"stream": stream})
    assert r.status_code == status and r.json() == body and r.headers["retry-after"] == "3"
    assert len(upstream.state.chat_requests) == 1, "the proxy retried a 5xx"
    with pytest.raises(openai.APIStatusError):  # the SDK sees the status (and may retry itself; max_retries=0 here)
        upstream.state.fail_next.append(("status", status, body))
        proxy.client().chat.completions.create(**BODY)
    assert len(upstream.state.chat_requests) == 2
    TALLY.add("faults_injected", 2)


def test_stream_cut_midway_is_an_error_event_not_a_clean_end(proxy_factory: Callable[..., Proxy], upstream: Upstream) -> None:
    proxy = proxy_factory()
    upstream.state.script.append({"role": "assistant", "content": LONG_REPLY})
    upstream.state.fail_next.append(("cut_stream", 5))
    with proxy.http() as http, http.stream("POST", "/v1/chat/completions", json=BODY | {"stream": True}) as r:
        assert r.status_code == 200
        events, done = sse_of(r)
    assert not done, "a cut stream must not end with [DONE]"
    assert "error" in events[-1] and events[-1]["error"]["code"] == "upstream_unreachable"
    upstream.state.script.append({"role": "assistant", "content": LONG_REPLY})
    upstream.state.fail_next.append(("cut_stream", 5))
    with pytest.raises(openai.APIError):
        list(proxy.client().chat.completions.create(**BODY, stream=True))
    TALLY.add("faults_injected", 2)


def test_stream_stalled_midway_errors_within_the_read_timeout(proxy_factory: Callable[..., Proxy], upstream: Upstream) -> None:
    proxy = proxy_factory(upstream_read_timeout_s=0.5)
    upstream.state.chunk_delay_s = 5  # the first chunk at once, then silence
    upstream.state.script.append({"role": "assistant", "content": LONG_REPLY})
    t0 = time.monotonic()
    with proxy.http() as http, http.stream("POST", "/v1/chat/completions", json=BODY | {"stream": True}) as r:
        events, done = sse_of(r)
    took = time.monotonic() - t0
    assert not done and events[-1]["error"]["code"] == "upstream_timeout"
    assert took < 3, took
    upstream.state.fail_next.append(("stall", 5))  # headers, then silence before the first chunk
    with proxy.http() as http:
        t0 = time.monotonic()
        r = http.post("/v1/chat/completions", json=BODY | {"stream": True})
    assert r.status_code == 504 or "upstream_timeout" in r.text
    assert time.monotonic() - t0 < 3
    TALLY.add("faults_injected", 2)


def test_no_connection_leak_after_300_faults(proxy_factory: Callable[..., Proxy], upstream: Upstream) -> None:
    proxy = proxy_factory(upstream_read_timeout_s=0.2, upstream_pool_size=64)
    port = upstream.server.port
    assert port is not None
    kinds = [("cut_stream", 2), ("stall", 1), ("status", 503, "busy"), ("delay", 1), ("cut_stream", 0)]
    faults = [kinds[i % len(kinds)] for i in range(300)]
    upstream.state.fail_next.extend(faults)

    def one(i: int) -> int:
        with httpx.Client(base_url=proxy.url, timeout=30) as http:
            stream = faults[i][0] != "status" and i % 2 == 0
            with http.stream("POST", "/v1/chat/completions", json=BODY | {"stream": stream}) as r:
                r.read()
                return r.status_code

    with ThreadPoolExecutor(32) as pool:
        statuses = list(pool.map(one, range(300)))
    from collections import Counter

    assert not upstream.state.fail_next, f"a request never reached the upstream: statuses {Counter(statuses)}"
    assert set(statuses) <= {200, 502, 503, 504}, set(statuses)
    assert statuses.count(200) < 300
    deadline = time.monotonic() + 5
    while (open_now := connections_to(port)) > 8 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert open_now <= 8, f"{open_now} connections to the upstream still open after the faults"
    with proxy.http() as http:  # and the proxy still serves
        ok = [http.post("/v1/chat/completions", json=BODY).status_code for _ in range(20)]
    assert ok == [200] * 20
    TALLY.add("faults_injected", 300)
    TALLY.add("requests", 320)
    TALLY.note("upstream_connections_after_300_faults", open_now)
