"""Thinking signatures (``thinking.py``) and prompt-cache accounting (``cache.py``) through the SDK."""

from __future__ import annotations

import copy
from typing import Any

import anthropic
import pytest

from tests.fakes.anthropic import FakeAnthropicState, redacted_thinking, reply, text, thinking, tool_use

THINK: Any = {"type": "enabled", "budget_tokens": 1024}
TOOL: Any = {"name": "lookup", "description": "Look a word up", "input_schema": {"type": "object", "properties": {}}}
USER: Any = {"role": "user", "content": "Define ephemeral."}
CANNOT_MODIFY = ("`thinking` or `redacted_thinking` blocks in the latest assistant message cannot be modified. "
                 "These blocks must remain as they were in the original response.")



def err(exc: anthropic.APIStatusError) -> Any:
    """The parsed error body of an SDK exception."""
    return exc.body

def first_turn(client: anthropic.Anthropic, state: FakeAnthropicState, *blocks: Any, system: str = "Be exact.") -> Any:
    """A thinking + tool_use turn from the fake, and the conversation that answers it."""
    state.script.append(reply(*blocks, tool_use("lookup", {"word": "ephemeral"})))
    message: Any = client.messages.create(model="m", max_tokens=2048, thinking=THINK, tools=[TOOL], system=system, messages=[USER])
    assistant = {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]}
    call_id = message.content[-1].id
    return [USER, assistant, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "short-lived"}]}]


def send(client: anthropic.Anthropic, messages: Any, system: str = "Be exact.", **kwargs: Any) -> Any:
    return client.messages.create(model="m", max_tokens=2048, thinking=kwargs.pop("thinking", THINK), tools=[TOOL],
                                  system=system, messages=messages, **kwargs)


def test_thinking_blocks_round_trip_unchanged(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    history: Any = first_turn(client, state, thinking("I should look it up."), redacted_thinking())
    assert history[1]["content"][0]["signature"] and history[1]["content"][1]["data"]
    assert send(client, history).stop_reason == "end_turn"


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda c: c[0].update(thinking="I changed my mind."), "messages.1.content.0: " + CANNOT_MODIFY),
    (lambda c: c[1].update(data=c[1]["data"][:-4] + ("AAAA" if not c[1]["data"].endswith("AAAA") else "BBBB")), "messages.1.content.1: " + CANNOT_MODIFY),
    (lambda c: c[0].update(signature="not-a-signature"), "messages.1.content.0: Invalid `signature` in `thinking` block"),
], ids=["thinking text", "redacted data", "signature"])
def test_modified_thinking_is_rejected(client: anthropic.Anthropic, state: FakeAnthropicState, mutate: Any, expected: str) -> None:
    history: Any = first_turn(client, state, thinking("I should look it up."), redacted_thinking())
    changed = copy.deepcopy(history)
    mutate(changed[1]["content"])
    with pytest.raises(anthropic.BadRequestError) as caught:
        send(client, changed)
    assert err(caught.value)["error"]["message"] == expected


def test_signature_is_bound_to_the_conversation(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    history: Any = first_turn(client, state, thinking("I should look it up."))
    with pytest.raises(anthropic.BadRequestError) as caught:
        send(client, history, system="Be vague.")
    assert err(caught.value)["error"]["message"] == "messages.1.content.0: Invalid `signature` in `thinking` block"
    assert send(client, history, cache_control=None).content  # cache_control and the same system: still bound
    assert send(client, history, thinking={"type": "disabled"}, system="Be vague.").content  # not checked when off


def test_dropped_thinking_in_a_tool_loop_is_rejected(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    history: Any = first_turn(client, state, thinking("I should look it up."))
    history[1]["content"] = history[1]["content"][1:]
    with pytest.raises(anthropic.BadRequestError) as caught:
        send(client, history)
    assert err(caught.value)["error"]["message"].startswith(
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `tool_use`.")


def test_earlier_turns_may_drop_their_thinking(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    history: Any = first_turn(client, state, thinking("First thought."))
    state.script.append(reply(thinking("Second thought."), text("Done.")))
    second: Any = send(client, history)
    longer = [*history, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in second.content]},
              {"role": "user", "content": "Thanks, and 'transient'?"}]
    longer[1] = {"role": "assistant", "content": longer[1]["content"][1:]}  # earlier turn without its thinking
    assert send(client, longer).content


def test_an_earlier_turns_thinking_after_a_changed_prefix_is_rejected(client: anthropic.Anthropic,
                                                                       state: FakeAnthropicState) -> None:
    """A kept turn whose prefix changed (a compaction rewrote what came before it) may not keep its
    thinking, in any turn (the binding the API enforces: openclaw/openclaw#90108); left out, it passes."""
    history: Any = first_turn(client, state, thinking("First thought."))
    state.script.append(reply(thinking("Second thought."), text("Done.")))
    second: Any = send(client, history)
    longer = [*history, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in second.content]},
              {"role": "user", "content": "Thanks, and 'transient'?"}]
    longer[0] = {"role": "user", "content": "[summary] The user asked about 'ephemeral'."}  # the prefix rewritten
    with pytest.raises(anthropic.BadRequestError) as caught:
        send(client, longer)
    assert err(caught.value)["error"]["message"] == "messages.1.content.0: Invalid `signature` in `thinking` block"
    longer[1] = {"role": "assistant", "content": longer[1]["content"][1:]}
    longer[3] = {"role": "assistant", "content": longer[3]["content"][1:]}
    assert send(client, longer).content


def cached_request(client: anthropic.Anthropic, system_text: str, question: str, **kwargs: Any) -> Any:
    system: Any = [{"type": "text", "text": system_text, "cache_control": {"type": "ephemeral"}}]
    return client.messages.create(model="m", max_tokens=16, system=system, messages=[{"role": "user", "content": question}], **kwargs)


def test_prompt_cache_creation_then_read(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    manual = "You answer questions about the manual. " * 60
    first: Any = cached_request(client, manual, "Page one?").usage
    assert first.cache_read_input_tokens == 0 and first.cache_creation_input_tokens > 0
    second: Any = cached_request(client, manual, "Page two?").usage
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens and second.cache_creation_input_tokens == 0
    assert second.input_tokens + second.cache_read_input_tokens == first.input_tokens + first.cache_creation_input_tokens
    other: Any = cached_request(client, manual + "Extra.", "Page two?").usage
    assert other.cache_read_input_tokens == 0 and other.cache_creation_input_tokens > first.cache_creation_input_tokens
    elsewhere: Any = client.messages.create(model="other-model", max_tokens=16, messages=[{"role": "user", "content": "Page two?"}],
                                       system=[{"type": "text", "text": manual, "cache_control": {"type": "ephemeral"}}]).usage
    assert elsewhere.cache_read_input_tokens == 0  # entries are per model


def test_longest_prefix_and_automatic_caching(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    turn: Any = [{"role": "user", "content": [{"type": "text", "text": "Long document. " * 50, "cache_control": {"type": "ephemeral"}}]}]
    first: Any = client.messages.create(model="m", max_tokens=16, messages=turn).usage
    follow: Any = [*turn, {"role": "assistant", "content": "Read it."},
              {"role": "user", "content": [{"type": "text", "text": "Summarise.", "cache_control": {"type": "ephemeral"}}]}]
    usage: Any = client.messages.create(model="m", max_tokens=16, messages=follow).usage
    assert usage.cache_read_input_tokens == first.cache_creation_input_tokens > 0
    assert usage.cache_creation_input_tokens > 0 and usage.input_tokens > 0
    plain: Any = [{"role": "user", "content": "No marks here. " * 40}]
    auto: Any = client.messages.create(model="m", max_tokens=16, messages=plain, extra_body={"cache_control": {"type": "ephemeral"}}).usage
    again: Any = client.messages.create(model="m", max_tokens=16, messages=plain, extra_body={"cache_control": {"type": "ephemeral"}}).usage
    assert auto.cache_creation_input_tokens == again.cache_read_input_tokens > 0


def test_minimum_cacheable_prefix(client: anthropic.Anthropic, state: FakeAnthropicState) -> None:
    state.min_cacheable_tokens = 1024
    usage: Any = cached_request(client, "Short system prompt.", "Hi?").usage
    again: Any = cached_request(client, "Short system prompt.", "Hi?").usage
    assert (usage.cache_creation_input_tokens, again.cache_read_input_tokens) == (0, 0)
