"""The in-process tier: the proxy app and the fake provider in the test's event loop, no sockets.

    async def test_reply_is_logged(inprocess_proxy: InProcessProxy) -> None:
        resp = await inprocess_proxy.chat({"model": "fake-8k-vllm", "messages": [USER]},
                                          headers={"x-session-id": "s1"})
        assert resp.status_code == 200
        await inprocess_proxy.wait_logged("s1", requests=1)
        assert inprocess_proxy.provider.state.chat_requests[-1].json["messages"] == [USER]

``create_app(settings, upstream_transport=...)`` is given a ``StreamingASGITransport`` over the
fake provider (``tests.fakes.upstream``); the test talks to the app through another one; the
app's lifespan runs (``LifespanManager``) around the test. Bodies stream as over sockets; a
client closing a response early is a disconnect (``tests.support.asgi``). What needs real sockets
stays in the real-server tier (``tests/e2e``): uvicorn's own settings and limits, TCP faults,
timing across processes, real clients that open their own connections.

Fixtures (registered for the whole suite by ``tests/conftest.py``):

- ``fake_provider`` -> ``FakeProvider``: ``state`` (``FakeState``: script answers with
  ``state.script`` / ``state.responders`` / ``state.fail_next``, read ``state.chat_requests``);
- ``inprocess_database_url`` -> a fresh migrated SQLite URL; override it in a module
  (``def inprocess_database_url(database_url): return database_url``) to run on both databases;
- ``inprocess_factory`` -> ``async make(**settings) -> InProcessProxy``: each call builds and
  starts one app on ``fake_provider`` and that database; keyword arguments are ``Settings``
  fields; all are shut down after the test;
- ``inprocess_proxy`` -> ``await inprocess_factory()`` (default settings: defenses on).

Outside pytest (or for a second provider), ``async with start_inprocess(settings, provider)``; a
proxy on the strict fake Anthropic provider: ``async with start_messages_inprocess(url, provider)``.
``await session_messages(http, session_id)``: a session's messages once it is logged.
Errors: ``RuntimeError`` when the app's lifespan fails or does not start within 30 s.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from proxy.app import create_app
from proxy.settings import Settings
from tests.fakes.state import FakeState
from tests.fakes.upstream import FakeUpstream, create_fake_upstream
from tests.support.asgi import LifespanManager, StreamingASGITransport
from tests.support.polling import wait_for_async
from tests.support.shared import tiktoken_cache_dir

CLIENT_KEY = "sk-test-client-key-0123456789"
"""The key the test client sends (its tenant), as in the real-server tier."""
PROVIDER_URL = "http://provider.test/v1"
PROXY_URL = "http://proxy.test"


@dataclass
class FakeProvider:
    """The fake provider app and its state; ``transport()`` makes the httpx transport one proxy
    app uses (kept in ``transports``, so ``app_errors`` sees every exception of the fake)."""

    app: FakeUpstream
    state: FakeState
    url: str = PROVIDER_URL
    transports: list[StreamingASGITransport] = field(default_factory=list)

    def transport(self) -> StreamingASGITransport:
        transport = StreamingASGITransport(self.app, raise_app_exceptions=False)
        self.transports.append(transport)
        return transport

    @property
    def app_errors(self) -> list[BaseException]:
        return [exc for t in self.transports for exc in t.app_errors]


@dataclass
class InProcessProxy:
    """A started proxy app. ``http`` is an ``httpx.AsyncClient`` on it sending ``CLIENT_KEY``;
    ``client()`` an ``openai.AsyncOpenAI``; ``app.state`` the app's state (as the lifespan set it)."""

    app: FastAPI
    settings: Settings
    provider: FakeProvider
    transport: StreamingASGITransport
    http: httpx.AsyncClient
    _clients: list[httpx.AsyncClient] = field(default_factory=list, repr=False)

    url: str = PROXY_URL

    def http_client(self, key: str | None = CLIENT_KEY, **kwargs: Any) -> httpx.AsyncClient:
        """Another ``httpx.AsyncClient`` on the app (``key`` None: no authorization header);
        closed with the proxy."""
        headers = {"authorization": f"Bearer {key}"} if key else {}
        headers.update(kwargs.pop("headers", {}))
        client = httpx.AsyncClient(transport=self.transport, base_url=self.url, headers=headers,
                                   timeout=kwargs.pop("timeout", 30.0), **kwargs)
        self._clients.append(client)
        return client

    def client(self, key: str = CLIENT_KEY, **kwargs: Any) -> openai.AsyncOpenAI:
        """The official SDK on the app (no retries)."""
        http = self.http_client(None)
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0,
                                  http_client=http, **kwargs)  # type: ignore[arg-type]  # (it takes httpx's too)

    async def chat(self, body: dict[str, Any], *, headers: dict[str, str] | None = None,
                   key: str | None = CLIENT_KEY) -> httpx.Response:
        """``POST /v1/chat/completions`` with ``body``; the response is read whole (streamed
        bodies too: use ``http.stream`` to read them piece by piece)."""
        http = self.http if key == CLIENT_KEY else self.http_client(key)
        return await http.post("/v1/chat/completions", json=body, headers=headers or {})

    async def wait_logged(self, session_id: str, requests: int, timeout_s: float = 10.0) -> dict[str, Any]:
        """Wait until ``session_id`` has ``requests`` request records (they are written after the
        response); returns the session's JSON. Raises ``AssertionError`` at the deadline."""
        return await wait_session(self.http, session_id, requests, timeout_s)

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()
        await self.http.aclose()


def default_settings(database_url: str, provider: FakeProvider, **overrides: Any) -> Settings:
    """``Settings`` of an in-process proxy on ``provider`` and ``database_url``; ``overrides``
    are ``Settings`` fields."""
    values: dict[str, Any] = {"upstream_url": provider.url, "database_url": database_url,
                              "tiktoken_cache_dir": tiktoken_cache_dir()}
    values.update(overrides)
    return Settings(**values)


@contextlib.asynccontextmanager
async def start_inprocess(settings: Settings, provider: FakeProvider) -> AsyncIterator[InProcessProxy]:
    """Build the app on ``provider``, run its lifespan, yield it; shut down at exit."""
    app = create_app(settings, upstream_transport=provider.transport())
    transport = StreamingASGITransport(app)
    async with LifespanManager(app):
        http = httpx.AsyncClient(transport=transport, base_url=PROXY_URL,
                                 headers={"authorization": f"Bearer {CLIENT_KEY}"}, timeout=30.0)
        proxy = InProcessProxy(app, settings, provider, transport, http)
        try:
            yield proxy
        finally:
            await proxy.aclose()
            await transport.aclose()


ANTHROPIC_CLIENT_KEY = "sk-ant-client-0123456789"
"""The key a Messages test client sends (``x-api-key``: its tenant)."""


@contextlib.asynccontextmanager
async def start_messages_inprocess(database_url: str, provider: Any, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A proxy app whose Anthropic upstream is ``provider`` (a ``tests.fakes.anthropic.FakeAnthropic``)
    on ``database_url`` (``overrides``: ``Settings`` fields), its lifespan run; yields an
    ``httpx.AsyncClient`` on it sending ``ANTHROPIC_CLIENT_KEY`` and ``anthropic-version`` (the
    read API answers it too). Shut down at exit."""
    settings = Settings(**{"anthropic_upstream_url": "http://anthropic.test", "upstream_url": "http://127.0.0.1:9/v1",
                           "database_url": database_url, "tiktoken_cache_dir": tiktoken_cache_dir(), **overrides})
    app = create_app(settings, upstream_transport=StreamingASGITransport(provider, raise_app_exceptions=False))
    transport = StreamingASGITransport(app)
    async with LifespanManager(app), httpx.AsyncClient(
            transport=transport, base_url=PROXY_URL, timeout=30.0,
            headers={"x-api-key": ANTHROPIC_CLIENT_KEY, "anthropic-version": "2023-06-01"}) as http:
        try:
            yield http
        finally:
            await transport.aclose()


async def wait_session(http: httpx.AsyncClient, session_id: str, requests: int, timeout_s: float = 10.0) -> dict[str, Any]:
    """Wait until ``session_id`` has ``requests`` request records, read through ``http`` (a client
    on the app); returns the session's JSON. Raises ``AssertionError`` at the deadline."""
    last: list[httpx.Response] = []

    async def logged() -> dict[str, Any] | None:
        resp = await http.get(f"/sessions/{session_id}")
        last[:] = [resp]
        body: dict[str, Any] = resp.json()
        return body if resp.status_code == 200 and body["request_count"] >= requests else None

    found: dict[str, Any] | None = await wait_for_async(logged, timeout_s)
    if found is None:
        raise AssertionError(f"session {session_id} did not reach {requests} logged requests: {last[0].text}")
    return found


async def session_messages(http: httpx.AsyncClient, session_id: str, requests: int = 1,
                           timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """``session_id``'s messages (its newest branch, as the read API lists them) once it has
    ``requests`` request records (``wait_session``), through ``http`` (``InProcessProxy.http``,
    ``start_messages_inprocess``'s client)."""
    await wait_session(http, session_id, requests, timeout_s)
    resp = await http.get(f"/sessions/{session_id}/messages")
    assert resp.status_code == 200, resp.text
    data: list[dict[str, Any]] = resp.json()["data"]
    return data


@pytest.fixture
def fake_provider() -> FakeProvider:
    """A fresh fake provider (no sockets)."""
    app, state = create_fake_upstream()
    return FakeProvider(app, state)


@pytest.fixture
def inprocess_database_url(tmp_path: Path, sqlite_template: Path) -> str:
    """A fresh migrated SQLite database for the in-process proxy."""
    path = tmp_path / "inprocess.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture
async def inprocess_factory(inprocess_database_url: str,
                            fake_provider: FakeProvider) -> AsyncIterator[Callable[..., Awaitable[InProcessProxy]]]:
    """``await make(**settings)``: a started in-process proxy per call, all shut down after the test."""
    async with contextlib.AsyncExitStack() as stack:

        async def make(**overrides: Any) -> InProcessProxy:
            settings = default_settings(inprocess_database_url, fake_provider, **overrides)
            return await stack.enter_async_context(start_inprocess(settings, fake_provider))

        yield make


@pytest.fixture
async def inprocess_proxy(inprocess_factory: Callable[..., Awaitable[InProcessProxy]]) -> InProcessProxy:
    """An in-process proxy with default settings (defenses on)."""
    return await inprocess_factory()
