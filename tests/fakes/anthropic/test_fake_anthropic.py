"""The fake Anthropic provider driven by the official SDK: messages, streams, tools, count_tokens, headers."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from tests.fakes.anthropic import FakeAnthropicState, Reply, reply, text, thinking, tool_use
from tests.fakes.anthropic.tokens import count_input_tokens, prompt_segments

USER: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_TOOL: Any = {"name": "get_weather", "description": "Weather of a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}



def err(exc: anthropic.APIStatusError) -> Any:
    """The parsed error body of an SDK exception."""
    return exc.body

def sse_names(body: str) -> list[str]:
    return [line[len("event: "):] for line in body.splitlines() if line.startswith("event: ")]


def test_create_returns_a_full_message_and_records_the_request(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    message: Any = client.messages.create(model="fake-4k-anthropic", max_tokens=64, messages=USER)
    assert message.id.startswith("msg_01") and message.type == "message" and message.role == "assistant"
    assert message.model == "fake-4k-anthropic"
    assert [b.type for b in message.content] == ["text"] and message.content[0].text.startswith("OK: What is")
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    usage: Any = message.usage
    assert usage.input_tokens == count_input_tokens(prompt_segments(state.requests[0].json))
    assert (usage.cache_creation_input_tokens, usage.cache_read_input_tokens) == (0, 0) and usage.output_tokens >= 1
    received = state.requests[0]
    assert received.path == "/v1/messages" and json.loads(received.raw) == received.json
    assert received.json["messages"] == USER and received.headers["anthropic-version"]
    assert received.headers.get("x-api-key") == "sk-ant-test" or received.headers["authorization"] == "Bearer sk-ant-test"
    assert received.response["id"] == message.id


def test_response_headers_carry_request_id_and_rate_limits(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    raw: Any = client.messages.with_raw_response.create(model="m", max_tokens=16, messages=USER)
    assert raw.headers["request-id"].startswith("req_011C")
    for name in ("requests", "tokens", "input-tokens", "output-tokens"):
        assert int(raw.headers[f"anthropic-ratelimit-{name}-limit"]) > 0
        assert raw.headers[f"anthropic-ratelimit-{name}-reset"].endswith("Z")


def test_raw_stream_follows_the_documented_event_order(url: str, state: FakeAnthropicState) -> None:
    state.script.append(reply(thinking("The user wants weather."), text("Let me check the weather now."),
                              tool_use("get_weather", {"city": "Paris"}, id="toolu_01abc")))
    body: Any = {"model": "m", "max_tokens": 2048, "stream": True, "messages": USER, "tools": [WEATHER_TOOL],
            "thinking": {"type": "enabled", "budget_tokens": 1024}}
    response = httpx.post(url + "/v1/messages", json=body, headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    names = sse_names(response.text)
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") == 3
    events: Any = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events] == names
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert set(start["usage"]) >= {"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"}
    deltas = [e for e in events if e["type"] == "content_block_delta"]
    thinking_deltas = [d["delta"]["type"] for d in deltas if d["index"] == 0]
    assert thinking_deltas[-1] == "signature_delta" and set(thinking_deltas[:-1]) == {"thinking_delta"}
    assert "".join(d["delta"]["partial_json"] for d in deltas if d["index"] == 2) == '{"city":"Paris"}'
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    recorded = state.requests[0].usage
    assert recorded is not None and events[-2]["usage"]["output_tokens"] == recorded["output_tokens"]
    assert "event: message_start\ndata: {" in response.text and response.text.endswith("\n\n")


def test_stream_helper_and_create_stream_rebuild_the_message(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    state.script.extend([reply("Sunny, twenty degrees, light wind."), reply("Rain later.")])
    with client.messages.stream(model="m", max_tokens=64, messages=USER) as stream:
        assert "".join(stream.text_stream) == "Sunny, twenty degrees, light wind."
        final: Any = stream.get_final_message()
    recorded = state.requests[0].usage
    assert recorded is not None and final.usage.output_tokens == recorded["output_tokens"]
    assert final.stop_reason == "end_turn"
    events: Any = list(client.messages.create(model="m", max_tokens=64, messages=USER, stream=True))
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == "Rain later."


def test_tool_round_trip(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    seen: list[Any] = []

    def after_tool(request: Any) -> Reply:
        seen.append(request.json["messages"][-1]["content"][0])
        return reply("It is sunny in Paris.")

    state.script.extend([reply(tool_use("get_weather", {"city": "Paris"})), after_tool])
    first: Any = client.messages.create(model="m", max_tokens=256, messages=USER, tools=[WEATHER_TOOL])
    assert first.stop_reason == "tool_use"
    call = first.content[0]
    assert call.type == "tool_use" and call.id.startswith("toolu_01") and call.input == {"city": "Paris"}
    history: Any = [*USER, first.to_param() if hasattr(first, "to_param") else {"role": "assistant", "content": first.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18C, sunny"}]}]
    second: Any = client.messages.create(model="m", max_tokens=256, messages=history, tools=[WEATHER_TOOL])
    assert second.content[0].text == "It is sunny in Paris." and second.stop_reason == "end_turn"
    assert seen == [{"type": "tool_result", "tool_use_id": call.id, "content": "18C, sunny"}]


def test_count_tokens_needs_no_max_tokens_and_matches_usage(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    counted: Any = client.messages.count_tokens(model="m", messages=USER, system="Be brief.", tools=[WEATHER_TOOL])
    created: Any = client.messages.create(model="m", max_tokens=32, messages=USER, system="Be brief.", tools=[WEATHER_TOOL])
    assert counted.input_tokens == created.usage.input_tokens > 0
    assert state.requests[0].path == "/v1/messages/count_tokens" and "max_tokens" not in state.requests[0].json
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.count_tokens(model="m", messages=USER, extra_body={"max_tokens": 5})
    assert err(caught.value)["error"]["message"] == "max_tokens: Extra inputs are not permitted"


def test_stop_sequences_and_max_tokens_stop_the_reply(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    state.script.extend([reply("alpha beta STOP gamma"), reply("one two three four five six seven eight nine ten")])
    stopped: Any = client.messages.create(model="m", max_tokens=64, messages=USER, stop_sequences=["STOP"])
    assert (stopped.content[0].text, stopped.stop_reason, stopped.stop_sequence) == ("alpha beta ", "stop_sequence", "STOP")
    cut: Any = client.messages.create(model="m", max_tokens=3, messages=USER)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    assert 0 < len(cut.content[0].text) < len("one two three four five six seven eight nine ten")


async def test_async_client_in_process(aclient: anthropic.AsyncAnthropic, state: FakeAnthropicState) -> None:
    state.script.extend([reply("async hello"), reply(tool_use("get_weather", {"city": "Oslo"}))])
    message: Any = await aclient.messages.create(model="m", max_tokens=32, messages=USER)
    assert message.content[0].text == "async hello"
    async with aclient.messages.stream(model="m", max_tokens=64, messages=USER, tools=[WEATHER_TOOL]) as stream:
        final: Any = await stream.get_final_message()
    assert final.content[0].input == {"city": "Oslo"} and final.stop_reason == "tool_use"
    counted: Any = await aclient.messages.count_tokens(model="m", messages=USER)
    assert counted.input_tokens == message.usage.input_tokens
    assert [r.path for r in state.requests] == ["/v1/messages", "/v1/messages", "/v1/messages/count_tokens"]


def test_credentials_and_version_headers(url: str, state: FakeAnthropicState) -> None:
    body: Any = {"model": "m", "max_tokens": 8, "messages": USER}
    ok = httpx.post(url + "/v1/messages", json=body, headers={"x-api-key": "k1", "anthropic-version": "2023-06-01",
                                                                "anthropic-beta": "prompt-caching-2024-07-31"})
    assert ok.status_code == 200 and state.requests[-1].headers["anthropic-beta"] == "prompt-caching-2024-07-31"
    missing_key = httpx.post(url + "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert missing_key.status_code == 401
    assert missing_key.json()["error"] == {"type": "authentication_error", "message": "x-api-key header is required"}
    assert missing_key.json()["request_id"] == missing_key.headers["request-id"]
    missing_version = httpx.post(url + "/v1/messages", json=body, headers={"x-api-key": "k1"})
    assert missing_version.status_code == 400
    assert missing_version.json()["error"]["message"] == "anthropic-version: header is required"
    state.api_keys = {"good"}
    wrong = httpx.post(url + "/v1/messages", json=body, headers={"authorization": "Bearer bad", "anthropic-version": "2023-06-01"})
    assert wrong.status_code == 401 and wrong.json()["error"]["message"] == "invalid x-api-key"
    unknown = httpx.post(url + "/v1/complete", json=body, headers={"x-api-key": "good", "anthropic-version": "2023-06-01"})
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"


def test_sdk_authentication_error_is_typed(url: str, state: FakeAnthropicState) -> None:
    state.api_keys = {"only-this-one"}
    with anthropic.Anthropic(base_url=url, api_key="another", max_retries=0) as c, pytest.raises(anthropic.AuthenticationError) as caught:
        c.messages.create(model="m", max_tokens=8, messages=USER)
    assert caught.value.status_code == 401 and err(caught.value)["error"]["type"] == "authentication_error"


def test_beta_fields_only_on_beta_requests(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    beta: Any = client.beta.messages.create(model="m", max_tokens=8, messages=USER, betas=["context-management-2025-06-27"],
                                       extra_body={"context_management": {"edits": []}})
    assert beta.content and state.requests[-1].headers["anthropic-beta"] == "context-management-2025-06-27"
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="m", max_tokens=8, messages=USER, extra_body={"context_management": {"edits": []}})
    assert err(caught.value)["error"]["message"] == "context_management: Extra inputs are not permitted"
