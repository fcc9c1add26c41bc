"""Overflow clipping (proxy/defenses/overflow_clip.py): oversized trailing results, never deleted (case 022)."""

from __future__ import annotations

import pytest

from proxy.conversation.chat_codec import CHAT
from proxy.defenses.config import DefenseConfig
from proxy.defenses.overflow_clip import (
    CLIP_MIN_TOKENS,
    clip_trailing_results,
    trailing_batch,
)
from tests.defenses.test_pairs import SYS, TOOL_RESULT, TOOL_USE, USER, asst, tool
from tests.strict import validate_chat_messages

DIFF_1 = "FACT: timeout_module=net\n" + "+    retries = 3  # unchanged context line\n" * 200
DIFF_2 = "+    pool_size = 10  # unchanged context line\n" * 200


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([SYS, USER, asst("a", "b"), tool("a"), tool("b")], range(3, 5)),
        ([SYS, USER, asst("a"), tool("a"), USER], range(5, 5)),
        ([USER, TOOL_USE, TOOL_RESULT], range(2, 3)),
    ],
)
def test_trailing_batch(messages, expected):
    assert trailing_batch(CHAT.items(messages)) == expected


def test_clip_offloads_oversized_trailing_results_in_place(counter):
    messages = [SYS, USER, asst("call_d1", "call_d2"), tool("call_d1", DIFF_1), tool("call_d2", DIFF_2), ]
    counts = [counter.bind(CHAT).count_message(m) for m in messages]
    cfg = DefenseConfig(context_window_tokens=128_000)  # offload threshold 20,000: only clipping applies
    out, clipped, artifacts = clip_trailing_results(messages, CHAT.items(messages), counts, cfg, counter.count_text, frozenset(), CHAT)
    assert clipped == [3, 4] and len(artifacts) == 2
    assert [m.get("tool_call_id") for m in out[3:]] == ["call_d1", "call_d2"]  # never deleted
    assert "FACT: timeout_module=net" in out[3]["content"]
    assert out[:3] == messages[:3] and all(a is b for a, b in zip(out[:3], messages[:3], strict=True))
    assert validate_chat_messages(out) == []
    assert sum(counter.bind(CHAT).count_message(m) for m in out) < sum(counts) / 3


def test_clip_leaves_small_results_and_non_trailing_ones(counter):
    small = [SYS, USER, asst("a"), tool("a", "ok")]
    counts = [counter.bind(CHAT).count_message(m) for m in small]
    assert counts[-1] <= CLIP_MIN_TOKENS
    assert clip_trailing_results(small, CHAT.items(small), counts, DefenseConfig(context_window_tokens=None), counter.count_text, frozenset(), CHAT)[0] is None
    ends_with_user = [SYS, USER, asst("a"), tool("a", DIFF_1), USER]
    counts = [counter.bind(CHAT).count_message(m) for m in ends_with_user]
    assert clip_trailing_results(ends_with_user, CHAT.items(ends_with_user), counts, DefenseConfig(context_window_tokens=None), counter.count_text, frozenset(), CHAT)[0] is None
