"""Issue 16 item 4: one tenant's slow requests hold at most its share of the upstream pool; a
request that finds no slot in time is answered 503 ``proxy_busy`` with ``retry-after`` (the
proxy's condition), never 504 "the upstream provider did not answer in time"."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from proxy.app import create_app
from proxy.settings import Settings
from tests.conftest import SHARED_DIR
from tests.e2e.conftest import Upstream
from tests.fakes.server import UvicornServer

TENANT_A = {"authorization": "Bearer sk-tenant-a-0123456789"}
TENANT_B = {"authorization": "Bearer sk-tenant-b-0123456789"}


def _stream(url: str, i: int) -> tuple[int, dict[str, Any] | None, dict[str, str]]:
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": f"slow {i}"}]}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=TENANT_A, timeout=30) as resp:
        resp.read()
        error = resp.json()["error"] if resp.status_code >= 400 else None
        return resp.status_code, error, dict(resp.headers)


def test_one_tenants_slow_requests_do_not_take_the_pool(upstream: Upstream, sqlite_database_url: str) -> None:
    gate = threading.Event()
    upstream.state.stream_gate = gate  # each stream of tenant A: one chunk, then held until the gate opens
    upstream.state.stream_gate_timeout_s = 20
    settings = Settings(upstream_url=upstream.url, database_url=sqlite_database_url, tiktoken_cache_dir=str(SHARED_DIR / "tiktoken"),
                        upstream_pool_size=4, upstream_tenant_pool_share=0.5, upstream_connect_timeout_s=2.0)
    with UvicornServer(create_app(settings)) as server, ThreadPoolExecutor(8) as pool:
        slow = [pool.submit(_stream, server.url, i) for i in range(6)]
        deadline = time.monotonic() + 10
        while len(upstream.state.chat_requests) < 2:  # A's share (2 of 4) is in use upstream
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)
        started = time.monotonic()
        r = httpx.post(server.url + "/v1/chat/completions", headers=TENANT_B, timeout=30,
                       json={"model": "gpt-4o", "messages": [{"role": "user", "content": "quick"}]})
        waited = time.monotonic() - started
        assert r.status_code == 200, r.text
        assert waited < 1.0, waited  # B never waited for a slot behind A
        assert len(upstream.state.chat_requests) == 3  # A never had more than its share upstream
        # A's requests past its share wait the connect timeout, then are answered as the proxy's busy
        time.sleep(2.5)
        gate.set()
        results = [f.result(timeout=30) for f in slow]
    statuses = sorted(status for status, _, _ in results)
    assert statuses == [200, 200, 503, 503, 503, 503], statuses
    for status, error, headers in results:
        if status == 503:
            assert error is not None and error["code"] == "proxy_busy" and error["type"] == "service_unavailable"
            assert "did not answer in time" not in error["message"]
            assert headers["retry-after"] == "1"
