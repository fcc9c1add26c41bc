"""The Messages codec (proxy/conversation/messages_codec.py), and the unchanged defenses planning
over a Messages conversation (issue 18, item 1: Messages fits without changing the defenses)."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from proxy.conversation.canonical import digests_and_chain
from proxy.conversation.messages_codec import MESSAGES
from proxy.conversation.model import (
    ASSISTANT,
    CANCELLED_TEXT,
    OPAQUE_PART,
    RESULTS,
    SYSTEM,
    TOOL_CALL,
    TOOL_RESULT,
    USER,
    Conversation,
)
from proxy.defenses.config import DefenseConfig
from proxy.defenses.pairs import dangling_calls
from proxy.defenses.plans import SummaryPlan, TruncatePlan
from proxy.projection import Projection, ProjectionMemos, project
from proxy.tokens.counter import TokenCounter
from tests.defenses.helpers import fabricate_event

THINKING = {"type": "thinking", "thinking": "Let me look at the file first.", "signature": "c2lnbmVk"}


def _use(cid: str, name: str = "read_file", **inp: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": cid, "name": name, "input": inp or {"path": "a.py"}}


def _result(cid: str, text: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": cid, "content": text, "cache_control": {"type": "ephemeral"}}


def _body(turns: int = 6) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug in the parser, step by step."}]
    for k in range(turns):
        messages.append({"role": "assistant", "content": [THINKING | {"thinking": f"step {k}"}, _use(f"t{k}")]})
        messages.append({"role": "user", "content": [_result(f"t{k}", f"line {k}\n" * 400)]})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Done with step {k}."}]})
        messages.append({"role": "user", "content": f"Go on with step {k + 1}."})
    messages.append({"role": "assistant", "content": [THINKING, _use("last")]})  # an agent mid-step
    messages.append({"role": "user", "content": [_result("last", "small")]})
    return {"model": "claude-sonnet-4", "max_tokens": 1024, "x_vendor": True,
            "system": [{"type": "text", "text": "You are a careful engineer.", "cache_control": {"type": "ephemeral"}}],
            "messages": messages}


def _conversation(body: dict[str, Any]) -> Conversation:
    pieces = MESSAGES.pieces(body)
    digests, chain = digests_and_chain(pieces)
    return MESSAGES.parse(body, orjson.dumps(body), digests, chain)


def _project(conv: Conversation, counter: TokenCounter, cfg: DefenseConfig, events: list[Any],
             memos: ProjectionMemos, **kw: Any) -> Projection:
    return project(conv.pieces, digests=conv.digests, chain_hashes=conv.chain, events=events, config=cfg,
                   counter=counter, session_id="s1", memos=memos, codec=MESSAGES,
                   reserved_output_tokens=1024, **kw)


def _valid_pairs(messages: list[dict[str, Any]]) -> None:
    """Every tool_result block answers a tool_use block of the assistant turn right before it."""
    for i, m in enumerate(messages):
        blocks = m["content"] if isinstance(m.get("content"), list) else []
        for b in blocks:
            if b.get("type") == "tool_result":
                before = messages[i - 1]
                assert before["role"] == "assistant", (i, messages)
                assert b["tool_use_id"] in [u["id"] for u in before["content"] if u.get("type") == "tool_use"]


def test_parse_gives_items_with_the_messages_rules(counter: TokenCounter) -> None:
    body = _body(1)
    conv = _conversation(body)
    assert conv.pieces[0] == {"role": "system", "content": body["system"]}
    assert all(a is b for a, b in zip(conv.pieces[1:], body["messages"], strict=True))
    assert [i.kind for i in conv.items] == [SYSTEM, USER, ASSISTANT, RESULTS, ASSISTANT, USER, ASSISTANT, RESULTS]
    thinking_turn, results_turn = conv.items[2], conv.items[3]
    assert thinking_turn.sealed and thinking_turn.calls == ("t0",) and not conv.items[4].sealed
    assert results_turn.answers == ("t0",) and results_turn.is_answer
    parts = MESSAGES.parts(conv.pieces[2], counter)
    assert [p.kind for p in parts] == [OPAQUE_PART, TOOL_CALL] and parts[1].call_id == "t0"
    (result,) = MESSAGES.parts(conv.pieces[3], counter)
    assert result.kind == TOOL_RESULT and result.native is body["messages"][2]["content"][0]
    assert dangling_calls(conv.items) == []


def test_the_defenses_plan_and_apply_over_a_messages_conversation(counter: TokenCounter) -> None:
    body = _body(6)
    conv = _conversation(body)
    memos = ProjectionMemos()
    untouched = _project(conv, counter, DefenseConfig(context_window_tokens=1_000_000), [], memos)
    assert untouched.messages is conv.pieces and MESSAGES.apply(conv.body, conv.raw, untouched.messages) == (conv.raw, None)

    cfg = DefenseConfig(context_window_tokens=int(untouched.tokens_client / 0.85 * 0.9))
    # over the trigger, under the window, mid-cycle: the cycle's signed turn was made over this
    # prefix, so nothing before it is rewritten until the cycle ends
    held = _project(conv, counter, cfg, [], memos)
    assert held.plan is None and held.messages is conv.pieces
    # the request at the cycle's boundary (it ended with "Go on with step 6.") plans the summary
    boundary = _conversation({**body, "messages": body["messages"][:-2]})
    assert boundary.chain == conv.chain[:-2]
    first = _project(boundary, counter, cfg, [], memos)
    plan = first.plan
    assert isinstance(plan, SummaryPlan) and plan.first_index == 1  # the system piece stays first
    tail = conv.items[plan.cutoff_index + 1]
    assert tail.kind in (USER, ASSISTANT), tail  # the cut never separates a tool_result turn from its call
    # a tail long enough to keep earlier signed turns (a third of the window)
    keep = dataclasses.replace(cfg, keep_fraction=0.35)
    plan = _project(boundary, counter, keep, [], ProjectionMemos()).plan
    assert isinstance(plan, SummaryPlan)
    event = fabricate_event(plan)
    # planned by the request that ended with "Go on with step 6.": the last cycle was made after it
    planned_at = len(conv.pieces) - 3
    assert conv.pieces[planned_at]["content"] == "Go on with step 6."
    event.payload["planned_at_hash"] = conv.chain[planned_at]
    second = _project(conv, counter, keep, [event], memos)
    assert second.plan is None and "summary" in second.applied and second.fits
    assert second.tokens_forwarded < untouched.tokens_client
    sent, forwarded = MESSAGES.apply(conv.body, conv.raw, second.messages)
    assert forwarded is not None and orjson.loads(sent) == forwarded
    assert list(forwarded) == list(body)  # every field kept, in order; system back at the top level
    assert forwarded["system"] == body["system"] and forwarded["x_vendor"] is True
    out = forwarded["messages"]
    assert out[0]["role"] == "user" and "[context-proxy]" in out[0]["content"]
    _valid_pairs(out)
    signed = [m for m in out if m.get("role") == "assistant" and any(b.get("type") == "thinking" for b in m["content"])]
    # the turn made after the event keeps its thinking, forwarded as the client sent it
    assert signed == [body["messages"][-2]] and signed[0] is body["messages"][-2]
    # those made before it, whose prefix the summary changed, are forwarded without their thinking
    # (the API binds it to the conversation before it), their tool calls unchanged
    earlier = [m for m in out[1:-2] if m.get("role") == "assistant" and any(b.get("type") == "tool_use"
                                                                               for b in m["content"])]
    assert earlier and all([b["type"] for b in m["content"]] == ["tool_use"] for m in earlier)
    assert "unsign" in second.applied


def test_without_a_planned_at_hash_every_kept_thinking_is_left_out_and_a_thinking_only_turn_says_so(
        counter: TokenCounter) -> None:
    body = _body(6)
    body["messages"][-4] = {"role": "assistant", "content": [THINKING | {"thinking": "only this"}]}
    conv = _conversation(body)
    memos = ProjectionMemos()
    untouched = _project(conv, counter, DefenseConfig(context_window_tokens=1_000_000), [], memos)
    cfg = DefenseConfig(context_window_tokens=int(untouched.tokens_client / 0.85 * 0.9))
    boundary = _conversation({**body, "messages": body["messages"][:-2]})  # planned at the cycle's boundary
    plan = _project(boundary, counter, cfg, [], memos).plan
    assert isinstance(plan, SummaryPlan)
    out = _project(conv, counter, cfg, [fabricate_event(plan)], memos).messages
    blocks = [b for m in out if isinstance(m.get("content"), list) for b in m["content"]]
    assert not [b for b in blocks if b.get("type") == "thinking"]
    assert {"type": "text", "text": "[context-proxy] (this turn's thinking was left out)"} in blocks
    assert all(b.get("text") != "" for b in blocks if b.get("type") == "text")


def test_parallel_results_in_consecutive_user_turns_answer_their_calls() -> None:
    """The API merges consecutive user turns, so results that come one turn each answer the calls:
    no synthetic "cancelled" answer contradicts the client's own (found by breaking the route)."""
    body = {"model": "claude", "max_tokens": 10, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [_use("t1"), _use("t2")]},
        {"role": "user", "content": [_result("t1", "one")]},
        {"role": "user", "content": [_result("t2", "two")]},
        {"role": "user", "content": "and then?"},
    ]}
    assert dangling_calls(_conversation(body).items) == []
    body["messages"][3] = {"role": "user", "content": "no second result"}
    assert dangling_calls(_conversation(body).items) == [(2, ["t2"])]  # inside the first results turn


def test_a_dangling_tool_use_is_answered_inside_the_next_user_turn(counter: TokenCounter) -> None:
    body = {"model": "claude", "max_tokens": 10, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [_use("t1"), _use("t2")]},
        {"role": "user", "content": [_result("t1", "ok"), {"type": "text", "text": "and then?"}]},
    ]}
    conv = _conversation(body)
    assert dangling_calls(conv.items) == [(2, ["t2"])]
    p = _project(conv, counter, DefenseConfig(context_window_tokens=100_000, patch_dangling_tool_calls="always"),
                 [], ProjectionMemos())
    assert p.applied == ("patch_dangling",)
    patched = p.messages[2]["content"]
    assert patched[0] == {"type": "tool_result", "tool_use_id": "t2", "content": CANCELLED_TEXT, "is_error": True}
    assert patched[1:] == body["messages"][2]["content"] and len(p.messages) == 3
    _valid_pairs(p.messages)


def test_offload_keeps_a_tool_result_blocks_id_and_cache_control(counter: TokenCounter) -> None:
    big = "x = 1  # a long generated file\n" * 6000
    body = {"model": "claude", "max_tokens": 10, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [_use("t1")]},
        {"role": "user", "content": [_result("t1", big)]},
    ]}
    conv = _conversation(body)
    p = _project(conv, counter, DefenseConfig(context_window_tokens=128_000), [], ProjectionMemos())
    assert "offload" in p.applied and p.artifacts[0].content == big
    (block,) = p.messages[2]["content"]
    assert block["tool_use_id"] == "t1" and block["cache_control"] == {"type": "ephemeral"}
    assert block["content"].startswith("[context-proxy]")


def test_a_sealed_turn_is_never_rewritten_and_an_unsealed_one_is(counter: TokenCounter) -> None:
    """Old ``write_file`` arguments are truncated (an event up to the last turn), except in a turn
    with a signed thinking block: Anthropic checks those turns, so they go whole or not at all."""
    big = {"path": "a.py", "content": "print('x')\n" * 400}
    body = {"model": "claude", "max_tokens": 10, "messages": [
        {"role": "user", "content": "write two files"},
        {"role": "assistant", "content": [THINKING, _use("w1", "write_file", **big)]},
        {"role": "user", "content": [_result("w1", "written")]},
        {"role": "assistant", "content": [_use("w2", "write_file", **big)]},
        {"role": "user", "content": [_result("w2", "written")]},
        {"role": "user", "content": "thanks"},
    ]}
    conv = _conversation(body)
    event = fabricate_event(TruncatePlan(conv.chain[3], 0, 0))
    p = _project(conv, counter, DefenseConfig(context_window_tokens=1_000_000), [event], ProjectionMemos())
    assert p.applied == ("truncate_args",)
    assert p.messages[1] is body["messages"][1]  # sealed: the client's own turn
    assert p.messages[3]["content"][0]["input"]["content"].endswith("...(argument truncated)")
    assert p.messages[3]["content"][0]["id"] == "w2"


def test_the_hash_view_ignores_breakpoints_nulls_and_string_versus_block() -> None:
    from proxy.conversation.canonical import message_digest
    from proxy.conversation.messages_codec import hash_view

    sent = {"role": "user", "content": "Weather?"}
    marked = {"role": "user", "content": [{"type": "text", "text": "Weather?", "cache_control": {"type": "ephemeral"}}]}
    echoed = {"role": "user", "content": [{"type": "text", "text": "Weather?", "citations": None}]}
    assert len({message_digest(hash_view(m)) for m in (sent, marked, echoed)}) == 1
    other = {"role": "user", "content": [{"type": "text", "text": "Weather!"}]}
    assert message_digest(hash_view(other)) != message_digest(hash_view(sent))
    plain = {"role": "assistant", "content": [{"type": "thinking", "thinking": "", "signature": "sig"}]}
    assert hash_view(plain) is plain  # nothing left out: no copy
    assert marked["content"][0]["cache_control"] == {"type": "ephemeral"}  # the piece itself is never changed


def test_the_hash_view_ignores_nested_nulls_and_whole_floats() -> None:
    from proxy.conversation.canonical import message_digest
    from proxy.conversation.messages_codec import hash_view

    sent = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "n", "input": {"x": 1.0, "y": [2.5, 3.0]}},
        {"type": "web_search_tool_result", "tool_use_id": "s", "content": [{"type": "web_search_result", "url": "u"}]}]}
    echoed = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "n", "input": {"x": 1, "y": [2.5, 3]}, "caller": None},
        {"type": "web_search_tool_result", "tool_use_id": "s",
         "content": [{"type": "web_search_result", "url": "u", "page_age": None}]}]}
    assert message_digest(hash_view(sent)) == message_digest(hash_view(echoed))
    assert message_digest(hash_view({"role": "user", "content": [{"type": "text", "text": "1.5"}]})) != \
        message_digest(hash_view({"role": "user", "content": [{"type": "text", "text": "1"}]}))


def test_the_digest_memo_gives_the_hash_views_the_same_values_and_reuses_them() -> None:
    """The Messages pipeline hashes through the chat pipeline's ``DigestMemo``: a turn's history is
    mostly the last one's, freshly parsed (equal, not identical) and freshly viewed."""
    from proxy.conversation.canonical import digests_and_chain
    from proxy.conversation.digest_memo import DigestMemo
    from proxy.conversation.messages_codec import MESSAGES, hash_view

    def body(turns: int) -> Any:
        messages: list[Any] = []
        for i in range(turns):
            messages += [{"role": "user", "content": f"question {i}"},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "n",
                                                            "input": {"n": i, "x": 1.0}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "ok",
                                                       "cache_control": {"type": "ephemeral"}}]}]
        return {"system": [{"type": "text", "text": "sys"}], "messages": messages}

    memo = DigestMemo()
    for turns in (3, 4, 5):
        views = [hash_view(p) for p in MESSAGES.pieces(orjson.loads(orjson.dumps(body(turns))))]
        assert memo.digests_and_chain(views) == digests_and_chain(views)
    assert memo.reused > 0


def _reference_hash_value(value: Any) -> Any:
    """``messages_codec._hash_value`` as it was written first (no shortcut), the reference."""
    if isinstance(value, dict):
        out = {k: _reference_hash_value(v) for k, v in value.items() if v is not None}
        return value if len(out) == len(value) and all(out[k] is value[k] for k in out) else out
    if isinstance(value, list):
        items = [_reference_hash_value(v) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def test_the_hash_views_shortcut_for_blocks_of_plain_leaves_is_taken_and_agrees(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A block of only string, int and bool values is kept without looking into them (one call);
    the shortcut and the full walk give equal values, the same object when nothing changes."""
    import random

    from proxy.conversation import messages_codec

    leaves: list[Any] = ["a", "", 0, 7, -3, True, False, None, 1.0, 2.5, -0.0, 2.0**60, [], {}]
    rng = random.Random(21)

    def value(depth: int) -> Any:
        if depth == 0 or rng.random() < 0.4:
            return rng.choice(leaves)
        if rng.random() < 0.5:
            return [value(depth - 1) for _ in range(rng.randrange(4))]
        return {f"k{i}": value(depth - 1) for i in range(rng.randrange(4))}

    for _ in range(3000):
        v = value(4)
        got, want = messages_codec._hash_value(v), _reference_hash_value(v)
        assert got == want and type(got) is type(want)
        assert (got is v) == (want is v)
        piece = {"role": "assistant", "content": [v, {"type": "text", "text": "t", "cache_control": {"x": 1}}]}
        assert messages_codec.hash_view(piece) == {**piece, "content": [want, {"type": "text", "text": "t"}]}

    calls: list[Any] = []
    walk = messages_codec._hash_value

    def counted(v: Any) -> Any:
        calls.append(v)
        return walk(v)

    monkeypatch.setattr(messages_codec, "_hash_value", counted)
    block = {"type": "text", "text": "Hello", "index": 0, "cited": False}
    reply = {"role": "assistant", "content": [block]}
    assert messages_codec.hash_view(reply) is reply and calls == [block]  # the shortcut: no value looked into
    calls.clear()
    nulled = {"type": "text", "text": "Hello", "citations": None}
    assert messages_codec.hash_view({"role": "assistant", "content": [nulled]})["content"] == [
        {"type": "text", "text": "Hello"}]
    assert len(calls) == 3  # the full walk: the block and its two kept values
