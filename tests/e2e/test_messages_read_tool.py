"""The proxy's read tool on Anthropic Messages (issue 19, item 7): the official ``anthropic`` SDK
through the proxy to the strict fake Anthropic provider (thinking signatures bound to the
conversation before them, tool pairing).

A tool result too big for a 12k window is offloaded; asked about a fact in it, the scripted model
calls the read tool the proxy offered (in Anthropic's tool shape, after the client's tools), the
proxy serves it and asks again, and the client gets one answer, streamed or not: the blocks of both
rounds but the proxy's call, indexes contiguous (the SDK's stream accumulator indexes its list by
them), ``stop_reason`` ``end_turn``. On the next request the round is put back where it ran, so the
thinking the model made before calling the tool is forwarded after the very prefix it was signed
over, and the provider accepts every request; the request is logged with the usage of the round that
answered, streamed or not. Mixed with a call of the client's own tool, the client's call is
returned and the proxy's dropped.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_messages_defenses import MODEL, READ, SYSTEM, file_text, is_summary_call, models_file
from tests.e2e.test_messages_log import logged
from tests.fakes.anthropic import FakeAnthropicState, reply, text, thinking, tool_use
from tests.fakes.anthropic.replies import Reply, last_user_text, strings
from tests.fakes.read_tool import read_tool_name
from tests.support.anthropic_server import anthropic_client

QUESTION = re.compile(r"QUESTION: (f\d+)")
THINKING: Any = {"type": "enabled", "budget_tokens": 1024}


class Model:
    """Reads ``src/f1.py``; asked ``QUESTION: fK`` it answers from the prompt, or else calls the
    offered read tool (``mixed``: together with a call of the client's ``read_file``) and answers
    from its result."""

    def __init__(self, *, mixed: bool = False) -> None:
        self.mixed = mixed

    def __call__(self, request: Any) -> Reply:
        body = request.json
        if is_summary_call(body):
            return reply(text("## Summary\nThe files were read."))
        last = body["messages"][-1]
        results = [b for b in last["content"] if isinstance(b, dict) and b.get("type") == "tool_result"] \
            if isinstance(last["content"], list) else []
        question = QUESTION.search(last_user_text(body))
        if results:
            found = re.search(r"FACT: (f\d+=\S+)", "\n".join(strings(results)))
            if found is not None:
                return reply(text(f"ANSWER: {found.group(1)}"))
            return reply(text("Read."))
        if question is None:
            return reply(thinking("The file first."), tool_use("read_file", {"path": "src/f1.py"}))
        key = question.group(1)
        known = re.search(rf"FACT: ({key}=\S+)", "\n".join(strings(body["messages"])))
        if known is not None:
            return reply(text(f"ANSWER: {known.group(1)}"))
        name = read_tool_name(body)
        assert name is not None, "the fact was offloaded: the read tool must be offered"
        calls = [tool_use(name, {"query": f"FACT {key}"})]
        if self.mixed:
            calls.insert(0, tool_use("read_file", {"path": "src/f2.py"}))
        return reply(thinking("It was in a file I read; search for it."), text("Let me look it up."), *calls)


def ask(c: Any, messages: list[Any], stream: bool) -> Any:
    args: Any = {"model": MODEL, "max_tokens": 4096, "system": SYSTEM, "tools": [READ], "thinking": THINKING,
                 "messages": messages}
    if stream:
        with c.messages.stream(**args) as s:
            return s.get_final_message()
    return c.messages.create(**args)


def echo(message: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]}


def start(c: Any, stream: bool) -> list[Any]:
    """The first cycle: the model reads a big file (its result offloaded on the next request)."""
    messages: list[Any] = [{"role": "user", "content": "Read src/f1.py."}]
    first = ask(c, messages, stream)
    assert first.stop_reason == "tool_use"
    (call,) = [b for b in first.content if b.type == "tool_use"]
    messages += [echo(first), {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id, "content": file_text(1, 700)}]}]
    done = ask(c, messages, stream)
    return [*messages, echo(done)]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_model_reads_an_offloaded_fact_back_and_the_round_is_put_back_on_later_requests(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState, tmp_path: Path, stream: bool) -> None:
    anthropic_state.windows[MODEL] = 12_000
    anthropic_state.responder = Model()
    url = anthropic_proxy(models_file=models_file(tmp_path, {MODEL: 12_000}))
    with anthropic_client(url, default_headers={"x-session-id": f"read-{stream}"}) as c:
        messages = start(c, stream)
        messages.append({"role": "user", "content": "QUESTION: f1 - what was the secret?"})
        answer = ask(c, messages, stream)
        assert answer.stop_reason == "end_turn"
        assert [b.type for b in answer.content] == ["thinking", "text", "text"], answer.content
        assert answer.content[-1].text == "ANSWER: f1=secret-7919"
        assert all(b.type != "tool_use" for b in answer.content)  # the proxy's call never reaches the client
        messages += [echo(answer), {"role": "user", "content": "Thanks. QUESTION: f1 again?"}]
        again = ask(c, messages, stream)
        assert again.content[-1].text == "ANSWER: f1=secret-7919"

    seen = [r for r in anthropic_state.message_requests if not is_summary_call(r.json)]
    rejected = [(r.status, r.error) for r in anthropic_state.message_requests if r.status != 200]
    assert rejected == [], rejected  # the thinking before the read call accepted on every request
    asked, served, later = seen[-3], seen[-2], seen[-1]
    own = read_tool_name(asked.json)
    assert own == "context_proxy_read" and asked.json["tools"][0] == READ  # after the client's tool
    call_turn, results = served.json["messages"][-2:]
    (use,) = [b for b in call_turn["content"] if b["type"] == "tool_use"]
    assert use["name"] == own and call_turn["content"][0]["type"] == "thinking"
    assert results["content"][0]["tool_use_id"] == use["id"] and "FACT: f1=" in str(results["content"])
    # the next request: the round where it ran, then the answer without the blocks the round carries
    forwarded = later.json["messages"]
    at = next(i for i, m in enumerate(forwarded) if m == call_turn)
    assert forwarded[at + 1] == results
    assert forwarded[at + 2] == {"role": "assistant", "content": [{"type": "text", "text": "ANSWER: f1=secret-7919"}]}
    # logged, streamed or not: the usage of the round that answered, whose prompt (the round
    # included) is the one the proxy's estimate sized and its learned ratio compares it with
    records = sorted(logged(url, f"read-{stream}", 4)["requests"], key=lambda r: r["created_at"])
    figures = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")
    assert [records[2]["usage"][k] for k in figures] == [served.usage[k] for k in figures], records[2]["usage"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_mixed_with_the_clients_call_the_clients_is_returned_and_the_proxys_dropped(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState, tmp_path: Path, stream: bool) -> None:
    anthropic_state.windows[MODEL] = 12_000
    anthropic_state.responder = Model(mixed=True)
    url = anthropic_proxy(models_file=models_file(tmp_path, {MODEL: 12_000}))
    with anthropic_client(url, default_headers={"x-session-id": f"mixed-{stream}"}) as c:
        messages = start(c, stream)
        messages.append({"role": "user", "content": "QUESTION: f1 - what was the secret?"})
        answer = ask(c, messages, stream)
        assert answer.stop_reason == "tool_use"
        assert [b.type for b in answer.content] == ["thinking", "text", "tool_use"], answer.content
        assert answer.content[-1].name == "read_file"
        messages += [echo(answer), {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": answer.content[-1].id, "content": file_text(2)}]}]
        after = ask(c, messages, stream)
        assert after.content[-1].type == "text"
    rejected = [(r.status, r.error) for r in anthropic_state.message_requests if r.status != 200]
    assert rejected == [], rejected  # pairing: the proxy's dropped call needs no result


@pytest.mark.parametrize("mixed", [False, True], ids=["read", "mixed"])
def test_a_whole_answer_to_a_request_offering_the_read_tool_is_read_once_and_logged_as_returned(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, mixed: bool) -> None:
    """``own_calls`` hands the Message it read to ``finish_whole``: no answer's bytes are parsed
    twice (they were, before), and the reply logged is the one the client got (the proxy's call
    removed, the round's blocks first)."""
    from proxy.forward import messages, messages_whole

    read: list[bytes] = []
    answers: list[bytes] = []
    parse, own_calls = messages_whole.parse_json, messages.own_calls

    def counted(data: Any) -> Any:
        read.append(bytes(data))
        return parse(data)

    async def answered(ctx: Any, data: bytes, tools: Any) -> Any:
        answers.append(data)
        return await own_calls(ctx, data, tools)

    monkeypatch.setattr(messages_whole, "parse_json", counted)
    monkeypatch.setattr(messages, "own_calls", answered)
    anthropic_state.windows[MODEL] = 12_000
    anthropic_state.responder = Model(mixed=mixed)
    url = anthropic_proxy(models_file=models_file(tmp_path, {MODEL: 12_000}))
    session = f"once-{mixed}"
    with anthropic_client(url, default_headers={"x-session-id": session}) as c:
        messages = start(c, False)
        messages.append({"role": "user", "content": "QUESTION: f1 - what was the secret?"})
        answer = ask(c, messages, False)
    assert [b.type for b in answer.content] == ["thinking", "text", "tool_use" if mixed else "text"]
    assert answers and all(read.count(a) == 1 for a in answers)  # read by own_calls, not again to be logged
    asked = [r for r in anthropic_state.message_requests if not is_summary_call(r.json)]
    assert len(read) == len(asked)  # one read an answer (the mixed one's rewritten bytes not read again)
    found = logged(url, session, 3)
    assert found["messages"][-1]["role"] == "assistant"
    assert found["messages"][-1]["content"] == echo(answer)["content"]
