"""Second review of BodyMemo through the app (in process): what a body gets with the memo is what
it gets parsed whole."""

from __future__ import annotations

from typing import Any

from tests.support.inprocess import FakeProvider

MODEL = "fake-128k-openai"
SYSTEM = {"role": "system", "content": "Be brief. " * 8000}  # 80 kB: past MIN_BODY_BYTES


def tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": "Runs it. " * 20,
                                             "parameters": {"type": "object"}}}


async def test_a_tool_added_before_the_messages_is_answered(inprocess_factory: Any,
                                                             fake_provider: FakeProvider) -> None:
    """A client that writes ``tools`` before ``messages`` (2 kB of them: past the first kB that
    indexes a kept body) and enables one more tool mid-conversation: the memo took the tools
    array's end for its messages' end and raised ``IndexError`` (a 500)."""
    proxy = await inprocess_factory()
    tools = [tool(f"tool_{i}") for i in range(10)]
    messages: list[Any] = [SYSTEM, {"role": "user", "content": "one"}]
    resp = await proxy.chat({"model": MODEL, "tools": tools, "messages": messages}, headers={"x-session-id": "t"})
    assert resp.status_code == 200, resp.text
    messages = [*messages, resp.json()["choices"][0]["message"], {"role": "user", "content": "two"}]
    resp = await proxy.chat({"model": MODEL, "tools": [*tools, tool("added")], "messages": messages},
                            headers={"x-session-id": "t"})
    assert resp.status_code == 200, resp.text
    sent = fake_provider.state.chat_requests[-1].json
    assert [t["function"]["name"] for t in sent["tools"]][-1] == "added"
