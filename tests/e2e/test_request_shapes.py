"""Request shapes the proxy reads (issue 16, item 12): each ill-typed one is a 400 in OpenAI's
envelope whose ``param`` names the field, never a 500; what the proxy does not read passes as it
came (the provider decides); a body nested too deep is told apart from other encode errors.

The shapes run on the in-process tier (no sockets needed), on both databases."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from tests.e2e.conftest import Proxy
from tests.support.inprocess import FakeProvider, InProcessProxy

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]} | fields


def with_call(call: Any) -> dict[str, Any]:
    return body(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                          {"role": "tool", "tool_call_id": "call_1", "content": "ok"}])


REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "tools[].function a string": (body(tools=[{"type": "function", "function": "f"}]), "tools[0].function"),
    "tools[].function a list": (body(tools=[{"type": "function", "function": ["f"]}]), "tools[0].function"),
    "tools[].function a number": (body(tools=[{"type": "function", "function": 5}]), "tools[0].function"),
    "tools[].function true": (body(tools=[TOOL, {"type": "function", "function": True}]), "tools[1].function"),
    "tools[] a string": (body(tools=["f"]), "tools[0]"),
    "tools[] a number": (body(tools=[TOOL, 7]), "tools[1]"),
    "tools[].function.name a list": (body(tools=[{"type": "function", "function": {"name": ["f"]}}]), "tools[0].function.name"),
    "tools[].function.name an object": (body(tools=[{"type": "function", "function": {"name": {"a": 1}}}]), "tools[0].function.name"),
    "tools[].function.name a number": (body(tools=[{"type": "function", "function": {"name": 5}}]), "tools[0].function.name"),
    "tool_calls[] a string": (with_call("call"), "messages[1].tool_calls[0]"),
    "tool_calls[] a number": (with_call(3), "messages[1].tool_calls[0]"),
    "tool_calls[].function a string": (with_call(CALL | {"function": "f"}), "messages[1].tool_calls[0].function"),
    "tool_calls[].function a list": (with_call(CALL | {"function": [1]}), "messages[1].tool_calls[0].function"),
    "tool_calls[].function.name a list": (with_call(CALL | {"function": {"name": ["f"], "arguments": "{}"}}),
                                          "messages[1].tool_calls[0].function.name"),
    "tool_calls[].id a list": (with_call(CALL | {"id": ["x"]}), "messages[1].tool_calls[0].id"),
    "stream_options a string": (body(stream=True, stream_options="yes"), "stream_options"),
    "stream_options a list": (body(stream_options=[1]), "stream_options"),
}
"""Bodies whose ill-typed field the proxy reads: refused with a 400 naming it."""

FORWARDED: dict[str, dict[str, Any]] = {
    "a tool of another type": body(tools=[{"type": "custom", "custom": {"name": "grammar", "format": {"type": "text"}}}]),
    "a tool without function": body(tools=[{"type": "function"}]),
    "tool_choice an object": body(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "f"}}),
    "tool_choice a number": body(tools=[TOOL], tool_choice=5),
    "an unknown field": body(frobnicate={"deep": [1, 2, {"x": None}]}),
    "content parts of unknown types": body(messages=[{"role": "user", "content": [{"type": "hologram"}, "text", 5]}]),
    "a tool call without function": with_call({"id": "call_1", "type": "function"}),
    "function.name null": body(tools=[{"type": "function", "function": {"name": None}}]),
    "stream_options null": body(stream_options=None),
    "tool_calls[].function.arguments an object": with_call(CALL | {"function": {"name": "f", "arguments": {"a": 1}}}),
}
"""Bodies the proxy does not need to understand: forwarded (the provider answers), never a 5xx."""


@pytest.fixture
def inprocess_database_url(database_url: str) -> str:
    return database_url  # both databases, as on the real servers


@pytest.mark.parametrize("name", list(REFUSED))
async def test_ill_typed_shapes_the_proxy_reads_are_400_naming_the_field(inprocess_proxy: InProcessProxy,
                                                                        fake_provider: FakeProvider, name: str) -> None:
    payload, param = REFUSED[name]
    before = len(fake_provider.state.requests)
    r = await inprocess_proxy.http.post("/v1/chat/completions", content=orjson.dumps(payload),
                                        headers={"content-type": "application/json"})
    assert r.status_code == 400, (r.status_code, r.text[:300])
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert param in error["message"] and "nested" not in error["message"], error
    assert len(fake_provider.state.requests) == before  # refused by the proxy, never forwarded


@pytest.mark.parametrize("name", list(FORWARDED))
async def test_shapes_the_proxy_does_not_read_are_forwarded(inprocess_proxy: InProcessProxy, fake_provider: FakeProvider,
                                                            name: str) -> None:
    before = len(fake_provider.state.requests)
    r = await inprocess_proxy.http.post("/v1/chat/completions", content=orjson.dumps(FORWARDED[name]),
                                        headers={"content-type": "application/json"})
    assert r.status_code < 500, (r.status_code, r.text[:300])
    assert len(fake_provider.state.requests) > before  # the provider saw it


def test_a_type_error_of_ours_is_not_reported_as_deep_nesting(proxy: Proxy, monkeypatch: pytest.MonkeyPatch) -> None:
    """``orjson.JSONEncodeError`` is ``TypeError``: a bug raising one while preparing the request
    was answered "nested deeper than 254 levels" (a 400 blaming the client). It is ours: a 500.
    A body really nested that deep is no error at all (``proxy.json_depth``): forwarded, as the
    provider takes it (it was that 400 too)."""
    from proxy.compaction.compactor import ProjectingCompactor

    async def broken(self: ProjectingCompactor, ctx: Any, overflow: Any = None) -> Any:
        return len(5)  # type: ignore[arg-type]  # a TypeError of the proxy's own

    monkeypatch.setattr(ProjectingCompactor, "prepare", broken)
    deep: Any = "x"
    for _ in range(300):
        deep = [deep]
    with proxy.http() as http:
        ours = http.post("/v1/chat/completions", json=body())
        monkeypatch.undo()
        theirs = http.post("/v1/chat/completions", headers={"content-type": "application/json"},
                           content=json.dumps(body(messages=[{"role": "user", "content": "x", "metadata": deep}])))
    assert ours.status_code == 500 and "nested" not in ours.json()["error"]["message"], ours.text
    assert theirs.status_code == 200, theirs.text
