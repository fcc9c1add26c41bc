"""Issue 4: the model reads back what was offloaded or summarized, through the proxy's own tool.

The fake model uses the read tool as a real model would (``tests/fakes/read_tool.py``): when a
question's answer is only in stored content, it calls the tool with the reference from the stub
or summary, then answers from what it read. The client never sees the proxy's tool.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.tools.schemas import compact_tool_schema, read_tool_schema
from tests.e2e.conftest import Upstream, wait_logged
from tests.fakes.responders import Prompt, Reply
from tests.strict import validate_chat_messages

MODEL = "fake-32k-openai"
READ = "context_proxy_read"


@pytest.fixture
def models_file(tmp_path: Path) -> str:
    path = tmp_path / "models.yaml"
    path.write_text(f'"{MODEL}":\n  context_window_tokens: 32768\n"fake-4k-openai":\n  context_window_tokens: 4096\n')
    return str(path)


def big_result(fact: str, lines: int = 1500) -> str:
    rows = [f"{i:05d} INFO worker-{i % 7} processed batch {i} in {i % 97} ms" for i in range(lines)]
    rows[lines // 3] = fact  # far from the preview's head and tail
    return "\n".join(rows)


def history_with_offload(fact: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are an ops agent."},
        {"role": "user", "content": "Fetch the deploy log."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "fetch_log", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": big_result(fact)},
        {"role": "user", "content": "QUESTION: build_id"},
    ]


TOOLS = [{"type": "function", "function": {"name": "fetch_log", "description": "Fetch a log.", "parameters": {"type": "object", "properties": {}}}}]


def test_answer_recovered_from_an_offloaded_result(proxy_factory: Any, upstream: Upstream, models_file: str) -> None:
    proxy = proxy_factory(models_file=models_file)
    reply = proxy.client().chat.completions.create(model=MODEL, messages=history_with_offload("FACT: build_id=B-7741"), tools=TOOLS)
    assert reply.choices[0].message.content == "ANSWER: B-7741"
    assert not reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "stop"
    first, *rounds = upstream.state.chat_requests
    assert "FACT: build_id" not in first.body.decode()  # only the stub went upstream
    assert [t["function"]["name"] for t in first.json["tools"]] == ["fetch_log", READ]  # appended after the client's
    assert 1 <= len(rounds) <= 3  # the model read in parts, as the tool result told it to
    read_result = rounds[-1].json["messages"][-1]
    assert read_result["role"] == "tool" and "FACT: build_id=B-7741" in read_result["content"]
    assert validate_chat_messages(rounds[-1].json["messages"]) == []


def test_answer_recovered_from_an_offloaded_result_streaming(proxy_factory: Any, upstream: Upstream, models_file: str) -> None:
    proxy = proxy_factory(models_file=models_file)
    body = {"model": MODEL, "messages": history_with_offload("FACT: build_id=B-7741"), "tools": TOOLS,
            "stream": True, "stream_options": {"include_usage": True}}
    with proxy.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as r:
        raw = b"".join(r.iter_raw()).decode()
    assert ": context-proxy" in raw  # keep-alive comment while the proxy served its tool
    events = [e[6:] for e in raw.split("\n\n") if e.startswith("data: ")]
    assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert READ not in raw
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "ANSWER: B-7741"
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    assert finishes == ["stop"]
    assert len([c for c in chunks if c.get("usage") and not c["choices"]]) == 1
    # the SDK sees a normal stream too
    stream = proxy.client().chat.completions.create(**{k: v for k, v in body.items() if k != "stream_options"})
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "ANSWER: B-7741"


def test_answer_recovered_from_the_archive(proxy_factory: Any, upstream: Upstream, models_file: str) -> None:
    upstream.state.summary_drop_substring = "hidden_"  # the summary misses it: only the archive has it
    proxy = proxy_factory(models_file=models_file)
    client = proxy.client(default_headers={"x-session-id": "arch"})
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a helper."},
                                     {"role": "user", "content": "Remember this. FACT: hidden_pin=4242"}]
    for k in range(30):  # grow past the 4k window's trigger so the start is summarized
        history += [{"role": "assistant", "content": f"Noted step {k}. " + "filler words here " * 50},
                    {"role": "user", "content": f"Next step {k}."}]
    client.chat.completions.create(model="fake-4k-openai", messages=history)
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "QUESTION: hidden_pin"}]
    upstream.state.requests.clear()
    reply = client.chat.completions.create(model="fake-4k-openai", messages=history)
    assert reply.choices[0].message.content == "ANSWER: 4242"
    results = [m["content"] for r in upstream.state.chat_requests for m in r.json["messages"] if m["role"] == "tool"]
    assert any("/sessions/arch/archive · line" in c and "hidden_pin=4242" in c for c in results)  # found by a search of the archive


def respond_mixed(prompt: Prompt, state: Any) -> Reply | None:
    names = [t["function"]["name"] for t in prompt.body.get("tools") or []]
    if READ not in names or any(m["role"] == "tool" and m.get("tool_call_id") == "c_client" for m in prompt.messages):
        return None
    return Reply(None, [
        {"id": "c_proxy", "type": "function", "function": {"name": READ, "arguments": '{"reference": "art_x"}'}},
        {"id": "c_client", "type": "function", "function": {"name": "fetch_log", "arguments": '{"n": 2}'}},
    ])


@pytest.mark.parametrize("stream", [False, True])
def test_mixed_proxy_and_client_calls_return_only_the_clients(
    stream: bool, proxy_factory: Any, upstream: Upstream, models_file: str
) -> None:
    upstream.state.responders.insert(1, respond_mixed)
    proxy = proxy_factory(models_file=models_file)
    messages = history_with_offload("FACT: build_id=B-1")[:-1] + [{"role": "user", "content": "go on"}]
    client = proxy.client()
    if stream:
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, stream=True))
        deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
        assert {d.index for d in deltas} == {0}
        assert {d.function.name for d in deltas if d.function and d.function.name} == {"fetch_log"}
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    else:
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        calls = reply.choices[0].message.tool_calls
        assert [c.function.name for c in calls] == ["fetch_log"] and calls[0].id == "c_client"
    assert len(upstream.state.chat_requests) == 1  # the proxy's call was dropped, not served
    assert upstream.state.chat_requests[0].json["tools"][-1] == read_tool_schema(READ)  # the shared schema, unchanged


def test_another_tenants_artifact_reads_nothing(proxy_factory: Any, upstream: Upstream, models_file: str) -> None:
    proxy = proxy_factory(models_file=models_file)
    proxy.client(key="sk-tenant-a").chat.completions.create(model=MODEL, messages=history_with_offload("FACT: build_id=SECRET-A"), tools=TOOLS)
    stub = upstream.state.chat_requests[0].json["messages"][3]["content"]
    upstream.state.requests.clear()
    reply = proxy.client(key="sk-tenant-b").chat.completions.create(model=MODEL, messages=[
        {"role": "user", "content": f"I found this: {stub}\nQUESTION: build_id"}], tools=TOOLS)
    assert reply.choices[0].message.content == "ANSWER: unknown"
    served = upstream.state.chat_requests[-1].json["messages"][-1]
    assert served["role"] == "tool" and "Nothing stored" in served["content"] and "SECRET-A" not in served["content"]


def test_read_works_after_a_restart(proxy_factory: Any, upstream: Upstream, models_file: str) -> None:
    first = proxy_factory(models_file=models_file)
    history = history_with_offload("FACT: build_id=B-RESTART")
    first.client().chat.completions.create(model=MODEL, messages=[*history[:-1], {"role": "user", "content": "thanks"}], tools=TOOLS)
    first.server.stop()
    second = proxy_factory(models_file=models_file)
    reply = second.client().chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
    assert reply.choices[0].message.content == "ANSWER: B-RESTART"


def test_rounds_are_bounded_when_the_model_keeps_reading(proxy_factory: Any, upstream: Upstream, models_file: str) -> None:
    upstream.state.read_tool_loop = True
    proxy = proxy_factory(models_file=models_file, read_tool_max_rounds=3, read_tool_budget_fraction=0.9)  # the round cap binds first
    reply = proxy.client().chat.completions.create(model=MODEL, messages=history_with_offload("FACT: build_id=B-9"), tools=TOOLS)
    assert not reply.choices[0].message.tool_calls
    assert reply.choices[0].message.content == "ANSWER: B-9"
    requests = upstream.state.chat_requests
    assert len(requests) == 4  # the first request and three served rounds, the last without the tool
    assert READ not in [t["function"]["name"] for t in requests[-1].json["tools"]]


def test_internal_rounds_are_logged_and_replayed_next_turn(proxy_factory: Any, upstream: Upstream, models_file: str) -> None:
    proxy = proxy_factory(models_file=models_file)
    client = proxy.client(default_headers={"x-session-id": "replayed"})
    history = history_with_offload("FACT: build_id=B-55")
    reply = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
    history += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "and now?"}]
    wait_logged(proxy, "replayed", 1)
    upstream.state.requests.clear()
    client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
    sent = upstream.state.chat_requests[0].json["messages"]
    roles = [m["role"] for m in sent]
    # user question, then the proxy's internal round (assistant call + tool result), then the answer
    q = next(i for i, m in enumerate(sent) if m.get("content") == "QUESTION: build_id")
    assert roles[q + 1 : q + 3] == ["assistant", "tool"]
    answer = next(i for i, m in enumerate(sent) if m.get("content") == "ANSWER: B-55")
    assert all(r in ("assistant", "tool") for r in roles[q + 1 : answer])
    assert sent[q + 1]["tool_calls"][0]["function"]["name"] == READ
    assert validate_chat_messages(sent) == []
    wait_logged(proxy, "replayed", 2)
    with proxy.http() as http:
        logged = http.get("/sessions/replayed/messages", params={"limit": 100}).json()["data"]
        summary = http.get("/sessions/replayed").json()
    internal = [m for m in logged if m["internal"]]
    assert internal and len(internal) % 2 == 0  # each round: the assistant's call and its tool result
    assert len(logged) == len(history) + len(internal) + 1  # client messages + internal rounds + last reply, once each
    assert summary["branch_count"] == 1


def respond_compact(prompt: Prompt, state: Any) -> Reply | None:
    names = [t["function"]["name"] for t in prompt.body.get("tools") or []]
    if "context_proxy_compact" not in names or "COMPACT NOW" not in prompt.last_user_text:
        return None
    if prompt.messages[-1]["role"] == "tool":
        return Reply("compaction requested: " + prompt.messages[-1]["content"][:200])
    return Reply(None, [{"id": f"c_compact_{len(prompt.messages)}", "type": "function", "function": {"name": "context_proxy_compact", "arguments": "{}"}}])


def test_manual_compaction_tool_is_opt_in_and_needs_half_the_trigger(proxy_factory: Any, upstream: Upstream, models_file: str) -> None:
    upstream.state.responders.insert(1, respond_compact)
    proxy = proxy_factory(models_file=models_file)
    small = [{"role": "user", "content": "COMPACT NOW"}]
    plain = proxy.client().chat.completions.create(model="fake-4k-openai", messages=small)
    assert "context_proxy_compact" not in upstream.state.chat_requests[-1].body.decode()  # not offered by default
    assert plain.choices[0].message.content.startswith("OK")
    client = proxy.client(default_headers={"x-context-proxy-compact-tool": "on", "x-session-id": "manual"})
    r1 = client.chat.completions.create(model="fake-4k-openai", messages=small)
    assert "Nothing to compact yet" in r1.choices[0].message.content
    long = [{"role": "user", "content": "Background. FACT: keep=1"}]
    for k in range(12):  # past half the trigger (1,740 of 3,481 tokens), under the trigger itself
        long += [{"role": "assistant", "content": f"step {k} " + "words " * 150}, {"role": "user", "content": f"next {k}"}]
    long.append({"role": "user", "content": "COMPACT NOW"})
    r2 = client.chat.completions.create(model="fake-4k-openai", messages=long)
    assert "Compacted" in r2.choices[0].message.content
    with proxy.http() as http:
        events = http.get("/sessions/manual/events").json()["data"]
    assert [e["kind"] for e in events] == ["summary"]
    sent = [t for r in upstream.state.chat_requests for t in (r.json or {}).get("tools") or ()
            if t["function"]["name"] == "context_proxy_compact"]
    assert sent and all(t == compact_tool_schema("context_proxy_compact") for t in sent)  # the shared schema, unchanged


def test_a_single_huge_line_is_read_in_parts(proxy_factory: Any, upstream: Upstream, models_file: str) -> None:
    """Minified JSON: one line of about 30k characters (over the offload threshold), the fact near its end, still reachable."""
    upstream.state.read_tool_search = False  # paging, not searching (a search finds it in one round)
    proxy = proxy_factory(models_file=models_file, read_tool_budget_fraction=0.9)  # pages past the default budget
    line = '{"rows": [' + ",".join(f'{{"id": {i}, "v": "x{i}"}}' for i in range(1300)) + '], "note": "FACT: build_id=B-LONG"}'
    messages = history_with_offload("x")
    messages[3] = {"role": "tool", "tool_call_id": "c1", "content": line}
    reply = proxy.client().chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    assert reply.choices[0].message.content == "ANSWER: B-LONG"
    first, *rounds = upstream.state.chat_requests
    assert "B-LONG" not in first.body.decode() and rounds  # offloaded, then read back as 2,000-character segments
    assert "lines 0-" in rounds[0].json["messages"][-1]["content"]


def test_read_tool_is_offered_only_while_the_messages_name_stored_content(proxy_factory: Any, upstream: Upstream, models_file: str) -> None:
    """No stub applies here: the tool follows what the client's own messages name, turn by turn
    (later turns answered by ``compactor.ReferenceMemo`` from the messages new since the last)."""
    proxy = proxy_factory(models_file=models_file)
    client = proxy.client(default_headers={"x-session-id": "names-stored"})
    art = "art_" + "0123456789abcdef" * 2

    def offered(messages: list[dict[str, Any]]) -> list[str]:
        client.chat.completions.create(model=MODEL, messages=messages)
        return [t["function"]["name"] for t in upstream.state.chat_requests[-1].json.get("tools") or []]

    history: list[dict[str, Any]] = [{"role": "user", "content": "Hello there."}]
    assert offered(history) == []
    history += [{"role": "assistant", "content": f"I saw {art} earlier."}, {"role": "user", "content": "Go on."}]
    assert offered(history) == []  # a bare id, and the body names no read URL: not offered (as before the memo)
    history += [{"role": "assistant", "content": f"It is at /artifacts/{art}?offset=0."}, {"role": "user", "content": "And?"}]
    assert offered(history) == [READ]
    history += [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Thanks."}]
    assert offered(history) == [READ]  # still named further back
    assert offered([history[0], {"role": "user", "content": "A new branch."}]) == []
