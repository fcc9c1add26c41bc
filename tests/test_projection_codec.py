"""The projection names no API (issue 18, F5): its caller gives the codec, and the codec reads the
pieces, a summary's pinned user turn included."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.conversation.canonical import digests_and_chain, text_of
from proxy.conversation.chat_codec import CHAT
from proxy.conversation.messages_codec import MESSAGES
from proxy.defenses.config import DefenseConfig
from proxy.defenses.media import offload_media
from proxy.defenses.offload import offload_message
from proxy.defenses.pairs import patch_dangling
from proxy.defenses.summarize import render_transcript, summary_chunks
from proxy.defenses.truncate_args import truncate_message
from proxy.projection import project
from proxy.tokens.counter import TokenCounter

USER_TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "plain"},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}},
                                 {"text": "untyped"}, {"type": "input_text", "text": "input"}]},
    {"role": "user", "content": None},
    {"role": "user"},
]


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter("o200k_base")  # exact or not: nothing here depends on the figures


def test_a_missing_codec_fails_loudly(counter: TokenCounter) -> None:
    messages = [{"role": "user", "content": "hi"}]
    digests, chain = digests_and_chain(messages)
    with pytest.raises(TypeError, match="codec"):
        project(messages, digests=digests, chain_hashes=chain, events=[],  # type: ignore[call-arg]
                config=DefenseConfig(context_window_tokens=None), counter=counter, session_id="s")
    cfg = DefenseConfig(context_window_tokens=None)
    calls: list[Any] = [
        lambda: truncate_message(messages[0], frozenset(), 1, 1),
        lambda: offload_message(messages[0], 1, counter.count_text, cfg),
        lambda: offload_media(messages[0]),
        lambda: patch_dangling(messages),
        lambda: render_transcript(messages),
        lambda: summary_chunks(messages, 100, counter),
    ]
    for call in calls:
        with pytest.raises(TypeError):
            call()


@pytest.mark.parametrize("turn", USER_TURNS)
def test_user_text_is_the_text_the_summary_pinned_before_the_codec(turn: dict[str, Any]) -> None:
    """``codec.user_text`` (what a summary pins of the user's latest turn) is, for chat and for
    Messages, ``text_of`` the content, as the projection read it before it went through the codec."""
    assert CHAT.user_text(turn) == text_of(turn.get("content"))
    assert MESSAGES.user_text(turn) == text_of(turn.get("content"))


def test_a_messages_turn_of_results_says_only_its_own_text() -> None:
    """A Messages turn carrying tool results says what its own text blocks say, not its results
    (a whole-cycle summary pins it verbatim: the results are in the summary)."""
    turn = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "a long log"},
                                        {"type": "text", "text": "QUESTION: why?"}]}
    assert MESSAGES.user_text(turn) == "QUESTION: why?"


def test_apply_takes_the_body_and_its_bytes() -> None:
    """``Codec.apply(body, raw, pieces, extra)``: the plan loop applies a projection without a
    ``Conversation``; equal pieces are the client's bytes, for Messages too (system at the top)."""
    body = {"model": "m", "system": "Be brief.", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}
    raw = b'{"model":"m","system":"Be brief.","messages":[{"role":"user","content":"hi"}],"max_tokens":9}'
    pieces = MESSAGES.pieces(body)
    assert MESSAGES.apply(body, raw, [dict(p) for p in pieces]) == (raw, None)
    sent, forwarded = MESSAGES.apply(body, raw, pieces, {"tools": []})
    assert forwarded is not None and list(forwarded) == ["model", "system", "messages", "max_tokens", "tools"]
    assert sent != raw and forwarded["system"] == "Be brief."
