"""Canonical form and chain hashes (proxy/conversation/canonical.py): what SDK echoes may change must not change the hash."""

from __future__ import annotations

import copy

import pytest

from proxy.conversation.canonical import (
    canonical,
    chain_hash,
    digests_and_chain,
    message_digest,
    text_of,
)
from proxy.conversation.digest_memo import DigestMemo

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


# Digests and chain hashes are the stored log's identity: these values were computed before the
# memo existed (proxy/conversation/canonical.py at cd5c4d1) and must never change.
KNOWN = [
    ({"role": "system", "content": "You are terse."},
     "25baa00042f1fa72e4522f76c653aec97c5c7294a41e0d13b0bcf031c610f25a",
     "4ca627f790934b34358d6f62ebfb73ef6e89c48dccd884018a58131c42c9de11"),
    ({"role": "user", "content": "Résumé ✓ \"quoted\"\nline"},
     "8b241534aa2207a6c32d89fe864a3c0f59fbfb612c8caddd22bb06904886f523",
     "7d5310aa07c471799f23dfb13c5c67dcbefb865881295af74e5dbbe528266c42"),
    ({"role": "assistant", "content": None, "refusal": None, "tool_calls": [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "read", "arguments": "{\"path\": \"a.py\"}"}}]},
     "12c7867bb693d28284fb725240d590f2d11cb47611a8e9077f578847b86c4118",
     "bf6b3b489553b30f733590111c08d3d1f9384d097cf5ee91fb0a8d628bcbdf2c"),
    ({"role": "tool", "tool_call_id": "call_1", "content": "x = 1\n"},
     "c847b75c30b81a15a39165a68df4fe1e3600cd79862dcddf92ecd082672fe8b7",
     "05da0c28aad397d8717e041d6ab659025821f1f8795fe6c19dcccd33ddaa2e00"),
    ({"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}}]},
     "663ecba7e76245d07da5dcc2b1b3b4fe86dc72b97b8b83b084d4477c26cbee8a",
     "07efb8870514488fef5034183a1cbb77eef4c93f72352de0515d081772a87738"),
    ({"role": "assistant", "content": "", "annotations": [], "tool_calls": []},
     "cc2155ead0bb07d558f0d44350b6f5bd8da6aeab441cc41bc3b92e1fc5fef2ce",
     "b6ca782557261fd9e4266b5f2ca69d689c1846b40e9f58c81f1fec7b4af4b4b3"),
    ({"role": "assistant", "content": "n", "x_meta": {"n": 1, "f": 1.5, "b": True, "z": 0, "neg": -0.0}},
     "e105e8beb2dd4dc1708fdf6e54af4390142fe919dddc5f8396b92ad2a1c6b155",
     "3e2d4891b04c27f13fba5282b6f1164ec4c5a2c7c439e518b287c71e3f27de1a"),
]


def _direct(messages: list[dict]) -> tuple[list[str], list[str]]:
    """The definition: ``message_digest`` then ``chain_hash``, in order, with no memo."""
    digests = [message_digest(m) for m in messages]
    chain, parent = [], None
    for d in digests:
        parent = chain_hash(parent, d)
        chain.append(parent)
    return digests, chain


def test_known_digests_and_chain_hashes_cold_and_memoized() -> None:
    messages = [m for m, _, _ in KNOWN]
    expected = ([d for _, d, _ in KNOWN], [c for _, _, c in KNOWN])
    memo = DigestMemo()
    assert _direct(messages) == expected
    assert memo.digests_and_chain(messages) == expected
    assert memo.digests_and_chain(copy.deepcopy(messages)) == expected  # a resend: equal, new objects
    assert memo.reused > 0
    assert digests_and_chain(copy.deepcopy(messages)) == expected


def test_memo_reuses_a_resent_history_and_hashes_only_the_new_messages() -> None:
    memo = DigestMemo()
    history = [{"role": "user", "content": f"m{i}"} for i in range(50)]
    memo.digests_and_chain(history)
    assert (memo.hashed, memo.reused) == (50, 0)
    turn = copy.deepcopy(history) + [{"role": "assistant", "content": "a"}, {"role": "user", "content": "u"}]
    assert memo.digests_and_chain(turn) == _direct(turn)
    assert (memo.hashed, memo.reused) == (52, 50)


@pytest.mark.parametrize("edit", [
    lambda m: m[10].update(content="changed"),  # an edit in the middle: a new branch from there
    lambda m: m[10].update(content=m[10]["content"] + " "),
    lambda m: m.pop(10),  # a message removed
    lambda m: m.insert(10, {"role": "user", "content": "inserted"}),
    lambda m: m[10].update(x=1),  # a number: hashed, never reused
    lambda m: m[10].update(x=True),
    lambda m: m[10].update(content=None),
    lambda m: m[10].update(role="assistant", content=""),  # canonical drops it: same digest as absent
    lambda m: m.__setitem__(slice(0, 49), []),  # a shorter history
])
def test_memo_equals_the_definition_after_any_edit(edit) -> None:
    memo = DigestMemo()
    history = [{"role": "user" if i % 2 else "assistant", "content": f"m{i}"} for i in range(50)]
    history[5]["meta"] = {"n": 1}  # a number in the kept history
    memo.digests_and_chain(history)
    changed = copy.deepcopy(history)
    edit(changed)
    assert memo.digests_and_chain(changed) == _direct(changed)
    assert memo.digests_and_chain(copy.deepcopy(history)) == _direct(history)  # the old branch still right


@pytest.mark.parametrize("old, new", [
    (1, 1.0), (1, True), (0, False), (0.0, -0.0), (1.0, True),  # equal in Python, different JSON
])
def test_numbers_equal_in_python_but_not_in_json_are_never_confused(old, new) -> None:
    memo = DigestMemo()
    a = [{"role": "user", "content": "x", "v": old}, {"role": "user", "content": "y"}]
    b = [{"role": "user", "content": "x", "v": new}, {"role": "user", "content": "y"}]
    assert a == b  # what a naive memo would trust
    memo.digests_and_chain(a)
    assert memo.digests_and_chain(b) == _direct(b) != _direct(a)
    nested_a = [{"role": "user", "content": [{"type": "text", "text": "t", "w": old}]}]
    nested_b = [{"role": "user", "content": [{"type": "text", "text": "t", "w": new}]}]
    memo.digests_and_chain(nested_a)
    assert memo.digests_and_chain(nested_b) == _direct(nested_b) != _direct(nested_a)


def test_memo_keeps_two_conversations_with_one_system_prompt_apart() -> None:
    memo = DigestMemo()
    system = {"role": "system", "content": "shared"}
    a = [system, *({"role": "user", "content": f"a{i}"} for i in range(20))]
    b = [system, *({"role": "user", "content": f"b{i}"} for i in range(20))]
    for turn in range(3):
        for conv in (a, b):
            conv.append({"role": "user", "content": f"turn {turn}"})
            assert memo.digests_and_chain(copy.deepcopy(conv)) == _direct(conv)
    hashed = memo.hashed
    memo.digests_and_chain(copy.deepcopy(a))
    memo.digests_and_chain(copy.deepcopy(b))
    assert memo.hashed == hashed  # both resends fully reused


def test_memo_is_bounded_and_stays_correct_past_the_bound() -> None:
    memo = DigestMemo(max_bytes=2_000)
    convs = [[{"role": "user", "content": f"c{c} m{i} " + "x" * 50} for i in range(10)] for c in range(5)]
    for conv in convs:
        memo.digests_and_chain(conv)
    assert memo._bytes <= 2_000 and len(memo._runs) < 5
    for conv in convs:
        assert memo.digests_and_chain(copy.deepcopy(conv)) == _direct(conv)
    memo.clear()
    assert memo.digests_and_chain(convs[0]) == _direct(convs[0])


def test_memo_never_mutates_its_input_and_ignores_later_mutation_of_the_caller_list() -> None:
    memo = DigestMemo()
    history = [{"role": "user", "content": f"m{i}"} for i in range(5)]
    before = copy.deepcopy(history)
    memo.digests_and_chain(history)
    assert history == before
    history.append({"role": "user", "content": "appended by the caller"})
    assert memo.digests_and_chain(copy.deepcopy(before)) == _direct(before)
