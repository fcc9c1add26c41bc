"""Anthropic's Messages API through the proxy, relayed (issue 19, item 1: the surface): the official
``anthropic`` SDK against the proxy on a real socket, the strict fake Anthropic provider
(``tests.fakes.anthropic``) as its upstream. Bodies, queries and headers arrive as the client sent
them; answers, streams, errors and the headers a client reads come back as the provider sent
them; the proxy's own errors are in Anthropic's envelope."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import pytest

from tests.fakes.anthropic import FakeAnthropicState, reply, text, tool_use
from tests.support.anthropic_server import ANTHROPIC_KEY, anthropic_client

KEY = ANTHROPIC_KEY
USER: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER: Any = {"name": "get_weather", "description": "Weather of a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
VERSION = {"anthropic-version": "2023-01-01"}
"""A date the SDK never sends (it sends its own): forwarded as the client wrote it, or the test fails."""


@pytest.fixture
def fake(anthropic_fake: tuple[str, FakeAnthropicState]) -> tuple[str, FakeAnthropicState]:
    return anthropic_fake


@pytest.fixture
def fake_state(anthropic_state: FakeAnthropicState) -> FakeAnthropicState:
    return anthropic_state


@pytest.fixture
def start_proxy(anthropic_proxy: Callable[..., str]) -> Callable[..., str]:
    return anthropic_proxy


def client(url: str, key: str = KEY) -> anthropic.Anthropic:
    return anthropic_client(url, key)


def test_a_message_goes_and_comes_back_as_sent(start_proxy: Callable[..., str], fake_state: FakeAnthropicState) -> None:
    url = start_proxy()
    fake_state.script.append(reply(text("Sunny, 21 degrees.")))
    with client(url) as c:
        raw: Any = c.messages.with_raw_response.create(model="claude-sonnet-4-5", max_tokens=64, messages=USER,
                                                        extra_headers={"anthropic-beta": "fine-grained-tool-streaming-2025-05-14",
                                                                       **VERSION})
        message: Any = raw.parse()
    assert [b.text for b in message.content] == ["Sunny, 21 degrees."]
    received = fake_state.requests[-1]
    assert received.path == "/v1/messages" and received.json["messages"] == USER
    sent_key = received.headers.get("x-api-key") or received.headers["authorization"].removeprefix("Bearer ")
    assert sent_key == KEY and received.headers["anthropic-version"] == "2023-01-01"
    assert received.headers["anthropic-beta"] == "fine-grained-tool-streaming-2025-05-14"
    assert message.id == received.response["id"] and message.usage.input_tokens == received.usage["input_tokens"]
    assert raw.headers["request-id"].startswith("req_011C")
    assert raw.headers["anthropic-ratelimit-requests-limit"] == "4000"


def test_the_body_and_the_query_arrive_byte_for_byte(start_proxy: Callable[..., str],
                                                    fake_state: FakeAnthropicState) -> None:
    url = start_proxy()
    body = b'{ "max_tokens":16,\n "model" : "m", "messages":[{"role":"user","content":"caf\\u00e9 \xc3\xa9"}],"zz":null}'
    fake_state.extra_fields = {"zz"}  # a field the proxy does not know: forwarded, never judged by us
    r = httpx.post(url + "/v1/messages?beta=true", content=body,
                   headers={"x-api-key": KEY, "content-type": "application/json", **VERSION})
    assert r.status_code == 200, r.text
    received = fake_state.requests[-1]
    assert received.raw == body and received.query == "beta=true"


def test_a_stream_is_relayed_event_for_event(start_proxy: Callable[..., str], fake_state: FakeAnthropicState) -> None:
    url = start_proxy()
    fake_state.script.append(reply(text("Let me look."), tool_use("get_weather", {"city": "Paris"}, id="toolu_01x")))
    with client(url) as c, c.messages.stream(model="m", max_tokens=256, messages=USER, tools=[WEATHER]) as stream:
        events = [event.type for event in stream]
        final: Any = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert [b.type for b in final.content] == ["text", "tool_use"] and final.stop_reason == "tool_use"
    assert final.content[1].input == {"city": "Paris"} and final.id == fake_state.requests[-1].response["id"]


def test_a_raw_stream_is_byte_for_byte_the_providers(start_proxy: Callable[..., str],
                                                    fake_state: FakeAnthropicState, fake: Any) -> None:
    url = start_proxy()
    body = {"model": "m", "max_tokens": 64, "stream": True, "messages": USER}
    fixed = reply(text("one two three"))
    fake_state.script.extend([fixed, fixed])
    with httpx.Client(headers={"x-api-key": KEY, **VERSION}, timeout=30) as http:
        direct = http.post(fake[0] + "/v1/messages", json=body)
        relayed = http.post(url + "/v1/messages", json=body)
    assert relayed.status_code == 200 and relayed.headers["content-type"] == direct.headers["content-type"]
    first_id, second_id = (r.response["id"] for r in fake_state.requests[-2:])
    assert relayed.content == direct.content.replace(first_id.encode(), second_id.encode())


def test_count_tokens_is_the_providers_count(start_proxy: Callable[..., str], fake_state: FakeAnthropicState) -> None:
    url = start_proxy()
    with client(url) as c:
        counted: Any = c.messages.count_tokens(model="m", messages=USER, tools=[WEATHER])
    received = fake_state.requests[-1]
    assert received.path == "/v1/messages/count_tokens" and counted.input_tokens == received.response["input_tokens"]


def test_provider_errors_come_back_unchanged(start_proxy: Callable[..., str], fake_state: FakeAnthropicState,
                                            fake: Any) -> None:
    url = start_proxy()
    orphan: Any = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}]
    with httpx.Client(headers={"x-api-key": KEY, **VERSION}, timeout=30) as http:
        direct = http.post(fake[0] + "/v1/messages", json={"model": "m", "max_tokens": 8, "messages": orphan})
        relayed = http.post(url + "/v1/messages", json={"model": "m", "max_tokens": 8, "messages": orphan})
    assert relayed.status_code == direct.status_code == 400
    assert relayed.json()["error"] == direct.json()["error"] and relayed.json()["type"] == "error"
    fake_state.fail_next.append(("status", 529))
    with client(url) as c, pytest.raises(anthropic.APIStatusError) as caught:
        c.messages.create(model="m", max_tokens=8, messages=USER)
    assert caught.value.status_code == 529 and caught.value.body["error"]["type"] == "overloaded_error"


def test_the_proxys_own_errors_are_in_anthropics_envelope(start_proxy: Callable[..., str],
                                                          fake_state: FakeAnthropicState) -> None:
    url = start_proxy(max_body_bytes=10_000)
    with client(url) as c, pytest.raises(anthropic.APIStatusError) as caught:
        c.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x" * 20_000}])
    assert caught.value.status_code == 413
    assert caught.value.body == {"type": "error", "error": {"type": "request_too_large", "message": caught.value.body[
        "error"]["message"]}} and "10000 bytes" in caught.value.body["error"]["message"]
    assert fake_state.requests == []  # refused before it went anywhere
    r = httpx.post(url + "/v1/messages/%2e%2e/admin", content=b"{}", headers={"x-api-key": KEY, **VERSION})
    assert r.status_code == 400 and r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"


def test_a_proxy_held_anthropic_key_replaces_the_clients(start_proxy: Callable[..., str],
                                                        fake_state: FakeAnthropicState) -> None:
    url = start_proxy(anthropic_upstream_api_key="sk-ant-operator", client_api_keys="sk-proxy-client")
    fake_state.api_keys = {"sk-ant-operator"}
    with client(url, key="sk-proxy-client") as c:
        raw: Any = c.messages.with_raw_response.create(model="m", max_tokens=8, messages=USER)
    received = fake_state.requests[-1]
    assert received.headers["x-api-key"] == "sk-ant-operator" and "authorization" not in received.headers
    assert "sk-proxy-client" not in str(received.headers)
    assert not [h for h in raw.headers if h.startswith("anthropic-ratelimit-")]  # the operator's, not the tenant's
    assert raw.headers["request-id"].startswith("req_011C")
    with client(url, key="sk-someone-else") as c, pytest.raises(anthropic.AuthenticationError) as caught:
        c.messages.create(model="m", max_tokens=8, messages=USER)
    assert caught.value.body["error"]["type"] == "authentication_error" and len(fake_state.requests) == 1
    r = httpx.get(url + "/v1/models", headers={"x-api-key": "sk-proxy-client", **VERSION})
    assert r.status_code == 404 and fake_state.requests[-1].path == "/v1/models"  # the fake lists no models
    r = httpx.post(url + "/v1/messages/batches", json={"requests": []}, headers={"x-api-key": "sk-proxy-client", **VERSION})
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    assert fake_state.requests[-1].path == "/v1/models"  # the batch went nowhere


def test_an_admin_reaches_account_paths_with_the_held_key(start_proxy: Callable[..., str],
                                                         fake_state: FakeAnthropicState) -> None:
    url = start_proxy(anthropic_upstream_api_key="sk-ant-operator", client_api_keys="sk-proxy-client",
                      admin_api_keys="sk-proxy-admin")
    r = httpx.post(url + "/v1/messages/batches", json={"requests": []}, headers={"x-api-key": "sk-proxy-admin", **VERSION})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"  # the fake serves no batches
    received = fake_state.requests[-1]
    assert received.path == "/v1/messages/batches" and received.headers["x-api-key"] == "sk-ant-operator"


def test_a_proxy_holding_only_the_anthropic_key_refuses_openai_calls(start_proxy: Callable[..., str],
                                                                    fake_state: FakeAnthropicState) -> None:
    url = start_proxy(anthropic_upstream_api_key="sk-ant-operator", client_api_keys="sk-proxy-client")
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions")):
        r = httpx.request(method, url + path, json={"model": "m", "messages": []},
                          headers={"authorization": "Bearer sk-proxy-client"})
        assert r.status_code == 403 and "CONTEXT_PROXY_UPSTREAM_API_KEY" in r.json()["error"]["message"], r.text
    assert fake_state.requests == []
    r = httpx.get(url + "/sessions/nope", headers={"x-api-key": "sk-proxy-client", **VERSION})
    assert r.status_code == 404 and "type" not in r.json()  # the proxy's own routes answer in their own envelope


def test_both_providers_share_one_pool_of_upstream_slots(tmp_path: Any, fake: Any) -> None:
    from proxy.app import create_app
    from proxy.settings import Settings
    from tests.fakes.server import UvicornServer

    app = create_app(Settings(anthropic_upstream_url=fake[0], database_url=f"sqlite:///{tmp_path}/p.db"))
    with UvicornServer(app):
        state = app.state.proxy
        assert state.anthropic_upstream.slots is state.upstream.slots
        assert state.anthropic_upstream.transport is state.upstream.transport


def test_a_proxy_holding_only_the_openai_key_refuses_messages(start_proxy: Callable[..., str],
                                                              fake_state: FakeAnthropicState) -> None:
    url = start_proxy(upstream_api_key="sk-openai-operator", client_api_keys="sk-proxy-client")
    with client(url, key="sk-proxy-client") as c, pytest.raises(anthropic.PermissionDeniedError) as caught:
        c.messages.create(model="m", max_tokens=8, messages=USER)
    assert "CONTEXT_PROXY_ANTHROPIC_UPSTREAM_API_KEY" in caught.value.body["error"]["message"]
    assert fake_state.requests == []


def test_an_anthropic_client_reaches_the_anthropic_upstream_on_other_paths(start_proxy: Callable[..., str],
                                                                           fake_state: FakeAnthropicState) -> None:
    url = start_proxy()
    r = httpx.get(url + "/v1/models?limit=5", headers={"x-api-key": KEY, **VERSION})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"  # the fake's own answer
    assert (fake_state.requests[-1].path, fake_state.requests[-1].query) == ("/v1/models", "limit=5")
