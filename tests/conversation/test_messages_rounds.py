"""``proxy.conversation.messages_rounds``: what the client is shown of the proxy's own tool rounds on
Messages, and how its echo is forwarded after the rounds are put back."""

from __future__ import annotations

from typing import Any

from proxy.conversation.messages_rounds import after_rounds, merged, shown, split_uses

THINK: Any = {"type": "thinking", "thinking": "look it up", "signature": "sig"}
SAY: Any = {"type": "text", "text": "Let me look."}
OURS: Any = {"type": "tool_use", "id": "toolu_a", "name": "context_proxy_read", "input": {"query": "FACT f1"}}
RUN: Any = [{"role": "assistant", "content": [THINK, SAY, OURS]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": "FACT: f1=x"}]}]
ANSWER: Any = {"type": "text", "text": "ANSWER: f1=x"}


def test_the_client_is_shown_every_block_but_the_proxys_answered_calls() -> None:
    assert shown(RUN) == [THINK, SAY]
    assert merged(RUN, [ANSWER]) == [THINK, SAY, ANSWER]
    theirs: Any = {"type": "tool_use", "id": "toolu_b", "name": "read_file", "input": {}}
    assert split_uses([THINK, OURS, theirs], {"context_proxy_read"}) == ([OURS], 1)


def test_the_echo_loses_the_blocks_the_rounds_carry_and_anything_else_is_forwarded_as_it_came() -> None:
    echo = {"role": "assistant", "content": [THINK | {"extra": None}, SAY | {"citations": None}, ANSWER]}
    assert after_rounds(RUN, echo) == {"role": "assistant", "content": [ANSWER]}  # (as hash_view compares)
    edited = {"role": "assistant", "content": [SAY, ANSWER]}  # the client dropped the thinking
    assert after_rounds(RUN, edited) is edited
    only = {"role": "assistant", "content": [THINK, SAY]}  # nothing would be left: kept whole
    assert after_rounds(RUN, only) is only
    user = {"role": "user", "content": "next"}
    assert after_rounds(RUN, user) is user
