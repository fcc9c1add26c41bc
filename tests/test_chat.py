"""Canonical form and chain hashes (proxy/chat.py): what SDK echoes may change must not change the hash."""

from __future__ import annotations

import copy

import pytest

from proxy.chat import canonical, chain_hash, digests_and_chain, message_digest, text_of

REPLY = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}


@pytest.mark.parametrize("echo", [
    {**REPLY, "refusal": None, "annotations": [], "audio": None, "function_call": None},
    {k: v for k, v in REPLY.items() if k != "content"},
    {**REPLY, "content": ""},
    {**REPLY, "tool_calls": [{**REPLY["tool_calls"][0], "index": 0}]},
])
def test_sdk_echo_hashes_like_the_logged_reply(echo: dict) -> None:
    assert message_digest(echo) == message_digest(REPLY)


@pytest.mark.parametrize("other", [
    {**REPLY, "content": "text"},
    {**REPLY, "tool_calls": [{**REPLY["tool_calls"][0], "id": "c2"}]},
    {"role": "user", "content": None},
    {"role": "user", "content": ""},
])
def test_real_differences_change_the_hash(other: dict) -> None:
    assert message_digest(other) != message_digest(REPLY)


def test_user_empty_content_is_not_dropped() -> None:
    assert canonical({"role": "user", "content": ""}) == {"role": "user", "content": ""}


def test_canonical_never_mutates_and_reuses_canonical_input() -> None:
    message = {"role": "user", "content": "hi"}
    assert canonical(message) is message
    echo = {**REPLY, "refusal": None, "tool_calls": [{**REPLY["tool_calls"][0], "index": 0}]}
    before = copy.deepcopy(echo)
    out = canonical(echo)
    assert echo == before and out is not echo and "index" not in out["tool_calls"][0]


def test_chain_hash_covers_the_whole_prefix() -> None:
    a, b = {"role": "user", "content": "a"}, {"role": "user", "content": "b"}
    d1, c1 = digests_and_chain([a, b])
    d2, c2 = digests_and_chain([b, b])
    assert d1[1] == d2[1] and c1[1] != c2[1]
    assert c1[1] == chain_hash(c1[0], d1[1])
    assert c1[0] == chain_hash(None, message_digest(a))


def test_text_of_content_forms() -> None:
    assert text_of(None) == ""
    assert text_of("x") == "x"
    assert text_of([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}, {"type": "tool_result", "content": "b"}]) == "a\nb"
