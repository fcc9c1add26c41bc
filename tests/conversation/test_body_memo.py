"""BodyMemo: a big chat body that extends one seen before is parsed by reusing that body's
messages, and gives exactly what parsing it whole gives (value, key order, errors)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from proxy.conversation.body_memo import BodyMemo
from proxy.conversation.chat_request import parse_chat_request
from proxy.conversation.json_spans import messages_start
from proxy.errors import BadRequest

TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]


def history(n: int = 200) -> list[dict[str, Any]]:
    """``n`` messages of about 400 bytes, some non-ASCII, some with ``]`` and ``,`` in their text."""
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for i in range(n - 1):
        if i % 3 == 2:
            out.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "ls ]"}'}}]})
        else:
            out.append({"role": "user" if i % 3 == 0 else "tool", "content": f"step {i} é ] , 😀 " + "x" * 380,
                        **({"tool_call_id": f"call_{i - 1}"} if i % 3 == 1 else {})})
    return out


def same(raw: bytes, memo: BodyMemo, tenant: str = "t") -> dict[str, Any]:
    """Parse ``raw`` with ``memo``; assert it is what parsing it whole gives."""
    got = parse_chat_request(raw, memo, tenant)
    want = parse_chat_request(raw)
    assert got == want
    assert orjson.dumps(got) == orjson.dumps(want)  # key order too
    return got


SERIALIZERS: dict[str, Callable[[Any], bytes]] = {
    "orjson": orjson.dumps,
    "json.dumps": lambda o: json.dumps(o).encode(),  # ", " and ": ", \\u escapes
    "indented": lambda o: json.dumps(o, indent=2, ensure_ascii=False).encode(),
}


@pytest.mark.parametrize("dumps", SERIALIZERS.values(), ids=SERIALIZERS.keys())
@pytest.mark.parametrize("order", ["model first", "messages first", "tools first"])
def test_each_turn_reuses_the_last_and_parses_the_same(dumps: Callable[[Any], bytes], order: str) -> None:
    memo = BodyMemo(min_bytes=1024)
    messages = history()
    previous: dict[str, Any] | None = None
    for turn in range(5):
        messages = [*messages, {"role": "assistant", "content": f"done {turn} ]"},
                    {"role": "user", "content": f"go on {turn} ✓"}]
        fields = {"model": "gpt-x", "messages": messages, "tools": TOOLS, "stream": False}
        if order == "messages first":
            fields = {"messages": messages, "model": "gpt-x", "stream": False}
        elif order == "tools first":
            fields = {"tools": TOOLS, "temperature": 0.5, "model": "gpt-x", "messages": messages}
        body = same(dumps(fields), memo)
        if previous is not None and turn >= 2:  # the first extension learns where the first body's messages end
            assert all(a is b for a, b in zip(body["messages"], previous["messages"], strict=False))
        previous = body
    assert memo.reused == 4


def test_a_history_changed_before_its_end_is_parsed_whole() -> None:
    memo = BodyMemo(min_bytes=1024)
    messages = history()
    same(orjson.dumps({"model": "m", "messages": messages}), memo)
    edited = [*messages[:50], {"role": "user", "content": "edited"}, *messages[51:], {"role": "user", "content": "next"}]
    same(orjson.dumps({"model": "m", "messages": edited}), memo)
    assert memo.reused == 0


def test_a_bracket_in_text_where_the_bodies_differ_is_not_taken_for_the_arrays_end() -> None:
    memo = BodyMemo(min_bytes=1024)
    messages = history()
    old = orjson.dumps({"model": "m", "messages": [*messages, {"role": "user", "content": "tail ]"}]})
    new = orjson.dumps({"model": "m", "messages": [*messages, {"role": "user", "content": "tail ,"},
                                                   {"role": "user", "content": "]}"}]})
    assert old.index(b"tail ]") == new.index(b"tail ,")  # they first differ at that "]" and ","
    same(old, memo)
    same(new, memo)
    assert memo.reused == 0


def test_a_second_messages_member_wins_as_in_a_whole_parse() -> None:
    memo = BodyMemo(min_bytes=1024)
    messages = history()
    same(orjson.dumps({"model": "m", "messages": messages}), memo)
    grown = orjson.dumps({"model": "m", "messages": [*messages, {"role": "user", "content": "a"}]})
    same(grown, memo)  # learns where the messages end
    dup = grown[:-2] + b',{"role":"user","content":"b"}],"messages":[{"role":"user","content":"only"}]}'
    body = same(dup, memo)
    assert body["messages"] == [{"role": "user", "content": "only"}]
    assert memo.reused == 1


def test_a_bad_new_message_is_the_same_400_as_a_whole_parse() -> None:
    memo = BodyMemo(min_bytes=1024)
    messages = history()
    same(orjson.dumps({"model": "m", "messages": messages}), memo)
    same(orjson.dumps({"model": "m", "messages": [*messages, {"role": "user", "content": "a"}]}), memo)
    bad = orjson.dumps({"model": "m", "messages": [*messages, {"role": "user", "content": "a"},
                                                   {"role": "assistant", "tool_calls": {"id": 1}}]})
    with pytest.raises(BadRequest) as whole:
        parse_chat_request(bad)
    with pytest.raises(BadRequest) as memoized:
        parse_chat_request(bad, memo, "t")
    assert (memoized.value.message, memoized.value.param) == (whole.value.message, whole.value.param)
    assert whole.value.param == f"messages[{len(messages) + 1}].tool_calls"
    broken = orjson.dumps({"model": "m", "messages": [*messages, {"role": "user", "content": "a"}]})[:-2] + b",{]}"
    with pytest.raises(BadRequest) as whole:
        parse_chat_request(broken)
    with pytest.raises(BadRequest) as memoized:
        parse_chat_request(broken, memo, "t")
    assert memoized.value.message == whole.value.message


def test_a_lone_surrogate_in_the_new_messages_is_replaced_as_in_a_whole_parse() -> None:
    memo = BodyMemo(min_bytes=1024)
    messages = history()
    same(orjson.dumps({"model": "m", "messages": messages}), memo)
    same(orjson.dumps({"model": "m", "messages": [*messages, {"role": "user", "content": "a"}]}), memo)
    raw = orjson.dumps({"model": "m", "messages": [*messages, {"role": "user", "content": "a"}]})[:-2]
    body = same(raw + b',{"role":"user","content":"half \\ud83d"}]}', memo)
    assert body["messages"][-1]["content"] == "half \ufffd"


def test_another_tenants_bodies_are_never_reused() -> None:
    memo = BodyMemo(min_bytes=1024)
    messages = history()
    same(orjson.dumps({"model": "m", "messages": messages}), memo, tenant="a")
    messages = [*messages, {"role": "user", "content": "b"}]
    same(orjson.dumps({"model": "m", "messages": messages}), memo, tenant="b")
    assert memo.reused == 0  # it extends a's body, which b never sent
    same(orjson.dumps({"model": "m", "messages": [*messages, {"role": "user", "content": "c"}]}), memo, tenant="b")
    assert memo.reused == 1  # b's own


def test_small_bodies_are_not_kept_and_the_memo_stays_within_its_bound() -> None:
    memo = BodyMemo(min_bytes=1024, max_bytes=400_000)
    same(orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}), memo)
    assert len(memo) == 0
    for i in range(20):  # distinct conversations of ~100 kB
        same(orjson.dumps({"model": "m", "messages": [{"role": "user", "content": f"c{i}"}, *history()]}), memo)
        assert memo._total <= memo.max_bytes
    assert 0 < len(memo) < 20


@pytest.mark.parametrize(("raw", "found"), [
    (b'{"model":"m","messages":[1]}', True),
    (b' { "messages" : [1]}', True),
    (b'{"tools":[{"messages":[2],"x":"]}"}],"n":1.5e3,"b":true,"s":"\\"messages\\":[2]","messages":[1]}', True),
    (b'{"model":"m"}', False),
    (b'{"\\u006dessages":[1]}', False),  # written with an escape: not looked for
    (b'{"messages":"x"}', False),
])
def test_messages_start_finds_the_top_level_array(raw: bytes, found: bool) -> None:
    assert messages_start(raw) == (raw.rindex(b"[1]") if found else None)
