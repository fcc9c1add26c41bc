"""Fixtures of the fake Anthropic provider's tests: one uvicorn server per module, a fresh state
per test, the official SDK as the client (sync over the socket, async in-process)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import pytest

from tests.fakes.anthropic import FakeAnthropic, FakeAnthropicState, create_fake_anthropic
from tests.fakes.server import UvicornServer

try:  # the SDK's own HTTP library: httpx2 from anthropic 2.x on, httpx before
    import httpx2 as sdk_http
except ImportError:  # pragma: no cover - older SDKs
    import httpx as sdk_http  # type: ignore[no-redef]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[UvicornServer, FakeAnthropic, FakeAnthropicState]]:
    app, state = create_fake_anthropic()
    with UvicornServer(app) as server:
        yield server, app, state


@pytest.fixture
def state(served: Any) -> FakeAnthropicState:
    served[2].reset()
    return served[2]


@pytest.fixture
def url(served: Any, state: FakeAnthropicState) -> str:
    return served[0].url


@pytest.fixture
def client(url: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=url, api_key="sk-ant-test", max_retries=0) as c:
        yield c


@pytest.fixture
async def aclient(served: Any, state: FakeAnthropicState) -> AsyncIterator[anthropic.AsyncAnthropic]:
    transport = sdk_http.ASGITransport(app=served[1])
    http_client = sdk_http.AsyncClient(transport=transport, base_url="http://fake-anthropic")
    async with anthropic.AsyncAnthropic(base_url="http://fake-anthropic", api_key="sk-ant-test", max_retries=0,
                                        http_client=http_client) as c:
        yield c
