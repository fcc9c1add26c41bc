"""End-to-end fixtures: the fake upstream and the proxy, each under a real uvicorn server.

``proxy_factory(**settings)`` starts the proxy (``proxy.app.create_app``) on a free port against
the fake upstream and the parametrized database (SQLite and PostgreSQL); clients are the official
``openai`` SDK pointed at ``proxy.url + "/v1"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.app import create_app
from proxy.settings import Settings
from tests.conftest import SHARED_DIR
from tests.fakes.server import UvicornServer
from tests.fakes.state import FakeState
from tests.fakes.upstream import create_fake_upstream

CLIENT_KEY = "sk-test-client-key-0123456789"


@dataclass
class Upstream:
    server: UvicornServer
    state: FakeState

    @property
    def url(self) -> str:
        return self.server.url + "/v1"


@dataclass
class Proxy:
    server: UvicornServer
    settings: Settings

    @property
    def url(self) -> str:
        return self.server.url

    def client(self, key: str = CLIENT_KEY, **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, **kwargs)

    def async_client(self, key: str = CLIENT_KEY, **kwargs: Any) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, **kwargs)

    def http(self, key: str | None = CLIENT_KEY) -> httpx.Client:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    app, state = create_fake_upstream()
    with UvicornServer(app) as server:
        yield Upstream(server, state)


@pytest.fixture
def proxy_factory(database_url: str, upstream: Upstream, tmp_path: Path) -> Iterator[Callable[..., Proxy]]:
    started: list[UvicornServer] = []

    def make(**overrides: Any) -> Proxy:
        values: dict[str, Any] = {
            "upstream_url": upstream.url,
            "database_url": database_url,
            "tiktoken_cache_dir": str(SHARED_DIR / "tiktoken"),
        }
        values.update(overrides)
        settings = Settings(**values)
        server = UvicornServer(create_app(settings)).start()
        started.append(server)
        return Proxy(server, settings)

    try:
        yield make
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def proxy(proxy_factory: Callable[..., Proxy]) -> Proxy:
    return proxy_factory()


def wait_logged(proxy: Proxy, session_id: str, requests: int, timeout_s: float = 10.0) -> dict[str, Any]:
    """Wait until ``session_id`` has ``requests`` request records (the log is written after the
    response, in a task of its own); returns the session's JSON."""
    import time

    deadline = time.monotonic() + timeout_s
    with proxy.http() as http:
        while True:
            r = http.get(f"/sessions/{session_id}")
            if r.status_code == 200 and r.json()["request_count"] >= requests:
                return r.json()
            if time.monotonic() > deadline:
                raise AssertionError(f"session {session_id} did not reach {requests} logged requests: {r.text}")
            time.sleep(0.02)
