"""Issue 16 item 4 in degraded mode: with the database down and ``database_failure_mode=open``,
requests are forwarded unlogged (``ChatPipeline._forward_unlogged``), still within the tenant's
share of the upstream pool."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from proxy.app import create_app
from proxy.settings import Settings
from tests.conftest import SHARED_DIR
from tests.e2e.conftest import Upstream
from tests.fakes.server import UvicornServer

TENANT_A = {"authorization": "Bearer sk-tenant-a-0123456789"}
TENANT_B = {"authorization": "Bearer sk-tenant-b-0123456789"}


def _stream(url: str, i: int) -> tuple[int, str]:
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": f"slow {i}"}]}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=TENANT_A, timeout=30) as resp:
        resp.read()
        return resp.status_code, resp.headers.get("x-context-proxy-warning", "")


def test_unlogged_forwarding_keeps_the_tenant_share(upstream: Upstream, sqlite_database_url: str) -> None:
    gate = threading.Event()
    upstream.state.stream_gate = gate
    upstream.state.stream_gate_timeout_s = 20
    settings = Settings(upstream_url=upstream.url, database_url=sqlite_database_url, tiktoken_cache_dir=str(SHARED_DIR / "tiktoken"),
                        upstream_pool_size=4, upstream_tenant_pool_share=0.5, upstream_connect_timeout_s=1.0,
                        database_failure_mode="open")
    with UvicornServer(create_app(settings)) as server, ThreadPoolExecutor(4) as pool:
        async def down() -> bool:
            return False

        health = server.config.app.state.proxy.pipeline.health
        health.down, health.usable = True, down  # the database down and its probe failing: fail open
        slow = [pool.submit(_stream, server.url, i) for i in range(4)]
        deadline = time.monotonic() + 10
        while len(upstream.state.chat_requests) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)
        assert len(upstream.state.chat_requests) == 2  # A holds only its share (2 of 4) upstream
        r = httpx.post(server.url + "/v1/chat/completions", headers=TENANT_B, timeout=30,
                       json={"model": "gpt-4o", "messages": [{"role": "user", "content": "quick"}]})
        assert r.status_code == 200 and r.headers["x-context-proxy-warning"], r.text  # B still served, unlogged
        time.sleep(1.5)  # A's two past its share wait the connect timeout, then are the proxy's busy
        gate.set()
        results = [f.result(timeout=30) for f in slow]
    assert sorted(status for status, _ in results) == [200, 200, 503, 503], results
    assert all(warning for status, warning in results if status == 200)
