"""The real-server tier for Anthropic's Messages API: the strict fake Anthropic provider
(``tests.fakes.anthropic``) and the proxy in front of it, each under a real uvicorn server.
Fixtures (registered for the whole suite by ``tests/conftest.py``):

- ``anthropic_fake`` -> ``(url, FakeAnthropicState)``: one fake per module;
- ``anthropic_state``: that fake's state, reset for the test;
- ``anthropic_proxy(**settings) -> url``: starts the proxy on a free port with the fake as its
  Anthropic upstream (the OpenAI upstream a closed port: nothing may reach it) and, unless
  ``database_url`` is given, a SQLite file of the test's; stopped after the test.

``anthropic_client(url, key)``: the official ``anthropic`` SDK on the proxy, no retries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from proxy.app import create_app
from proxy.settings import Settings
from tests.fakes.anthropic import FakeAnthropicState, create_fake_anthropic
from tests.fakes.server import UvicornServer
from tests.support.shared import tiktoken_cache_dir

ANTHROPIC_KEY = "sk-ant-client-0123456789"


def anthropic_client(url: str, key: str = ANTHROPIC_KEY, **kwargs: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, **kwargs)


@pytest.fixture(scope="module")
def anthropic_fake() -> Iterator[tuple[str, FakeAnthropicState]]:
    app, state = create_fake_anthropic()
    with UvicornServer(app) as server:
        yield server.url, state


@pytest.fixture
def anthropic_state(anthropic_fake: tuple[str, FakeAnthropicState]) -> FakeAnthropicState:
    anthropic_fake[1].reset()
    return anthropic_fake[1]


@pytest.fixture
def anthropic_proxy(anthropic_fake: tuple[str, FakeAnthropicState], anthropic_state: FakeAnthropicState,
                    tmp_path: Path) -> Iterator[Callable[..., str]]:
    servers: list[UvicornServer] = []

    def start(**overrides: Any) -> str:
        values: dict[str, Any] = {"anthropic_upstream_url": anthropic_fake[0], "upstream_url": "http://127.0.0.1:9/v1",
                                  "database_url": f"sqlite:///{tmp_path}/proxy.db",
                                  "tiktoken_cache_dir": tiktoken_cache_dir(), **overrides}
        server = UvicornServer(create_app(Settings(**values))).start()
        servers.append(server)
        return server.url

    try:
        yield start
    finally:
        for server in servers:
            server.stop()
