"""Where a summary cuts (proxy/defenses/cutoff.py): keep budget, pair safety, the last message."""

from __future__ import annotations

import pytest

from proxy.conversation.chat_codec import CHAT
from proxy.defenses.cutoff import last_user_turn, leading_system_count, tail_start
from tests.defenses.test_pairs import SYS, TOOL_RESULT, TOOL_USE, USER, asst, tool


@pytest.mark.parametrize(
    ("messages", "counts", "keep_tokens", "expected"),
    [
        # everything fits the keep budget: the tail starts at lo, nothing to summarize
        ([SYS, USER, asst("a"), tool("a")], [5, 5, 5, 5], 100, 1),
        # budget for the last pair only
        ([SYS, USER, asst("a"), tool("a"), asst("b"), tool("b")], [5, 5, 5, 5, 5, 5], 10, 4),
        # the last pair alone is over the budget: still kept whole (never split)
        ([SYS, USER, asst("a"), tool("a"), asst("b"), tool("b")], [5, 5, 5, 5, 5, 500], 10, 4),
        # parallel results (case 001): the cut moves before the calling assistant message
        ([SYS, USER, asst("a", "b", "c"), tool("a"), tool("b"), tool("c")], [5, 5, 5, 5, 5, 5], 6, 2),
        # Anthropic blocks (case 002): tool_use and tool_result stay together
        ([SYS, USER, USER, TOOL_USE, TOOL_RESULT], [5, 900, 5, 5, 5], 15, 2),
        ([SYS, USER, USER, TOOL_USE, TOOL_RESULT], [5, 900, 5, 5, 5], 9, 3),
        # keep 0 (forced, minimal tail): the last turn only
        ([SYS, USER, asst("a"), tool("a"), USER], [5, 5, 5, 5, 5], 0, 4),
    ],
)
def test_tail_start_by_tokens(messages, counts, keep_tokens, expected):
    assert tail_start(CHAT.items(messages), counts, 1, keep_tokens, None) == expected


@pytest.mark.parametrize(
    ("n_pairs", "keep_messages", "expected"),
    [(5, 6, 6), (5, 5, 6), (5, 3, 8), (5, 1, 10), (2, 6, 0)],
)
def test_tail_start_by_messages_is_pair_safe(n_pairs, keep_messages, expected):
    messages = [SYS, USER]
    for k in range(n_pairs):
        messages += [asst(f"c{k}"), tool(f"c{k}")]
    s = tail_start(CHAT.items(messages), [1] * len(messages), 1, None, keep_messages)
    assert s == expected
    assert messages[s]["role"] != "tool"


def test_last_user_turn_skips_tool_result_carriers():
    assert last_user_turn(CHAT.items([SYS, USER, TOOL_USE, TOOL_RESULT])) == 1
    assert last_user_turn(CHAT.items([SYS, asst("a"), tool("a")])) is None


def test_leading_system_count():
    assert leading_system_count(CHAT.items([SYS, {"role": "developer", "content": "d"}, USER, SYS])) == 2
    assert leading_system_count(CHAT.items([USER])) == 0


IPYTHON = {"role": "ipython", "content": "42"}
CODE = {"role": "assistant", "content": "<|python_tag|>print(6*7)"}  # Llama's built-in code tool


@pytest.mark.parametrize(
    ("messages", "counts", "keep_tokens", "expected"),
    [
        # the budget holds the ipython answer only: the tail starts at the call that it answers
        ([SYS, USER, CODE, IPYTHON], [5, 5, 5, 5], 6, 2),
        ([SYS, USER, asst("a"), IPYTHON, USER], [5, 5, 5, 5, 5], 10, 4),  # the pair does not fit: not half of it
        # forced minimal tail ending in an unknown role: kept with its neighbour
        ([SYS, USER, CODE, IPYTHON], [5, 5, 5, 5], 0, 2),
    ],
)
def test_tail_never_starts_at_an_unknown_role(messages, counts, keep_tokens, expected):
    assert tail_start(CHAT.items(messages), counts, 1, keep_tokens, None) == expected


def test_tail_by_messages_never_starts_at_an_unknown_role():
    messages = [SYS, USER, CODE, IPYTHON, USER, CODE, IPYTHON, CODE, IPYTHON]
    for keep in range(1, len(messages)):
        s = tail_start(CHAT.items(messages), [1] * len(messages), 1, None, keep)
        assert messages[s]["role"] != "ipython", keep


def test_an_unknown_role_after_the_system_messages_stays_with_them():
    assert leading_system_count(CHAT.items([SYS, {"role": "wizard", "content": "w"}, USER])) == 2
    assert leading_system_count(CHAT.items([SYS, {"role": ["x"]}, {"role": "developer", "content": "d"}, IPYTHON, USER])) == 4
    assert leading_system_count(CHAT.items([IPYTHON, SYS, USER])) == 0  # nothing before it to stay with
