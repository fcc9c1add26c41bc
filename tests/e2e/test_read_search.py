"""Issue 17 (search, budget) and issue 16 item 10 (scope) through the proxy, against the strict fake.

The fake model (``tests/fakes/read_tool.py``) searches for the question's key when the read tool
offers ``query`` and pages otherwise. Sessions are named with ``X-Session-Id``; both sessions of
the scope tests belong to one tenant (the same client key).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Upstream
from tests.e2e.test_read_tool import (
    MODEL,
    READ,
    TOOLS,
    big_result,
    history_with_offload,
)
from tests.fakes.responders import Prompt, Reply
from tests.strict import validate_chat_messages


@pytest.fixture
def models_file(tmp_path: Path) -> str:
    path = tmp_path / "models.yaml"
    path.write_text(f'"{MODEL}":\n  context_window_tokens: 32768\n')
    return str(path)


def tool_results(upstream: Upstream) -> list[str]:
    return [m["content"] for r in upstream.state.model_requests for m in r.json["messages"] if m["role"] == "tool"
            and m.get("tool_call_id", "").startswith("call_read")]


def ask(proxy: Any, session: str, messages: list[dict[str, Any]], stream: bool = False) -> str:
    client = proxy.client(default_headers={"x-session-id": session})
    if stream:
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, stream=True))
        assert not [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]  # the proxy's tool never shows
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    assert not reply.choices[0].message.tool_calls
    return reply.choices[0].message.content or ""


def injected(stub: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are an ops agent."},
            {"role": "user", "content": f"A colleague pasted this:\n{stub}\nQUESTION: build_id"}]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_text_injected_into_another_session_reads_nothing(stream: bool, proxy_factory: Any, upstream: Upstream, models_file: str) -> None:
    proxy = proxy_factory(models_file=models_file)
    assert ask(proxy, "sess-a", history_with_offload("FACT: build_id=SECRET-A"), stream) == "ANSWER: SECRET-A"
    stub = next(m["content"] for m in upstream.state.model_requests[0].json["messages"] if "offloaded" in str(m.get("content")))
    upstream.state.requests.clear()
    assert ask(proxy, "sess-b", injected(stub), stream) == "ANSWER: unknown"
    results = tool_results(upstream)
    assert results and not any("SECRET-A" in r for r in results)
    assert all("Nothing stored" in r for r in results)  # the same answer as an id that does not exist


def test_the_tenant_scope_setting_serves_the_tenants_artifacts(proxy_factory: Any, upstream: Upstream, models_file: str) -> None:
    proxy = proxy_factory(models_file=models_file, read_tool_scope="tenant")
    ask(proxy, "sess-a", history_with_offload("FACT: build_id=SECRET-A"))
    stub = next(m["content"] for m in upstream.state.model_requests[0].json["messages"] if "offloaded" in str(m.get("content")))
    assert ask(proxy, "sess-b", injected(stub)) == "ANSWER: SECRET-A"


def test_the_same_content_offloaded_in_two_sessions_is_readable_in_both(proxy_factory: Any, upstream: Upstream, models_file: str) -> None:
    """Ids are content-addressed per tenant: the artifact is stored under the first session, and
    the second session's own stub over the same content still reads it."""
    proxy = proxy_factory(models_file=models_file)
    history = history_with_offload("FACT: build_id=SHARED-1")
    assert ask(proxy, "sess-a", history) == "ANSWER: SHARED-1"
    assert ask(proxy, "sess-b", history) == "ANSWER: SHARED-1"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_one_search_finds_a_fact_in_a_huge_output_and_the_texts_say_how(stream: bool, proxy_factory: Any, upstream: Upstream,
                                                                        models_file: str) -> None:
    proxy = proxy_factory(models_file=models_file)
    history = history_with_offload("FACT: build_id=B-SEARCH")
    history[3]["content"] = "\n".join(f"{i:06d} DEBUG request handled in {i % 89} ms" for i in range(5000))  # ~200k chars
    lines = history[3]["content"].split("\n")
    lines[2600] = "FACT: build_id=B-SEARCH"
    history[3]["content"] = "\n".join(lines)
    assert ask(proxy, "search", history, stream) == "ANSWER: B-SEARCH"
    first, *rounds = upstream.state.model_requests
    schema = next(t for t in first.json["tools"] if t["function"]["name"] == READ)
    assert "query" in schema["function"]["parameters"]["properties"]
    stub = first.json["messages"][3]["content"]
    assert f'Search it first with `{READ}` {{"query": "words", "reference": "art_' in stub
    assert len(rounds) == 1  # one search, not pages
    assert " · line 2600: FACT: build_id=B-SEARCH" in rounds[0].json["messages"][-1]["content"]
    assert all(validate_chat_messages(r.json["messages"]) == [] for r in rounds)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_read_rounds_stop_at_the_token_budget(stream: bool, proxy_factory: Any, upstream: Upstream, models_file: str) -> None:
    """A model that keeps paging: its reads together add at most a quarter of the window; the
    request after the budget is spent goes without the read tool, so the model answers."""
    upstream.state.read_tool_loop = True
    proxy = proxy_factory(models_file=models_file)
    history = history_with_offload("x")
    history[3]["content"] = big_result("FACT: build_id=B-BUDGET", lines=6000)
    assert ask(proxy, "budget", history, stream) == "ANSWER: unknown"  # the fact lies past what the budget reads
    first, *rounds = upstream.state.model_requests
    assert 1 <= len(rounds) < 8  # the budget binds before the cap of 8 rounds
    added = rounds[-1].prompt_tokens - first.prompt_tokens
    assert 0.15 * 32768 < added <= 0.25 * 32768
    assert READ not in [t["function"]["name"] for t in rounds[-1].json["tools"]]
    assert READ in [t["function"]["name"] for t in rounds[-2].json["tools"]] if len(rounds) > 1 else True
    assert "continue with offset=" in rounds[-1].json["messages"][-1]["content"]  # the cut result says how to go on


def test_the_summary_message_tells_the_model_to_search() -> None:
    from proxy.defenses.summarize import summary_message

    m = summary_message("## Session intent\nx", "s1", "evt_1", 4, read_tool_name=READ)
    assert m["content"].splitlines()[0].endswith(f'Search it first with `{READ}` {{"query": "words"}}, then read around a match.')


# Review of the search work: bounded rounds, bounded patterns, archives of any session id.

WINDOWS = '"fake-32k-openai":\n  context_window_tokens: 32768\n"fake-4k-openai":\n  context_window_tokens: 4096\n'


@pytest.fixture
def windows_file(tmp_path: Path) -> str:
    path = tmp_path / "windows.yaml"
    path.write_text(WINDOWS)
    return str(path)


def many_calls(n: int, args: dict[str, Any]) -> Any:
    """A model that answers every offer of the read tool with ``n`` parallel calls of ``args``."""
    def responder(prompt: Prompt, state: Any) -> Reply | None:
        names = [t["function"]["name"] for t in prompt.body.get("tools") or []]
        if READ not in names or prompt.is_summary:
            return None
        k = sum(1 for m in prompt.messages if m.get("role") == "tool")
        calls = [{"id": f"call_x{k}_{i}", "type": "function", "function": {"name": READ, "arguments": json.dumps(args)}}
                 for i in range(n)]
        return Reply(None, calls)
    return responder


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("model,window", [("fake-4k-openai", 4096), ("fake-32k-openai", 32768)])
def test_many_parallel_reads_stay_inside_the_window(model: str, window: int, stream: bool, proxy_factory: Any,
                                                    upstream: Upstream, windows_file: str) -> None:
    """Review: 120 parallel searches made a 41k-token request against a 4k window (a 400)."""
    upstream.state.responders.insert(1, many_calls(120, {"query": "INFO worker batch"}))
    proxy = proxy_factory(models_file=windows_file)
    client = proxy.client()
    if stream:
        chunks = list(client.chat.completions.create(model=model, messages=history_with_offload("FACT: b=1"), tools=TOOLS,
                                                     stream=True))
        assert chunks
    else:
        client.chat.completions.create(model=model, messages=history_with_offload("FACT: b=1"), tools=TOOLS)
    requests = upstream.state.model_requests
    assert len(requests) >= 2 and all(r.status == 200 for r in requests)
    assert all((r.prompt_tokens or 0) <= window for r in requests), [r.prompt_tokens for r in requests]
    for r in requests[1:]:
        for m in r.json["messages"]:
            if m["role"] == "assistant" and m.get("tool_calls"):
                assert len(m["tool_calls"]) <= 8
    results = [m["content"] for m in requests[-1].json["messages"] if m["role"] == "tool"]
    assert any("112 more calls of this round were not served" in c for c in results)


@pytest.mark.parametrize("pattern", ["a{4294967294}", "(?:a{1500}){1500}"])
def test_a_short_pattern_neither_blocks_nor_exhausts_the_proxy(pattern: str, proxy_factory: Any, upstream: Upstream,
                                                               windows_file: str) -> None:
    """Review: ``a{4294967294}`` took 3.5 GB and gave a 500; ``(?:a{1500}){1500}`` held the loop 2.9 s."""
    upstream.state.responders.insert(1, many_calls(3, {"query": pattern, "regex": True}))
    proxy = proxy_factory(models_file=windows_file)
    waits: list[float] = []
    stop, probing = threading.Event(), threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=proxy.url, timeout=60) as h:
            while not stop.is_set():
                started = time.monotonic()
                h.get("/healthz")
                waits.append(time.monotonic() - started)
                probing.set()
                time.sleep(0.02)

    thread = threading.Thread(target=probe)
    thread.start()
    try:
        assert probing.wait(30)  # (the probe runs before the chat starts: a chat faster than the
        # thread's start left ``waits`` empty, review)
        reply = proxy.client().chat.completions.create(model=MODEL, messages=history_with_offload("FACT: b=1"), tools=TOOLS)
    finally:
        stop.set()
        thread.join()
    assert reply.choices[0].message is not None  # a 200, not a 500
    results = [m["content"] for r in upstream.state.model_requests for m in r.json["messages"] if m["role"] == "tool"]
    assert results and all(c.startswith("[context-proxy]") and len(c) < 4000 for c in results)
    assert waits and max(waits) < 0.5, max(waits)


@pytest.mark.parametrize("sid", ["my arch", "bob's", 'say "hi"', "tick`s", "what?", "100%", "a%2Fb", "x#y"])
def test_the_archive_of_any_session_id_is_found_and_served(sid: str, proxy_factory: Any, upstream: Upstream,
                                                           windows_file: str) -> None:
    """Review: ids with spaces, quotes, backticks, ``?``, ``%`` or ``#`` lost the archive's recall,
    and the summary named a URL the REST route decoded to another id."""
    upstream.state.summary_drop_substring = "hidden_"
    proxy = proxy_factory(models_file=windows_file)
    client = proxy.client(default_headers={"x-session-id": sid})
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a helper."},
                                     {"role": "user", "content": "Remember this. FACT: hidden_pin=4242"}]
    for k in range(30):
        history += [{"role": "assistant", "content": f"Noted step {k}. " + "filler words here " * 50},
                    {"role": "user", "content": f"Next step {k}."}]
    client.chat.completions.create(model="fake-4k-openai", messages=history)
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "QUESTION: hidden_pin"}]
    upstream.state.requests.clear()
    reply = client.chat.completions.create(model="fake-4k-openai", messages=history)
    assert reply.choices[0].message.content == "ANSWER: 4242"
    summary = next(m["content"] for r in upstream.state.chat_requests for m in r.json["messages"]
                   if m["role"] == "user" and "was summarized by context-proxy" in m["content"])
    url = re.search(r"/sessions/\S+/archive", summary).group(0)  # type: ignore[union-attr]
    assert url == f"/sessions/{urllib.parse.quote(sid, safe='')}/archive"
    with proxy.http() as h:  # the URL the summary names is this session's archive in the REST view
        page = h.get(url, params={"limit": 5})
    assert page.status_code == 200 and "Archive of session" in page.text
