"""The real-server tier: the fake provider and the proxy, each under a real uvicorn server.

For what needs sockets: streaming timing, client disconnects, uvicorn's settings and limits, TCP
faults, real clients that open their own connections (everything else: ``tests.support.inprocess``).
Fixtures (registered for the whole suite by ``tests/conftest.py``):

- ``upstream`` -> ``Upstream``: the fake provider (``tests.fakes.upstream``) on a free port;
  ``url`` ends in ``/v1``, ``state`` is its ``FakeState``;
- ``proxy_factory(**settings)`` -> ``Proxy``: starts the proxy (``proxy.app.create_app``) on a free
  port against ``upstream`` and the parametrized database (SQLite and PostgreSQL: ``database_url``);
  keyword arguments are ``Settings`` fields; all are stopped after the test;
- ``proxy``: ``proxy_factory()`` (defaults: the defenses on);
- ``plain_proxy``: the defenses off (pure forwarding);
- ``any_proxy``: parametrized, ``plain`` (defenses off) and ``compaction`` (on, what a user runs).

Clients: ``Proxy.client()`` / ``async_client()`` are the official ``openai`` SDK on
``proxy.url + "/v1"`` (no retries); ``Proxy.http()`` an ``httpx.Client`` sending ``CLIENT_KEY``.
``wait_logged(proxy, session_id, requests)`` waits for the log (written after the response).
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
from tests.fakes.server import UvicornServer
from tests.fakes.state import FakeState
from tests.fakes.upstream import create_fake_upstream
from tests.support.polling import wait_for
from tests.support.shared import tiktoken_cache_dir

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
            "tiktoken_cache_dir": tiktoken_cache_dir(),
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


@pytest.fixture
def plain_proxy(proxy_factory: Callable[..., Proxy]) -> Proxy:
    """The proxy with the defenses off (pure forwarding)."""
    return proxy_factory(compaction_enabled=False)


@pytest.fixture(params=[False, True], ids=["plain", "compaction"])
def any_proxy(request: pytest.FixtureRequest, proxy_factory: Callable[..., Proxy]) -> Proxy:
    """The proxy with the defenses off (pure forwarding) and on (the default a user runs)."""
    return proxy_factory(compaction_enabled=request.param)


def wait_logged(proxy: Proxy, session_id: str, requests: int, timeout_s: float = 10.0) -> dict[str, Any]:
    """Wait until ``session_id`` has ``requests`` request records (the log is written after the
    response, in a task of its own); returns the session's JSON. Raises ``AssertionError`` at
    the deadline."""
    last: list[httpx.Response] = []
    with proxy.http() as http:

        def logged() -> dict[str, Any] | None:
            r = http.get(f"/sessions/{session_id}")
            last[:] = [r]
            return dict(r.json()) if r.status_code == 200 and r.json()["request_count"] >= requests else None

        found = wait_for(logged, timeout_s)
    if found is None:
        raise AssertionError(f"session {session_id} did not reach {requests} logged requests: {last[0].text}")
    return found
