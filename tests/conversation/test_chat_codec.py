"""The chat-completions codec (proxy/conversation/chat_codec.py): items, parts, parse and apply."""

from __future__ import annotations

import itertools
from typing import Any

import orjson

from proxy.conversation.canonical import digests_and_chain, is_known_role
from proxy.conversation.chat_codec import CHAT
from proxy.conversation.model import (
    ASSISTANT,
    BINDS_PREVIOUS,
    MEDIA,
    OPAQUE,
    RESULTS,
    SYSTEM,
    TEXT,
    TOOL,
    TOOL_CALL,
    TOOL_RESULT,
    USER,
)
from proxy.conversation.pricing import price_part, price_tool_call
from proxy.tokens.counter import TokenCounter


def _call(cid: Any, name: str = "write_file") -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": '{"path": "a"}'}}


RESULT_BLOCK = {"type": "tool_result", "tool_use_id": "tu1", "content": "r"}
ALPHABET: list[dict[str, Any]] = [
    {"role": "system", "content": "s"},
    {"role": "developer", "content": "d"},
    {"role": "user", "content": "u"},
    {"role": "user", "content": [{"type": "text", "text": "x"}, RESULT_BLOCK]},
    {"role": "assistant", "content": None, "tool_calls": [_call("a"), _call(7), "junk"]},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "tu1", "name": "w", "input": {}}]},
    {"role": "assistant", "content": [RESULT_BLOCK]},
    {"role": "assistant", "content": "plain", "tool_calls": []},
    {"role": "tool", "tool_call_id": "a", "content": "ok"},
    {"role": "tool", "content": "no id"},
    {"role": "function", "name": "f", "content": "x"},
    {"role": "ipython", "content": "42"},
    {"role": "ipython", "content": [RESULT_BLOCK]},
    {"role": ["tool"], "content": "listed"},
    {"content": "no role"},
    {"role": "system", "content": [RESULT_BLOCK]},
]


# The predicates the defenses used on chat dicts before the model (proxy/defenses/pairs.py and
# cutoff.py of the previous commit), as the oracle the chat items must agree with.
def _old_blocks(m: dict[str, Any]) -> bool:
    c = m.get("content")
    return isinstance(c, list) and any(isinstance(p, dict) and p.get("type") == "tool_result" for p in c)


def _old_answer_role(m: dict[str, Any]) -> bool:
    role = m.get("role")
    return role.__class__ is str and role in ("tool", "function")


def _old_call_ids(m: dict[str, Any]) -> list[str]:
    calls = m.get("tool_calls")
    if m.get("role") != "assistant" or not isinstance(calls, list):
        return []
    return [c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)]


def test_chat_items_agree_with_the_predicates_the_defenses_used_on_dicts() -> None:
    for m in ALPHABET:
        item = CHAT.item(m)
        assert item.is_answer == (_old_answer_role(m) or _old_blocks(m)), m
        assert (item.binds == BINDS_PREVIOUS) == (not is_known_role(m) or item.is_answer), m
        assert (item.kind == USER) == (m.get("role") == "user" and not _old_blocks(m)), m
        assert (item.kind == SYSTEM) == (m.get("role") in ("system", "developer")), m
        assert (item.kind == OPAQUE) == (not is_known_role(m)), m
        assert (item.kind == TOOL) == _old_answer_role(m), m
        assert list(item.calls) == _old_call_ids(m), m
        assert not item.sealed
    assert CHAT.item(ALPHABET[3]).kind == RESULTS and CHAT.item(ALPHABET[4]).kind == ASSISTANT
    assert CHAT.item(ALPHABET[8]).answers == ("a",) and CHAT.item(ALPHABET[3]).answers == ()


def test_dangling_calls_and_cuts_agree_with_the_dict_rules_on_every_short_history() -> None:
    """The old ``dangling_calls``/``group_start`` over dicts, against the model's over chat items."""
    from proxy.conversation.model import group_start
    from proxy.defenses.pairs import dangling_calls

    def old_dangling(messages: list[dict[str, Any]]) -> list[tuple[int, list[str]]]:
        out, i, n = [], 0, len(messages)
        while i < n:
            ids = _old_call_ids(messages[i])
            i += 1
            if not ids:
                continue
            pending, opaque = list(ids), False
            while i < n and (_old_answer_role(messages[i]) or not is_known_role(messages[i])):
                if _old_answer_role(messages[i]):
                    if messages[i].get("tool_call_id") in pending:
                        pending.remove(messages[i].get("tool_call_id"))
                else:
                    opaque = True
                i += 1
            if pending and not opaque:
                out.append((i, pending))
        return out

    def old_safe_start(messages: list[dict[str, Any]], start: int) -> int:
        while start > 0 and (not is_known_role(messages[start]) or _old_answer_role(messages[start])
                             or _old_blocks(messages[start])):
            start -= 1
        return start

    for n in range(1, 4):
        for combo in itertools.product(ALPHABET[2:], repeat=n):
            messages = [ALPHABET[0], *combo]
            items = CHAT.items(messages)
            assert dangling_calls(items) == old_dangling(messages), messages
            for s in range(len(messages)):
                assert group_start(items, s) == old_safe_start(messages, s)


def test_parse_keeps_the_native_pieces_themselves() -> None:
    body = {"model": "m", "messages": [ALPHABET[0], ALPHABET[2]]}
    raw = orjson.dumps(body)
    digests, chain = digests_and_chain(body["messages"])
    conv = CHAT.parse(body, raw, digests, chain)
    assert conv.pieces is body["messages"] and all(a is b for a, b in zip(conv.pieces, body["messages"], strict=True))
    assert [i.kind for i in conv.items] == [SYSTEM, USER]


def test_apply_forwards_the_clients_bytes_unless_a_piece_changed() -> None:
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": "m", "x_vendor": {"keep": 1.0}, "messages": messages, "stream": False}
    raw = b'{"model":"m","x_vendor":{"keep":1.0},"messages":[{"role":"user","content":"hi"}],"stream":false}'
    conv = CHAT.parse(body, raw, *digests_and_chain(messages))
    assert CHAT.apply(conv.body, conv.raw, messages) == (raw, None)
    sent, forwarded = CHAT.apply(conv.body, conv.raw, [dict(m) for m in messages])  # equal pieces: still the client's bytes
    assert sent is raw and forwarded is None
    new = [{"role": "user", "content": "stub"}]
    sent, forwarded = CHAT.apply(conv.body, conv.raw, new)
    assert forwarded is not None and list(forwarded) == ["model", "x_vendor", "messages", "stream"]
    assert sent == orjson.dumps(body | {"messages": new})  # the bytes the proxy forwarded before the codec
    assert forwarded["x_vendor"] == {"keep": 1.0} and forwarded["messages"] is new
    tools = [{"type": "function", "function": {"name": "context_proxy_read"}}]
    sent, forwarded = CHAT.apply(body, raw, messages, {"tools": tools})
    assert forwarded is not None and forwarded["tools"] == tools and orjson.loads(sent)["messages"] == messages


def test_parts_name_their_kind_cost_and_native_piece(counter: TokenCounter) -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    text = {"type": "text", "text": "look at this"}
    parts = CHAT.parts({"role": "user", "content": [text, image]}, counter)
    assert [p.kind for p in parts] == [TEXT, MEDIA] and parts[0].native is text and parts[1].native is image
    assert parts[0].tokens == counter.count_text("look at this") and parts[1].tokens == price_part(image, counter)
    call = _call("c1")
    parts = CHAT.parts({"role": "assistant", "content": "ok", "tool_calls": [call]}, counter)
    assert [(p.kind, p.call_id, p.field) for p in parts] == [(TEXT, None, "content"), (TOOL_CALL, "c1", "tool_calls")]
    assert parts[1].native is call and parts[1].tokens == price_tool_call(call, counter)
    (result,) = CHAT.parts({"role": "tool", "tool_call_id": "c1", "content": "done"}, counter)
    assert (result.kind, result.call_id, result.tokens) == (TOOL_RESULT, "c1", counter.count_text("done"))
    message = {"role": "user", "content": [text, image]}
    assert sum(p.tokens for p in CHAT.parts(message, counter)) + 3 + 1 == counter.bind(CHAT).count_message(message)
