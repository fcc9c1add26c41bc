"""Messages requests logged in their sessions (issue 19, item 2): the official ``anthropic`` SDK
through the proxy to the strict fake Anthropic provider, the log read back through the read API,
on SQLite and PostgreSQL. Turns are stored once, in their native shape; a reply the client echoes
(moved cache breakpoints and the SDK's ``null`` fields included) continues the same branch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import pytest

from tests.fakes.anthropic import FakeAnthropicState, reply, text, thinking, tool_use
from tests.support.anthropic_server import ANTHROPIC_KEY, anthropic_client
from tests.support.polling import wait_for

WEATHER: Any = {"name": "get_weather", "description": "Weather of a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
SYSTEM: Any = [{"type": "text", "text": "You are a weather bot.", "cache_control": {"type": "ephemeral"}}]


def logged(url: str, session_id: str, requests: int) -> dict[str, Any]:
    """The session's JSON once it has ``requests`` request records (the log is written after the answer)."""
    with httpx.Client(base_url=url, headers={"x-api-key": ANTHROPIC_KEY}, timeout=30) as http:
        def done() -> dict[str, Any] | None:
            r = http.get(f"/sessions/{session_id}")
            return r.json() if r.status_code == 200 and r.json()["request_count"] >= requests else None

        found = wait_for(done, 10.0)
        assert found is not None, http.get(f"/sessions/{session_id}").text
        found["messages"] = http.get(f"/sessions/{session_id}/messages").json()["data"]
        found["requests"] = http.get(f"/sessions/{session_id}/requests").json()["data"]
        return found


def marked(turn: Any) -> Any:
    """``turn`` with a cache breakpoint on its last block, as Claude Code marks the newest turn."""
    content = turn["content"] if isinstance(turn["content"], list) else [{"type": "text", "text": turn["content"]}]
    return {**turn, "content": [*content[:-1], {**content[-1], "cache_control": {"type": "ephemeral"}}]}


def test_a_tool_conversation_is_logged_once_in_its_claude_code_session(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState, database_url: str) -> None:
    url = anthropic_proxy(database_url=database_url)
    anthropic_state.script.extend([
        reply(thinking("The user wants the weather."), text("Checking."),
              tool_use("get_weather", {"city": "Paris"}, id="toolu_01paris")),
        reply(thinking("It is sunny."), text("Sunny in Paris.")),
    ])
    session = {"x-claude-code-session-id": "1b0c5e3e-7d52-4c1e-9a52-5b8a3f0c9d11"}
    first: Any = {"role": "user", "content": "Weather in Paris?"}
    thinking_on: Any = {"type": "enabled", "budget_tokens": 1024}
    with anthropic_client(url, default_headers=session) as c:
        one: Any = c.messages.create(model="claude-sonnet-4-5", max_tokens=2048, system=SYSTEM, tools=[WEATHER],
                                     thinking=thinking_on, messages=[marked(first)])
        echo: Any = {"role": "assistant", "content": [b.model_dump() for b in one.content]}  # the SDK's own dump
        result: Any = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01paris",
                                                     "content": "21 C, sunny"}]}
        with c.messages.stream(model="claude-sonnet-4-5", max_tokens=2048, system=SYSTEM, tools=[WEATHER],
                               thinking=thinking_on, messages=[first, echo, marked(result)]) as stream:
            two: Any = stream.get_final_message()
    assert [b.text for b in two.content if b.type == "text"] == ["Sunny in Paris."]
    found = logged(url, session["x-claude-code-session-id"], 2)
    assert found["branch_count"] == 1, found  # the echo and the moved breakpoints continue one branch
    messages = found["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[0]["content"] == SYSTEM and messages[1]["content"] == marked(first)["content"]  # as sent
    assert [b["type"] for b in messages[2]["content"]] == ["thinking", "text", "tool_use"]
    assert messages[2]["content"][0]["signature"] == one.content[0].signature  # opaque, byte for byte
    assert messages[3]["content"] == marked(result)["content"]
    streamed = messages[4]["content"]
    assert [b["type"] for b in streamed] == [b.type for b in two.content]
    assert streamed[-1]["text"] == "Sunny in Paris." and streamed[0]["signature"] == two.content[0].signature
    with httpx.Client(base_url=url, headers={"x-api-key": ANTHROPIC_KEY}, timeout=30) as http:
        archive = http.get(f"/sessions/{session['x-claude-code-session-id']}/archive").text
    assert "Weather in Paris?" in archive and '**tool call** `"toolu_01paris"` `"get_weather"`:' in archive
    assert '{"city":"Paris"}' in archive and "21 C, sunny" in archive and "Sunny in Paris." in archive
    records = sorted(found["requests"], key=lambda r: r["created_at"])
    assert [r["stream"] for r in records] == [False, True]
    assert [r["finish_reason"] for r in records] == ["tool_use", "end_turn"]
    assert records[0]["usage"] == anthropic_state.requests[0].usage  # the upstream's figures, unchanged
    assert records[1]["usage"]["output_tokens"] == anthropic_state.requests[1].usage["output_tokens"]


def test_sessions_are_named_by_claude_code_then_x_session_id_then_derived(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState) -> None:
    url = anthropic_proxy()
    turn: Any = [{"role": "user", "content": "Name this session"}]
    with anthropic_client(url) as c:
        raw: Any = c.messages.with_raw_response.create(model="m", max_tokens=8, messages=turn)
        derived = raw.headers["x-context-proxy-session-id"]
        again: Any = c.messages.with_raw_response.create(model="m", max_tokens=8, messages=turn)
        named: Any = c.messages.with_raw_response.create(model="m", max_tokens=8, messages=turn,
                                                          extra_headers={"x-session-id": "mine"})
        both: Any = c.messages.with_raw_response.create(
            model="m", max_tokens=8, messages=turn,
            extra_headers={"x-session-id": "mine", "x-claude-code-session-id": "cc-1"})
        odd: Any = c.messages.with_raw_response.create(  # not an id the read API can address: passed over
            model="m", max_tokens=8, messages=turn, extra_headers={"x-claude-code-session-id": "a/b"})
    assert derived.startswith("sess_") and again.headers["x-context-proxy-session-id"] == derived
    assert named.headers["x-context-proxy-session-id"] == "mine"
    assert both.headers["x-context-proxy-session-id"] == "cc-1"
    assert odd.headers["x-context-proxy-session-id"] == derived
    assert anthropic_state.requests[-1].headers["x-claude-code-session-id"] == "a/b"  # forwarded as it came
    with anthropic_client(url) as c, pytest.raises(anthropic.BadRequestError) as caught:
        c.messages.create(model="m", max_tokens=8, messages=turn, extra_headers={"x-session-id": "x/y"})
    assert caught.value.body["type"] == "error" and "X-Session-Id" in caught.value.body["error"]["message"]


def test_provider_errors_are_logged_and_passed_back_unchanged(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState) -> None:
    url = anthropic_proxy()
    orphan: Any = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}]}]
    with httpx.Client(headers={"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01",
                               "x-session-id": "errs"}, timeout=30) as http:
        r = http.post(url + "/v1/messages", json={"model": "m", "max_tokens": 8, "messages": orphan})
        garbage = http.post(url + "/v1/messages", content=b'{"model": "m", "messages": "not a list"')
    assert r.status_code == 400 and r.json()["error"]["message"] == anthropic_state.requests[0].error
    assert garbage.status_code == 400 and anthropic_state.requests[1].raw == b'{"model": "m", "messages": "not a list"'
    found = logged(url, "errs", 1)
    assert found["request_count"] == 1  # the body the proxy cannot read went unlogged, as it came
    assert [m["role"] for m in found["messages"]] == ["user", "assistant", "user"]  # the client's turns kept
    assert found["requests"][0]["status"] == 400 and "tool_result" in found["requests"][0]["error"]


def test_a_key_the_provider_refuses_logs_no_content(anthropic_proxy: Callable[..., str],
                                                    anthropic_state: FakeAnthropicState) -> None:
    url = anthropic_proxy()
    anthropic_state.api_keys = {"sk-ant-the-real-one"}
    with anthropic_client(url, key="sk-ant-made-up", default_headers={"x-session-id": "refused"}) as c, \
            pytest.raises(anthropic.AuthenticationError) as caught:
        c.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "secret text"}])
    assert caught.value.body["error"]["message"] == "invalid x-api-key"  # the provider's words
    with httpx.Client(base_url=url, headers={"x-api-key": "sk-ant-made-up"}, timeout=30) as http:
        def recorded() -> Any:
            r = http.get("/sessions/refused")
            return r.json() if r.status_code == 200 and r.json()["request_count"] == 1 else None

        assert wait_for(recorded, 10.0) is not None
        assert http.get("/sessions/refused/messages").json()["data"] == []
