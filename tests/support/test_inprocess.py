"""The in-process tier (``tests.support.inprocess``): the proxy app and the fake provider in the
test's event loop forward, stream, log and see disconnects and cut streams as over sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import openai
import pytest

from tests.support.inprocess import CLIENT_KEY, FakeProvider, InProcessProxy

USER = {"role": "user", "content": "What is the weather in Paris?"}
REPLY = " ".join(f"word{i}" for i in range(60))


async def test_a_request_is_forwarded_answered_and_logged(inprocess_proxy: InProcessProxy, fake_provider: FakeProvider) -> None:
    resp = await inprocess_proxy.chat({"model": "gpt-4o", "messages": [USER]}, headers={"x-session-id": "s1"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "OK: What is the weather in Paris?"
    forwarded = fake_provider.state.chat_requests[-1]
    assert forwarded.json["messages"] == [USER]
    assert forwarded.headers["authorization"] == f"Bearer {CLIENT_KEY}"
    session = await inprocess_proxy.wait_logged("s1", requests=1)
    assert session["message_count"] == 2
    assert fake_provider.app_errors == []


async def test_the_openai_sdk_streams_through_it(inprocess_proxy: InProcessProxy, fake_provider: FakeProvider) -> None:
    fake_provider.state.script.append({"role": "assistant", "content": REPLY})
    client = inprocess_proxy.client(default_headers={"x-session-id": "s2"})
    stream = await client.chat.completions.create(model="gpt-4o", messages=[USER], stream=True)  # type: ignore[arg-type]
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    assert text == REPLY
    await inprocess_proxy.wait_logged("s2", requests=1)


async def test_the_first_chunk_arrives_before_the_provider_ends(inprocess_proxy: InProcessProxy,
                                                               fake_provider: FakeProvider) -> None:
    """Bodies are relayed as they come: the client reads the first event while the fake holds the rest."""
    gate = asyncio.Event()
    fake_provider.state.stream_gate, fake_provider.state.stream_gate_after_chunks = gate, 2
    fake_provider.state.script.append({"role": "assistant", "content": REPLY})
    body = {"model": "gpt-4o", "messages": [USER], "stream": True}
    async with inprocess_proxy.http.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        parts = resp.aiter_bytes()
        first = await asyncio.wait_for(anext(parts), 5)
        assert first.startswith(b"data: ") and not gate.is_set()
        gate.set()
        rest = b"".join([part async for part in parts])
    assert rest.rstrip().endswith(b"data: [DONE]")


async def test_a_client_that_leaves_mid_stream_is_logged_partial(inprocess_proxy: InProcessProxy,
                                                                 fake_provider: FakeProvider) -> None:
    fake_provider.state.script.append({"role": "assistant", "content": REPLY})
    fake_provider.state.chunk_delay_s = 0.02
    body = {"model": "gpt-4o", "messages": [USER], "stream": True}
    async with inprocess_proxy.http.stream("POST", "/v1/chat/completions", json=body,
                                           headers={"x-session-id": "gone"}) as resp:
        async for part in resp.aiter_bytes():
            if part.count(b"data: ") >= 1:
                break  # leaving the block closes the response: a disconnect
    await inprocess_proxy.wait_logged("gone", requests=1)
    messages = (await inprocess_proxy.http.get("/sessions/gone/messages")).json()["data"]
    assert messages[-1]["role"] == "assistant" and messages[-1]["x_context_proxy"]["partial"] is True
    assert len(messages[-1]["content"]) < len(REPLY)


async def test_a_cut_provider_stream_reaches_the_client_as_a_cut(inprocess_proxy: InProcessProxy,
                                                                 fake_provider: FakeProvider) -> None:
    """The fake's ``cut_stream`` ends the body early; the proxy sees the transport error it sees
    over a socket and ends the client's stream without ``[DONE]``."""
    fake_provider.state.script.append({"role": "assistant", "content": REPLY})
    fake_provider.state.fail_next.append(("cut_stream", 3))
    client = inprocess_proxy.client()
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        stream = await client.chat.completions.create(model="gpt-4o", messages=[USER], stream=True)  # type: ignore[arg-type]
        async for _ in stream:
            pass


async def test_settings_are_keyword_arguments(inprocess_factory: Callable[..., Awaitable[InProcessProxy]],
                                              fake_provider: FakeProvider) -> None:
    plain = await inprocess_factory(compaction_enabled=False, upstream_api_key="sk-provider-0123456789",
                                    client_api_keys="sk-client-0123456789")
    assert plain.settings.compaction_enabled is False
    refused = await plain.chat({"model": "gpt-4o", "messages": [USER]}, key="sk-unknown-0123456789")
    assert refused.status_code == 401
    served = await plain.chat({"model": "gpt-4o", "messages": [USER]}, key="sk-client-0123456789")
    assert served.status_code == 200
    assert fake_provider.state.chat_requests[-1].headers["authorization"] == "Bearer sk-provider-0123456789"


class TestOnBothDatabases:
    @pytest.fixture
    def inprocess_database_url(self, database_url: str) -> str:
        return database_url

    async def test_the_log_is_written(self, inprocess_proxy: InProcessProxy) -> None:
        assert inprocess_proxy.settings.database_url.startswith(("sqlite", "postgresql"))
        resp = await inprocess_proxy.chat({"model": "gpt-4o", "messages": [USER]}, headers={"x-session-id": "db"})
        assert resp.status_code == 200
        session: dict[str, Any] = await inprocess_proxy.wait_logged("db", requests=1)
        assert session["request_count"] == 1
