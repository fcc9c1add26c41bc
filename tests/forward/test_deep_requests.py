"""A request whose history holds a message nested deeper than the proxy's recursive helpers go
(orjson writes 254 levels; ``hash_view`` and the stdlib recurse about 500): the turn a provider
nested that deep, echoed back by the client. The provider accepts it (the strict fakes do), so
the proxy forwards it as the provider would take it, the client's own bytes when no defense
changed the body and the deep turn intact when one did, and logs it; in process, on SQLite, read
back through the read API.

Before: chat answered a 400 of its own ("The request body is nested deeper than 254 levels."),
forwarding nothing; Messages forwarded the body unlogged (nothing of the session stored) and
uncompacted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.anthropic import create_fake_anthropic, reply
from tests.support.inprocess import FakeProvider, InProcessProxy, session_messages, start_messages_inprocess
from tests.support.values import nested, same

DEPTH = 600
LONG_RESULT = "line of a long tool output\n" * 400
"""A tool result past ``offload_tool_tokens=200``: offloaded, so the body is rewritten."""


def deep_input() -> Any:
    return {"path": "a.txt", "tree": nested(DEPTH, {"leaf": 1.5})}


def chat_history(result: str) -> list[dict[str, Any]]:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return [{"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [call], "vendor_state": deep_input()},
            {"role": "tool", "tool_call_id": "call_1", "content": result},
            {"role": "user", "content": "and now?"}]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_chat_history_holding_a_deep_message_is_forwarded_as_sent_and_logged(
        inprocess_proxy: InProcessProxy, fake_provider: FakeProvider, stream: bool) -> None:
    history = chat_history("done")
    raw = json.dumps({"model": "gpt-4o", "messages": history, "stream": stream}).encode()
    resp = await inprocess_proxy.http.post("/v1/chat/completions", content=raw,
                                           headers={"content-type": "application/json", "x-session-id": "deep"})
    assert resp.status_code == 200, resp.text
    assert fake_provider.state.chat_requests[-1].body == raw  # the client's own bytes
    logged = await session_messages(inprocess_proxy.http, "deep")
    assert [m["role"] for m in logged] == ["user", "assistant", "tool", "user", "assistant"]
    assert same(logged[1]["vendor_state"], deep_input())


async def test_a_rewritten_chat_body_carries_the_deep_message_intact(
        inprocess_factory: Any, fake_provider: FakeProvider) -> None:
    proxy = await inprocess_factory(offload_tool_tokens=200)
    raw = json.dumps({"model": "gpt-4o", "messages": chat_history(LONG_RESULT)}).encode()
    resp = await proxy.http.post("/v1/chat/completions", content=raw,
                                 headers={"content-type": "application/json", "x-session-id": "deep"})
    assert resp.status_code == 200, resp.text
    sent = fake_provider.state.chat_requests[-1]
    assert sent.body != raw and LONG_RESULT not in sent.body.decode()  # the result offloaded
    assert same(sent.json["messages"][1], chat_history("")[1])  # the deep turn as the client sent it
    assert same((await session_messages(proxy.http, "deep"))[1]["vendor_state"], deep_input())


def messages_history(result: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01", "name": "f", "input": deep_input()}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": result}]}]


TOOLS = [{"name": "f", "input_schema": {"type": "object"}}]


@pytest.mark.parametrize("offload", [False, True], ids=["as_sent", "offloaded"])
async def test_a_messages_history_holding_a_deep_turn_is_forwarded_and_logged(
        tmp_path: Path, sqlite_template: Path, offload: bool) -> None:
    shutil.copyfile(sqlite_template, tmp_path / "log.db")
    provider, state = create_fake_anthropic()
    state.script.append(reply("Done."))
    result = LONG_RESULT if offload else "done"
    raw = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 256, "tools": TOOLS,
                      "messages": messages_history(result)}).encode()
    overrides = {"offload_tool_tokens": 200} if offload else {}
    async with start_messages_inprocess(f"sqlite:///{tmp_path}/log.db", provider, **overrides) as http:
        resp = await http.post("/v1/messages", content=raw,
                               headers={"content-type": "application/json", "x-session-id": "deep"})
        assert resp.status_code == 200, resp.text
        sent = state.message_requests[-1]
        if offload:
            assert LONG_RESULT not in sent.raw.decode()  # compacted: the body rewritten
            assert same(sent.json["messages"][1], messages_history("")[1])  # the deep turn intact
        else:
            assert sent.raw == raw
        logged = await session_messages(http, "deep")
    assert [m["role"] for m in logged] == ["user", "assistant", "user", "assistant"]
    assert same(logged[1]["content"][0]["input"], deep_input())
