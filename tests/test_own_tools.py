"""Hiding the proxy's own tool calls from the client (proxy/tools/own_tools.py)."""

from __future__ import annotations

from proxy.tools.own_tools import StreamToolFilter, split_calls

OWN = frozenset({"context_proxy_read"})


def call(index: int, name: str | None = None, args: str = "", cid: str | None = None) -> dict:
    fn: dict = {"arguments": args}
    if name:
        fn["name"] = name
    out: dict = {"index": index, "function": fn}
    if cid:
        out["id"] = cid
    return out


def chunk(calls: list[dict] | None = None, content: str | None = None, finish: str | None = None) -> dict:
    delta: dict = {}
    if calls is not None:
        delta["tool_calls"] = calls
    if content is not None:
        delta["content"] = content
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_own_calls_are_removed_and_client_calls_renumbered() -> None:
    f = StreamToolFilter(OWN)
    assert f.filter(chunk([call(0, "context_proxy_read", "", "p1")])) is None
    first_client = f.filter(chunk([call(1, "fetch", "", "c1")]))
    assert first_client["choices"][0]["delta"]["tool_calls"] == [call(0, "fetch", "", "c1")]
    assert f.filter(chunk([call(0, args='{"reference": "art_1"}')])) is None
    more = f.filter(chunk([call(1, args="{}")]))
    assert more["choices"][0]["delta"]["tool_calls"][0]["index"] == 0
    assert f.client_calls == 1
    (own,) = f.own_calls
    assert own.as_tool_call() == {"id": "p1", "type": "function", "function": {"name": "context_proxy_read", "arguments": '{"reference": "art_1"}'}}


def test_untouched_chunks_are_returned_as_is() -> None:
    f = StreamToolFilter(OWN)
    c = chunk(content="hello")
    assert f.filter(c) is c
    c2 = chunk([call(0, "fetch", "{}", "c1")])
    assert f.filter(c2) is c2


def test_content_in_a_chunk_with_an_own_call_survives() -> None:
    f = StreamToolFilter(OWN)
    out = f.filter(chunk([call(0, "context_proxy_read", "", "p1")], content="Let me look."))
    assert out["choices"][0]["delta"] == {"content": "Let me look."}


def test_split_calls() -> None:
    mine, theirs = split_calls([{"function": {"name": "context_proxy_read"}}, {"function": {"name": "x"}}], OWN)
    assert len(mine) == 1 and theirs == [{"function": {"name": "x"}}]
