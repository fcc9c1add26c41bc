"""Checking a chat body (proxy/conversation/chat_request.py): what the proxy relies on, and nothing more."""

from __future__ import annotations

import orjson
import pytest

from proxy.conversation.chat_request import parse_chat_request
from proxy.errors import BadRequest


@pytest.mark.parametrize("body, param", [
    (b"{bad", None),
    (b"[]", None),
    (orjson.dumps({"messages": [{"role": "user", "content": "x"}]}), "model"),
    (orjson.dumps({"model": "\u0000", "messages": [{"role": "system"}]}), "model"),  # found by hypothesis on PostgreSQL
    (orjson.dumps({"model": "m", "messages": []}), "messages"),
    (orjson.dumps({"model": "m", "messages": [{"role": "us\u0000er"}]}), "messages[0].role"),  # the log cannot store it
    (orjson.dumps({"model": "m", "messages": [{"role": "user"}], "stream": "yes"}), "stream"),
    (b"\xff\xfe", None),
    # the first invalid message is named, whichever check fails (the fast checks only gate)
    (orjson.dumps({"model": "m", "messages": [{"role": "user"}, "hi", {"role": "wizard"}]}), "messages[1]"),
    (orjson.dumps({"model": "m", "messages": [{"role": 3}, {"role": "user"}, {"role": "\u0000"}]}), "messages[2].role"),
    (orjson.dumps({"model": "m", "messages": [{"role": "user"}, {"role": "assistant", "tool_calls": {}}]}), "messages[1].tool_calls"),
    (orjson.dumps({"model": "m", "messages": [{"role": "wizard", "tool_calls": "x"}]}), "messages[0].tool_calls"),
    (orjson.dumps({"model": "m", "messages": [{"role": "assistant", "tool_calls": "x"}, {"role": 3}]}), "messages[0].tool_calls"),
    (orjson.dumps({"model": "m", "messages": [{"role": "user"}, [{"role": "user"}]]}), "messages[1]"),
])
def test_bad_bodies_are_400s_naming_the_field(body: bytes, param: str | None) -> None:
    with pytest.raises(BadRequest) as err:
        parse_chat_request(body)
    assert err.value.param == param and err.value.status == 400


def test_unknown_fields_survive() -> None:
    body = parse_chat_request(orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x", "x_extra": 1}], "seed": 3}))
    assert body["seed"] == 3 and body["messages"][0]["x_extra"] == 1


def test_every_role_and_tool_calls_shape_the_api_allows_passes() -> None:
    roles = ["system", "developer", "user", "assistant", "tool", "function"]
    messages = [{"role": r, "content": "x"} for r in roles]
    messages += [{"role": "assistant", "tool_calls": None}, {"role": "assistant", "tool_calls": []}]
    body = parse_chat_request(orjson.dumps({"model": "m", "messages": messages}))
    assert body["messages"] == messages


@pytest.mark.parametrize("role", ["ipython", "wizard", "", "USER", "x" * 1000, "\u00e9l\u00e8ve", None, 3, True, ["user"], {"a": "\u0000"}])
def test_a_role_the_proxy_does_not_know_is_forwarded_as_it_came(role: object) -> None:
    """Which roles are valid is the provider's decision (issue 15): any role that the log can store
    passes, the message untouched (unknown fields and key order too); the provider answers it."""
    odd = {"x_first": 1, "role": role, "content": [{"type": "text", "text": "x", "x_part": [1]}], "x_last": {"k": None}}
    messages = [{"role": "user", "content": "hi"}, odd, {"content": "no role at all"}]
    raw = orjson.dumps({"x_body": 1, "model": "m", "messages": messages, "x_tail": True})
    body = parse_chat_request(raw)
    assert orjson.dumps(body) == raw
    assert list(body["messages"][1]) == ["x_first", "role", "content", "x_last"]


_NO_CALLS = [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": None},
             {"role": "assistant", "tool_calls": []}]


@pytest.mark.parametrize("bad, param", [
    ("x", "messages[3].tool_calls[0]"),
    ({"id": 5}, "messages[3].tool_calls[0].id"),
    ({"function": []}, "messages[3].tool_calls[0].function"),
    ({"function": {"name": 5}}, "messages[3].tool_calls[0].function.name"),
])
def test_the_check_of_a_body_without_calls_stops_early_and_one_bad_call_is_still_named(bad: object, param: str) -> None:
    """``_check_tool_calls`` stops after its first pass when no message has a call (absent, null,
    ``[]``): such a body passes as before, and the same body with one ill-typed call after those
    messages is refused naming it (the early stop is not taken then)."""
    assert parse_chat_request(orjson.dumps({"model": "m", "messages": _NO_CALLS}))["messages"] == _NO_CALLS
    good = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    called = [*_NO_CALLS, {"role": "assistant", "tool_calls": [bad, good]}]
    with pytest.raises(BadRequest) as err:
        parse_chat_request(orjson.dumps({"model": "m", "messages": called}))
    assert err.value.param == param
    fine = [*_NO_CALLS, {"role": "assistant", "tool_calls": [good, {"id": None, "function": None}]}]
    assert parse_chat_request(orjson.dumps({"model": "m", "messages": fine}))["messages"] == fine
