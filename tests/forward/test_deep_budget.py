"""The deep fallbacks' budget (``proxy.json_depth.DEEP_BUDGET_CONTAINERS``, lowered here): a
request whose content nested deeper than orjson writes holds more containers than that is
forwarded unlogged, as the client sent it, having cost the event loop at most about the budget
(``DeepBudget.walked_total`` counts what the fallbacks walked); one under it is logged; a reply
over it reaches the client as the provider sent it and is logged without its content. In process,
against the strict fakes, on SQLite.

Before: every such request was hashed whole on the event loop whatever its size (a 3.8 MB body
of 3,000 tool inputs 600 deep: 14 s in process), then logged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from proxy import json_depth
from proxy.json_depth import DEEP_REPLY_ERROR, DeepBudget
from tests.fakes.anthropic import create_fake_anthropic, reply, tool_use
from tests.support.inprocess import (
    FakeProvider,
    InProcessProxy,
    session_messages,
    start_messages_inprocess,
    wait_session,
)
from tests.support.values import nested, same

BUDGET = 2_000
DEPTH = 600
TOOLS = [{"name": "f", "input_schema": {"type": "object"}}]


@pytest.fixture(autouse=True)
def small_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_depth, "DEEP_BUDGET_CONTAINERS", BUDGET)


def deep_input() -> Any:
    return {"path": "a.txt", "tree": nested(DEPTH, {"leaf": 1})}


def messages_body(inputs: int) -> bytes:
    uses = [{"type": "tool_use", "id": f"toolu_{i}", "name": "f", "input": deep_input()} for i in range(inputs)]
    results = [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "ok"} for i in range(inputs)]
    return json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 256, "tools": TOOLS, "messages": [
        {"role": "user", "content": "go"}, {"role": "assistant", "content": uses},
        {"role": "user", "content": results}]}).encode()


def chat_body(states: int) -> bytes:
    return json.dumps({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "x", "vendor_state": [deep_input() for _ in range(states)]},
        {"role": "user", "content": "and now?"}]}).encode()


JSON = {"content-type": "application/json"}


@pytest.mark.parametrize("inputs", [20, 200], ids=["10x_budget", "100x_budget"])
async def test_a_messages_request_over_the_budget_is_forwarded_unlogged_as_sent(
        tmp_path: Path, sqlite_template: Path, inputs: int) -> None:
    shutil.copyfile(sqlite_template, tmp_path / "log.db")
    provider, state = create_fake_anthropic()
    state.script.extend([reply("Done."), reply("Fine.")])
    raw = messages_body(inputs)
    async with start_messages_inprocess(f"sqlite:///{tmp_path}/log.db", provider) as http:
        before = DeepBudget.walked_total
        resp = await http.post("/v1/messages", content=raw, headers=JSON | {"x-session-id": "deep"})
        walked = DeepBudget.walked_total - before
        assert resp.status_code == 200, resp.text
        assert resp.json()["content"][0]["text"] == "Done."  # the provider's answer
        assert state.message_requests[-1].raw == raw  # the client's own bytes
        # the views' and the digests' accounts, each spent at most once (and a container over)
        assert walked <= 2 * (BUDGET + 1), walked
        # nothing of it logged: a later request's log write lands, the deep session has none
        await http.post("/v1/messages", json={"model": "claude-sonnet-4-5", "max_tokens": 16,
                                              "messages": [{"role": "user", "content": "hi"}]},
                        headers={"x-session-id": "plain"})
        await wait_session(http, "plain", 1)
        assert (await http.get("/sessions/deep")).status_code == 404


async def test_a_messages_request_under_the_budget_is_logged(tmp_path: Path, sqlite_template: Path) -> None:
    shutil.copyfile(sqlite_template, tmp_path / "log.db")
    provider, state = create_fake_anthropic()
    state.script.append(reply("Done."))
    raw = messages_body(2)  # about 1,200 containers: under 2,000, walked again by the later stages
    async with start_messages_inprocess(f"sqlite:///{tmp_path}/log.db", provider, offload_tool_tokens=200) as http:
        resp = await http.post("/v1/messages", content=raw, headers=JSON | {"x-session-id": "deep"})
        assert resp.status_code == 200, resp.text
        assert state.message_requests[-1].raw == raw
        logged = await session_messages(http, "deep")
    assert [m["role"] for m in logged] == ["user", "assistant", "user", "assistant"]
    assert same(logged[1]["content"][1]["input"], deep_input())


async def test_a_chat_request_over_the_budget_is_forwarded_unlogged_as_sent(
        inprocess_proxy: InProcessProxy, fake_provider: FakeProvider) -> None:
    raw = chat_body(1_000)
    before = DeepBudget.walked_total
    resp = await inprocess_proxy.http.post("/v1/chat/completions", content=raw,
                                           headers=JSON | {"x-session-id": "deep"})
    walked = DeepBudget.walked_total - before
    assert resp.status_code == 200, resp.text  # the provider's answer, not the proxy's 400
    assert "x-context-proxy-warning" not in resp.headers  # (the database is fine)
    assert fake_provider.state.chat_requests[-1].body == raw
    assert walked <= BUDGET + 1, walked
    await inprocess_proxy.http.post("/v1/chat/completions", headers={"x-session-id": "plain"},
                                    json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    await wait_session(inprocess_proxy.http, "plain", 1)
    assert (await inprocess_proxy.http.get("/sessions/deep")).status_code == 404


async def test_a_chat_request_under_the_budget_is_logged(
        inprocess_proxy: InProcessProxy, fake_provider: FakeProvider) -> None:
    raw = chat_body(2)
    resp = await inprocess_proxy.http.post("/v1/chat/completions", content=raw,
                                           headers=JSON | {"x-session-id": "deep"})
    assert resp.status_code == 200, resp.text
    assert fake_provider.state.chat_requests[-1].body == raw
    logged = await session_messages(inprocess_proxy.http, "deep")
    assert [m["role"] for m in logged] == ["user", "assistant", "user", "assistant"]
    assert same(logged[1]["vendor_state"], [deep_input(), deep_input()])


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_a_messages_reply_over_the_budget_reaches_the_client_and_is_logged_without_it(
        tmp_path: Path, sqlite_template: Path, stream: bool) -> None:
    shutil.copyfile(sqlite_template, tmp_path / "log.db")
    provider, state = create_fake_anthropic()
    big = {"path": "a.txt", "trees": [nested(DEPTH, {"leaf": i}) for i in range(5)]}  # 3,000 containers
    state.script.append(reply(tool_use("f", big, id="toolu_01")))
    body = {"model": "claude-sonnet-4-5", "max_tokens": 4096, "tools": TOOLS, "stream": stream,
            "messages": [{"role": "user", "content": "go"}]}
    async with start_messages_inprocess(f"sqlite:///{tmp_path}/log.db", provider) as http:
        resp = await http.post("/v1/messages", json=body, headers={"x-session-id": "deep"})
        assert resp.status_code == 200, resp.text
        if stream:
            assert b'"partial_json"' in resp.content and resp.content.rstrip().endswith(b"}")
        else:
            assert same(resp.json(), state.message_requests[-1].response)  # the provider's Message
        session = await wait_session(http, "deep", 1)
        logged = await session_messages(http, "deep")
        requests = (await http.get("/sessions/deep/requests")).json()["data"]
    assert session["request_count"] == 1
    assert [m["role"] for m in logged] == ["user"]  # the client's turn; the reply left out
    assert requests[0]["error"] == DEEP_REPLY_ERROR


def deep_tools(n: int) -> list[dict[str, Any]]:
    return [{"name": f"f{i}", "description": "d", "input_schema": {"type": "object", "x": deep_input()}}
            for i in range(n)]


async def test_a_messages_request_whose_tools_are_deep_past_the_budget_is_forwarded_unlogged(
        tmp_path: Path, sqlite_template: Path) -> None:
    """Deep content outside the turns (the tool schemas, any other field) was walked by the
    fallbacks of token counting (``count_tools``: twice) and ``apply`` unbudgeted: 100 schemas
    600 deep, 120,000 containers on the event loop (3,000 of them: 3.6 M, 9 s)."""
    shutil.copyfile(sqlite_template, tmp_path / "log.db")
    provider, state = create_fake_anthropic()
    state.script.extend([reply("Done."), reply("Fine.")])
    raw = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 256, "tools": deep_tools(20),
                      "messages": [{"role": "user", "content": "go"}]}).encode()
    async with start_messages_inprocess(f"sqlite:///{tmp_path}/log.db", provider) as http:
        before = DeepBudget.walked_total
        resp = await http.post("/v1/messages", content=raw, headers=JSON | {"x-session-id": "deep"})
        walked = DeepBudget.walked_total - before
        assert resp.status_code == 200, resp.text
        assert resp.json()["content"][0]["text"] == "Done."
        assert state.message_requests[-1].raw == raw
        assert walked <= 2 * (BUDGET + 1), walked


async def test_a_chat_request_whose_tools_are_deep_past_the_budget_is_forwarded_unlogged(
        inprocess_proxy: InProcessProxy, fake_provider: FakeProvider) -> None:
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object", "x": deep_input()}}}
             for i in range(20)]
    raw = json.dumps({"model": "gpt-4o", "tools": tools, "messages": [{"role": "user", "content": "go"}]}).encode()
    before = DeepBudget.walked_total
    resp = await inprocess_proxy.http.post("/v1/chat/completions", content=raw, headers=JSON | {"x-session-id": "deep"})
    walked = DeepBudget.walked_total - before
    assert resp.status_code == 200, resp.text
    assert fake_provider.state.chat_requests[-1].body == raw
    assert walked <= BUDGET + 1, walked


async def test_a_chat_request_with_deep_tools_under_the_budget_is_logged(
        inprocess_proxy: InProcessProxy, fake_provider: FakeProvider) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "x": deep_input()}}}]
    raw = json.dumps({"model": "gpt-4o", "tools": tools, "messages": [{"role": "user", "content": "go"}]}).encode()
    resp = await inprocess_proxy.http.post("/v1/chat/completions", content=raw, headers=JSON | {"x-session-id": "deep"})
    assert resp.status_code == 200, resp.text
    assert fake_provider.state.chat_requests[-1].body == raw
    logged = await session_messages(inprocess_proxy.http, "deep")
    assert [m["role"] for m in logged] == ["user", "assistant"]
