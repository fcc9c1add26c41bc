"""``proxy.compaction.summarizer``: chunked folding, overflow halving, the summary call's body."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.compaction.apis import (
    messages_prompt_usage,
    messages_reply_text,
    messages_summary_body,
    summary_request_body,
)
from proxy.compaction.summarizer import (
    SUMMARY_ATTEMPTS,
    Summarizer,
    SummaryFailed,
    SummaryOverflow,
)
from proxy.conversation.chat_codec import CHAT
from proxy.defenses.plans import SummaryPlan
from proxy.settings import Settings
from proxy.tokens.counter import TokenCounter, load_counter
from tests.conftest import SHARED_DIR


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return load_counter(str(SHARED_DIR / "tiktoken"))


def plan_of(messages: list[dict[str, Any]], previous: str | None = None) -> SummaryPlan:
    return SummaryPlan(anchor_hash="h", first_hash="f", first_index=1, cutoff_index=len(messages),
                       previous_summary=previous, previous_event_id=None, to_summarize=messages,
                       tokens_before=10_000, tokens_after_estimate=1000)


MESSAGES = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "some words " * 150}
            for i in range(40)]


class Model:
    """Records (previous, chunk size, reply budget); overflows its first ``overflows`` calls."""

    def __init__(self, overflows: int = 0, limit: int | None = None) -> None:
        self.overflows, self.limit = overflows, limit
        self.calls: list[tuple[str | None, int, int]] = []

    async def summarize(self, previous: str | None, chunk: list[dict[str, Any]], reply_tokens: int) -> str:
        self.calls.append((previous, len(chunk), reply_tokens))
        if self.overflows:
            self.overflows -= 1
            raise SummaryOverflow(self.limit)
        return f"S{len(self.calls)}"


def test_the_reply_budget_is_the_setting_at_most_a_quarter_of_the_window(counter: TokenCounter) -> None:
    s = Summarizer(Settings(summary_max_tokens=2048), counter, CHAT)
    assert s.reply_tokens(128_000) == 2048
    assert s.reply_tokens(4096) == 1024
    assert s.reply_tokens(100) == 64


async def test_chunks_are_folded_into_the_running_summary_in_order(counter: TokenCounter) -> None:
    model = Model()
    text = await Summarizer(Settings(), counter, CHAT).fold(plan_of(MESSAGES, "S0"), 4096, model, off_loop=False)
    assert len(model.calls) > 1, "the transcript does not fit one 4k call"
    assert [c[0] for c in model.calls] == ["S0", *(f"S{i}" for i in range(1, len(model.calls)))]
    assert sum(c[1] for c in model.calls) == len(MESSAGES)
    assert text == f"S{len(model.calls)}"


async def test_an_overflowing_call_halves_the_chunks_and_believes_a_smaller_stated_window(counter: TokenCounter) -> None:
    s = Summarizer(Settings(), counter, CHAT)
    plain = Model()
    await s.fold(plan_of(MESSAGES), 8192, plain, off_loop=False)
    model = Model(overflows=1, limit=4096)
    await s.fold(plan_of(MESSAGES), 8192, model, off_loop=False)
    retried = model.calls[1:]
    assert len(retried) > len(plain.calls), "smaller chunks after the overflow"
    # the reply budget stays the one of the first window (as before the split)
    assert {c[2] for c in model.calls} == {s.reply_tokens(8192)}


async def test_three_overflows_give_up(counter: TokenCounter) -> None:
    model = Model(overflows=SUMMARY_ATTEMPTS)
    with pytest.raises(SummaryFailed):
        await Summarizer(Settings(), counter, CHAT).fold(plan_of(MESSAGES[:2]), 8192, model, off_loop=False)
    assert len(model.calls) == SUMMARY_ATTEMPTS


async def test_off_loop_splits_the_same_chunks(counter: TokenCounter) -> None:
    s = Summarizer(Settings(), counter, CHAT)
    on, off = Model(), Model()
    assert await s.fold(plan_of(MESSAGES), 4096, on, off_loop=False) == await s.fold(plan_of(MESSAGES), 4096, off,
                                                                                     off_loop=True)
    assert on.calls == off.calls


def test_the_summary_call_uses_the_clients_token_limit_field_and_never_streams() -> None:
    assert summary_request_body("m", {"max_completion_tokens": 5, "stream": True}, None, "t", 300) == {
        "model": "m", "messages": summary_request_body("m", {}, None, "t", 300)["messages"],
        "max_completion_tokens": 300}
    assert summary_request_body("m", {"max_tokens": 5}, "prev", "t", 300)["max_tokens"] == 300
    plain = summary_request_body("m", {"stream": True, "stream_options": {}}, None, "t", 300)
    assert set(plain) == {"model", "messages"}


def test_the_messages_summary_call_is_one_user_turn_with_max_tokens_and_nothing_else_of_the_clients() -> None:
    client = {"model": "claude-x", "max_tokens": 32000, "stream": True, "system": "You are Claude Code",
              "thinking": {"type": "adaptive"}, "tools": [{"name": "Bash", "input_schema": {}}],
              "metadata": {"user_id": "u"}}
    body = messages_summary_body("claude-x", client, "prev", "### user\nhi", 300)
    assert set(body) == {"model", "max_tokens", "messages"}
    assert body["max_tokens"] == 300
    [turn] = body["messages"]
    assert turn["role"] == "user" and "summarize the conversation" in turn["content"] and "prev" in turn["content"]


def test_a_messages_summary_reply_is_read_from_its_text_blocks() -> None:
    data = b'{"type":"message","content":[{"type":"thinking","thinking":"t","signature":"s"},' \
           b'{"type":"text","text":"## Session intent"},{"type":"text","text":"FACT: a=1"}]}'
    assert messages_reply_text(data) == "## Session intent\nFACT: a=1"


def test_a_messages_usage_states_the_whole_prompt_with_its_cached_parts() -> None:
    usage = {"input_tokens": 10, "cache_creation_input_tokens": 200, "cache_read_input_tokens": 3000,
             "output_tokens": 5}
    assert messages_prompt_usage(usage) == {"prompt_tokens": 3210}
    assert messages_prompt_usage({"input_tokens": 7}) == {"prompt_tokens": 7}
    assert messages_prompt_usage({"output_tokens": 7}) is None
    assert messages_prompt_usage(None) is None


def test_claude_codes_own_compaction_request_is_recognized_by_its_ask_or_its_system() -> None:
    from proxy.compaction.apis import MAX_MATCHED_CHARS, messages_client_compaction

    ask = "Your task is to create a DETAILED Summary of the Conversation so far, paying close attention to..."
    system = "You are a helpful AI assistant tasked with summarizing conversations."
    user: Any = {"role": "user", "content": ask}
    blocks: Any = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Please: " + ask}]}
    assert messages_client_compaction({"messages": [user]})
    assert messages_client_compaction({"messages": [blocks]})
    assert messages_client_compaction({"system": system, "messages": [{"role": "user", "content": "hi"}]})
    assert messages_client_compaction({"system": [{"type": "text", "text": system.upper()}], "messages": []})
    assert not messages_client_compaction({"messages": [{"role": "assistant", "content": ask}]})  # not a user turn
    assert not messages_client_compaction({"messages": [{"role": "user", "content": "a summary of the code"}]})
    assert not messages_client_compaction({"messages": [{"role": "user", "content": "x" * MAX_MATCHED_CHARS + ask}]})
    assert not messages_client_compaction({"messages": "odd", "system": 3})
