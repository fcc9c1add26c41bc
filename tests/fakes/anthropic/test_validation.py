"""Each validation of the fake surfaces through the official SDK as its typed exception, with the
status and the API's published wording (sources in ``validation.py``, ``turns.py``, ``app.py``)."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from tests.fakes.anthropic import FakeAnthropicState, reply, tool_use

USER: Any = [{"role": "user", "content": "hello"}]
HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}



def err(exc: anthropic.APIStatusError) -> Any:
    """The parsed error body of an SDK exception."""
    return exc.body

def tool_turns(result_first: bool = True, result_id: str = "toolu_01A") -> Any:
    results = [{"type": "tool_result", "tool_use_id": result_id, "content": "ok"}]
    note = [{"type": "text", "text": "here you go"}]
    return [
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": [{"type": "text", "text": "Running."},
                                          {"type": "tool_use", "id": "toolu_01A", "name": "run", "input": {}}]},
        {"role": "user", "content": results + note if result_first else note + results},
    ]


def rejected(client: anthropic.Anthropic, **kwargs: Any) -> anthropic.APIStatusError:
    kwargs.setdefault("model", "m")
    kwargs.setdefault("max_tokens", 16)
    kwargs.setdefault("messages", USER)
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(**kwargs)
    return caught.value


def message_of(error: anthropic.APIStatusError) -> str:
    assert isinstance(error.body, dict) and err(error)["type"] == "error"
    return err(error)["error"]["message"]


CASES = [
    ("unknown top-level field", {"extra_body": {"foo": 1}}, "foo: Extra inputs are not permitted"),
    ("unknown block key", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "bogus": 1}]}]},
     "messages.0.content.0.text.bogus: Extra inputs are not permitted"),
    ("empty text block", {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
     "messages: text content blocks must be non-empty"),
    ("whitespace text block", {"messages": [{"role": "user", "content": [{"type": "text", "text": "  \n"}]}]},
     "messages: text content blocks must contain non-whitespace text"),
    ("empty system block", {"system": [{"type": "text", "text": ""}]}, "system: text content blocks must be non-empty"),
    ("no messages", {"messages": []}, "messages: at least one message is required"),
    ("tool_use unanswered", {"messages": tool_turns()[:2] + [{"role": "user", "content": "and?"}]},
     "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_01A. "
     "Each `tool_use` block must have a corresponding `tool_result` block in the next message."),
    ("text before tool_result", {"messages": tool_turns(result_first=False)},
     "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_01A. "
     "Each `tool_use` block must have a corresponding `tool_result` block in the next message."),
    ("unexpected tool_result", {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_X", "content": "x"}]}]},
     "messages.0.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_X. "
     "Each `tool_result` block must have a corresponding `tool_use` block in the previous message."),
    ("five cache breakpoints", {"system": [{"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral"}} for i in range(5)]},
     "A maximum of 4 blocks with cache_control may be provided. Found 5."),
    ("thinking budget too small", {"max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 512}},
     "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"),
    ("max_tokens not above budget", {"max_tokens": 1024, "thinking": {"type": "enabled", "budget_tokens": 1024}},
     "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at "
     "https://docs.claude.com/en/docs/build-with-claude/extended-thinking#max-tokens-and-context-window-size"),
]


@pytest.mark.parametrize(("kwargs", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_request_is_a_bad_request_error(client: anthropic.Anthropic, state: FakeAnthropicState,
                                                kwargs: dict[str, Any], expected: str) -> None:
    error = rejected(client, **kwargs)
    assert isinstance(error, anthropic.BadRequestError) and error.status_code == 400
    assert err(error)["error"]["type"] == "invalid_request_error"
    assert message_of(error) == expected
    assert err(error)["request_id"] == error.response.headers["request-id"]
    assert state.requests[-1].outcome == "invalid" and state.requests[-1].error == expected


def test_accepted_shapes_that_look_wrong(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    """Consecutive same-role turns are merged and an assistant may speak first (the SDK's docs)."""
    merged: Any = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
              {"role": "assistant", "content": "c"}, {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}]
    assert client.messages.create(model="m", max_tokens=8, messages=merged).stop_reason == "end_turn"
    assert client.messages.create(model="m", max_tokens=8, messages=[{"role": "assistant", "content": "Hi!"}, *USER]).content
    assert client.messages.create(model="m", max_tokens=8, messages=tool_turns()).content
    assert client.messages.create(model="m", max_tokens=0, messages=USER).content == []


def test_required_fields(url: str, state: FakeAnthropicState) -> None:
    for missing, body in (("max_tokens", {"model": "m", "messages": USER}), ("model", {"max_tokens": 5, "messages": USER}),
                          ("messages", {"model": "m", "max_tokens": 5})):
        response = httpx.post(url + "/v1/messages", json=body, headers=HEADERS)
        assert response.status_code == 400
        assert response.json()["error"] == {"type": "invalid_request_error", "message": f"{missing}: Field required"}


def test_context_window_overflow_in_the_published_wording(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    long_text = "alpha beta gamma delta " * 1200  # well over 4,096 tokens either way of counting
    error = rejected(client, model="fake-4k-anthropic", messages=[{"role": "user", "content": long_text}])
    tokens = state.requests[-1].input_tokens
    assert isinstance(error, anthropic.BadRequestError) and tokens is not None and tokens > 4096
    assert message_of(error) == f"prompt is too long: {tokens} tokens > 4096 maximum"
    error = rejected(client, model="fake-4k-anthropic", max_tokens=4095)
    tokens = state.requests[-1].input_tokens
    assert message_of(error) == (f"input length and `max_tokens` exceed context limit: {tokens} + 4095 > 4096, "
                                 "decrease input length or `max_tokens` and try again")
    state.windows["claude-test"] = 10
    with pytest.raises(anthropic.BadRequestError) as count_error:
        client.messages.count_tokens(model="claude-test", messages=[{"role": "user", "content": long_text}])
    assert "prompt is too long" in message_of(count_error.value)


def test_body_over_the_size_limit_is_413(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    state.max_body_bytes = 200
    error = rejected(client, messages=[{"role": "user", "content": "x" * 300}])
    assert error.status_code == 413 and err(error)["error"]["type"] == "request_too_large"
    assert isinstance(error, getattr(anthropic, "ContentTooLargeError", anthropic.APIStatusError))
    assert state.requests[-1].outcome == "too_large"


def test_scripted_overload_is_an_overloaded_error(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    state.fail_next.append(("status", 529))
    error = rejected(client)
    assert isinstance(error, anthropic.OverloadedError) and error.status_code == 529
    assert err(error)["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    state.fail_next.append(("status", 429, "slow down", {"retry-after": "7"}))
    limited = rejected(client)
    assert isinstance(limited, anthropic.RateLimitError) and limited.response.headers["retry-after"] == "7"
    assert client.messages.create(model="m", max_tokens=8, messages=USER).content  # faults are consumed


def test_error_event_in_a_200_stream(client: anthropic.Anthropic, state: FakeAnthropicState, url: str) -> None:
    state.fail_next.append(("stream_error", "overloaded_error", "Overloaded"))
    state.script.append(reply("never sent", tool_use("t", {})))
    raw = httpx.post(url + "/v1/messages", json={"model": "m", "max_tokens": 8, "stream": True, "messages": USER}, headers=HEADERS)
    assert raw.status_code == 200
    assert raw.text.endswith('event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n')
    assert "content_block_start" not in raw.text and raw.text.startswith("event: message_start\n")
    state.fail_next.append(("stream_error", "overloaded_error", "Overloaded"))
    with pytest.raises(anthropic.APIStatusError) as caught:
        list(client.messages.create(model="m", max_tokens=8, messages=USER, stream=True))
    assert err(caught.value)["error"]["type"] == "overloaded_error"
