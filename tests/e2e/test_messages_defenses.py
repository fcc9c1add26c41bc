"""The defenses on Anthropic Messages (issue 19, item 3): the official ``anthropic`` SDK through the
proxy to the strict fake Anthropic provider, which verifies thinking signatures (bound to the
conversation before them), tool pairing and breakpoints, and answers overflows in the API's words.

- an agent's long tool session with thinking, at a window small enough that the proxy must
  summarize (streamed and not): every request accepted, the summary written by a ``/v1/messages``
  call of the client's own model, the facts of the summarized turns in it, the offloaded result
  readable through the read API;
- the provider's overflow (both 400 wordings, and an ``error`` event opening a 200 stream):
  compacted and retried before the client sees anything; other errors unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from proxy.defenses.summarize import SUMMARY_PHRASE
from tests.fakes.anthropic import FakeAnthropicState, reply, text, thinking, tool_use
from tests.fakes.anthropic.replies import Reply, last_user_text
from tests.support.anthropic_server import ANTHROPIC_KEY, anthropic_client

MODEL = "claude-small-test"
READ: Any = {"name": "read_file", "description": "Read a file",
             "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
SYSTEM: Any = [{"type": "text", "text": "You are a careful engineer.", "cache_control": {"type": "ephemeral"}}]
TASK = "Read every file of the project, one by one, and remember the facts in them."


def models_file(tmp_path: Path, windows: dict[str, int]) -> str:
    path = tmp_path / "models.yaml"
    path.write_text("".join(f'"{m}":\n  context_window_tokens: {w}\n' for m, w in windows.items()))
    return str(path)


def file_text(k: int, lines: int = 110) -> str:
    """A file's content (about 12 tokens a line) with one fact in its middle."""
    body = [f"line {i} of src/f{k}.py: total = compute({k * 1000 + i}, mode='fast')" for i in range(lines)]
    body.insert(lines // 2, f"FACT: f{k}=secret-{k * 7919}")
    return "\n".join(body)


def is_summary_call(body: Any) -> bool:
    return SUMMARY_PHRASE in last_user_text(body)


class Agent:
    """The scripted model: step ``k`` thinks and reads ``src/f{k}.py``, then answers; a summary
    call is answered with the facts its transcript holds (as a model quoting them would)."""

    def __init__(self, steps: int) -> None:
        self.steps, self.step = steps, 0

    def __call__(self, request: Any) -> Reply:
        if is_summary_call(request.json):
            facts = sorted(set(re.findall(r"FACT: \S+", last_user_text(request.json))))
            return reply(text("## Session intent\nRead every file.\n## Summary and decisions\n" + "\n".join(facts)))
        k, self.step = self.step, self.step + 1
        if k < self.steps:
            return reply(thinking(f"File {k} is next."), tool_use("read_file", {"path": f"src/f{k}.py"}))
        return reply(thinking("All read."), text("All files read."))


def run_agent(url: str, steps: int, *, stream: bool, session: str, big: int | None = None) -> list[Any]:
    """The client's loop through the SDK: ask, run the tool, echo the reply back; the messages sent
    last. ``big``: the step whose file is big enough to be offloaded."""
    messages: list[Any] = [{"role": "user", "content": TASK}]
    with anthropic_client(url, default_headers={"x-claude-code-session-id": session}) as c:
        for _ in range(steps + 1):
            args: Any = {"model": MODEL, "max_tokens": 1024, "system": SYSTEM, "tools": [READ],
                         "thinking": {"type": "adaptive"}, "messages": messages}
            if stream:
                with c.messages.stream(**args) as s:
                    message = s.get_final_message()
            else:
                message = c.messages.create(**args)
            messages = [*messages, {"role": "assistant", "content": [b.model_dump() for b in message.content]}]
            if message.stop_reason != "tool_use":
                return messages
            (call,) = [b for b in message.content if b.type == "tool_use"]
            k = int(call.input["path"][5:-3])
            content = file_text(k, 700 if k == big else 110)
            messages = [*messages, {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": content}]}]
    raise AssertionError("the agent did not finish")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_long_tool_session_with_thinking_is_summarized_and_every_request_is_accepted(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState, tmp_path: Path, stream: bool) -> None:
    steps = 14
    anthropic_state.windows[MODEL] = 12_000
    anthropic_state.responder = Agent(steps)
    url = anthropic_proxy(models_file=models_file(tmp_path, {MODEL: 12_000}))
    session = "0f6a3a5e-1d52-4c1e-9a52-5b8a3f0c9d11"
    final = run_agent(url, steps, stream=stream, session=session, big=2)
    assert final[-1]["content"][-1]["text"] == "All files read."

    seen = anthropic_state.message_requests
    rejected = [(r.status, r.error) for r in seen if r.status != 200]
    assert rejected == [], rejected  # signatures, pairing, breakpoints, windows: all accepted
    summaries = [r for r in seen if is_summary_call(r.json)]
    assert summaries, "a 14-step session of 1,300-token results at a 12k window must be summarized"
    for call in summaries:  # the client's own model, one user turn, nothing of the client's added
        assert call.path == "/v1/messages" and call.json["model"] == MODEL
        assert set(call.json) == {"model", "max_tokens", "messages"}
        assert ANTHROPIC_KEY in (call.headers.get("x-api-key"), call.headers.get("authorization", "")[7:])
    turns = [r for r in seen if not is_summary_call(r.json)]
    assert len(turns) == steps + 1  # every turn answered once: no retry was needed
    last = turns[-1].json["messages"]
    summary_turn = last[0]
    assert summary_turn["role"] == "user" and "[context-proxy]" in str(summary_turn["content"])
    assert "FACT: f0=secret-0" in str(summary_turn["content"])  # the summarized turns' facts, kept
    assert "system" in turns[-1].json and turns[-1].json["system"] == SYSTEM  # never rewritten
    assert last[-1] == final[-2]  # the latest tool result as sent
    # Thinking is bound to the conversation before it: the turns made before a summary took effect
    # are forwarded without theirs (in the request that applied it, the latest one too); every
    # turn made since, over the projected prefix, is forwarded as the client sent it.
    by_id = {b["id"]: m for m in final if m["role"] == "assistant" for b in m["content"] if b["type"] == "tool_use"}
    first = min(i for i, r in enumerate(seen) if is_summary_call(r.json))
    after = [r for i, r in enumerate(seen) if i > first + 1 and not is_summary_call(r.json)
             and not is_summary_call(seen[i - 1].json)]
    assert len(after) >= 3, str([("S" if is_summary_call(r.json) else r.input_tokens) for r in seen])
    for r in after:
        latest = [m for m in r.json["messages"] if m["role"] == "assistant"][-1]
        (call,) = [b["id"] for b in latest["content"] if b["type"] == "tool_use"] or [None]
        if call is not None:
            assert latest == by_id[call] and latest["content"][0]["type"] == "thinking"

    # the offloaded result (step 2) is named by a stub and readable through the read API
    stubs = [b["content"] for r in turns for m in r.json["messages"] if isinstance(m["content"], list)
             for b in m["content"] if b.get("type") == "tool_result" and "[context-proxy]" in str(b["content"])]
    assert stubs, "the 8,000-token result must be offloaded"
    artifact = re.search(r"/artifacts/([A-Za-z0-9_]+)", str(stubs[0]))
    assert artifact is not None, stubs[0]
    with httpx.Client(base_url=url, headers={"x-api-key": ANTHROPIC_KEY}, timeout=30) as http:
        r = http.get(f"/artifacts/{artifact.group(1)}")
        assert r.status_code == 200 and "FACT: f2=secret-15838" in r.text
        logged = http.get(f"/sessions/{session}").json()
        assert logged["api"] == "messages" and logged["request_count"] == steps + 1, logged  # summary calls apart
        events = http.get(f"/sessions/{session}/events").json()["data"]
        assert 1 <= len(events) <= len(summaries) and {e["kind"] for e in events} == {"summary"}  # (a call per chunk)


def _history(cycles: int) -> list[Any]:
    messages: list[Any] = [{"role": "user", "content": TASK}]
    for k in range(cycles):
        messages.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_{k:02d}", "name": "read_file", "input": {"path": f"src/f{k}.py"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{k:02d}", "content": file_text(k)}]})
    return messages


@pytest.mark.parametrize(("wording", "stream"), [("prompt", False), ("prompt", True), ("max_tokens", False),
                                                ("max_tokens", True), ("stream_event", True)])
def test_an_overflow_is_compacted_and_retried_before_the_client_sees_it(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState, wording: str, stream: bool) -> None:
    model = "claude-sonnet-4-5"  # the proxy believes its 200k window; the provider has less
    history = _history(8)  # about 11,000 tokens
    max_tokens = 1024
    if wording == "prompt":
        anthropic_state.windows[model] = 8_000
    elif wording == "max_tokens":  # the prompt fits, not with the reply's room
        anthropic_state.windows[model] = 12_000
        max_tokens = 4_000
    else:  # the provider says it in a 200 stream's first event (only a stream carries it)
        anthropic_state.fail_next.append(("stream_error", "invalid_request_error",
                                          "prompt is too long: 211000 tokens > 200000 maximum"))
    url = anthropic_proxy()
    with anthropic_client(url) as c:
        args: Any = {"model": model, "max_tokens": max_tokens, "tools": [READ], "messages": history}
        if stream:
            with c.messages.with_streaming_response.create(**args, stream=True) as raw:
                headers = raw.headers
                body = b"".join(raw.iter_bytes())
            assert b"event: error" not in body and b"event: message_stop" in body
        else:
            resp = c.messages.with_raw_response.create(**args)
            headers, message = resp.headers, resp.parse()
            assert message.content[0].type == "text"
    assert headers["x-context-proxy-overflow-retries"] == "1", dict(headers)
    assert "summary" in headers["x-context-proxy-defenses"]
    seen = anthropic_state.message_requests
    outcomes = [("summary" if is_summary_call(r.json) else r.outcome) for r in seen]
    assert outcomes[0] in ("overflow", "fault") and outcomes[-1] == "ok" and "summary" in outcomes, outcomes
    retried = seen[-1].json
    assert retried["messages"][0]["role"] == "user" and "[context-proxy]" in str(retried["messages"][0]["content"])
    # the client's tool first, then the proxy's read tool (a summary names the archive)
    assert retried["max_tokens"] == max_tokens and retried["tools"][0] == READ
    assert [t["name"] for t in retried["tools"][1:]] == ["context_proxy_read"]
    assert set(retried["tools"][1]) == {"name", "description", "input_schema"}  # Anthropic's tool shape


def test_an_error_that_is_not_an_overflow_goes_back_as_the_provider_sent_it(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState) -> None:
    url = anthropic_proxy()
    history = _history(2)
    history[-1]["content"][0]["tool_use_id"] = "toolu_nobody"  # a result answering no call
    with anthropic_client(url) as c, pytest.raises(anthropic.BadRequestError) as err:
        c.messages.create(model="claude-sonnet-4-5", max_tokens=100, messages=history)
    assert "tool_result" in str(err.value) and err.value.response.headers.get("x-context-proxy-overflow-retries") is None
    assert len(anthropic_state.message_requests) == 1  # not retried


def test_count_tokens_counts_the_request_the_proxy_would_forward(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState,
        anthropic_fake: tuple[str, FakeAnthropicState], tmp_path: Path) -> None:
    steps = 10
    anthropic_state.windows[MODEL] = 12_000
    anthropic_state.responder = Agent(steps)
    url = anthropic_proxy(models_file=models_file(tmp_path, {MODEL: 12_000}))
    session = "4e0c5e3e-7d52-4c1e-9a52-5b8a3f0c9d22"
    final = run_agent(url, steps, stream=False, session=session)
    history = final[:-1]  # what the last request sent
    last = [r for r in anthropic_state.message_requests if not is_summary_call(r.json)][-1]
    args: Any = {"model": MODEL, "system": SYSTEM, "tools": [READ], "thinking": {"type": "adaptive"},
                 "messages": history}
    with anthropic_client(url, default_headers={"x-claude-code-session-id": session}) as c:
        counted = c.messages.count_tokens(**args).input_tokens
    # the client's history as it stands (without thinking: its later turns were made, and signed,
    # over the proxy's projection, and the provider binds them to that)
    unchecked = {k: v for k, v in args.items() if k != "thinking"} | {"model": "claude-wide"}  # (a 200k window)
    with anthropic_client(anthropic_fake[0]) as direct:
        whole = direct.messages.count_tokens(**unchecked).input_tokens
    count = [r for r in anthropic_state.requests if r.path == "/v1/messages/count_tokens"][0]  # (through the proxy)
    assert count.input_tokens == counted and "max_tokens" not in count.json
    # what the last request forwarded: the summary, the stale thinking left out; only its trailing
    # results may differ (the count reserves no reply's room: it names no max_tokens, so the
    # results a reply's room had clipped fit)
    assert count.json["messages"][:-1] == last.json["messages"][:-1]
    assert "[context-proxy]" in str(count.json["messages"][0]["content"])
    assert counted < whole and whole > 12_000
    with anthropic_client(url) as c:  # another session (none stored under this id): the client's own size
        assert c.messages.count_tokens(**unchecked, extra_headers={"x-claude-code-session-id": "nobody"}
                                       ).input_tokens == whole
    assert not [r for r in anthropic_state.requests if r.path.endswith("count_tokens") and is_summary_call(r.json)]


def test_a_body_over_the_providers_byte_limit_has_its_older_images_offloaded(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState) -> None:
    """A 413 ``request_too_large`` (the body's bytes, not its tokens) is answered by offloading the
    inline images of all but the newest user turn, not by summarizing text (case 019's kind)."""
    import base64
    import os

    anthropic_state.max_body_bytes = 1_500_000
    image = lambda: {"type": "image", "source": {  # noqa: E731  (about 530 KB of base64 each)
        "type": "base64", "media_type": "image/png", "data": base64.b64encode(os.urandom(400_000)).decode()}}
    messages: list[Any] = []
    for k in range(3):
        messages.append({"role": "user", "content": [image(), {"type": "text", "text": f"Screenshot {k}: what changed?"}]})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Step {k} changed the header."}]})
    messages.append({"role": "user", "content": [image(), {"type": "text", "text": "And now?"}]})
    url = anthropic_proxy()
    with anthropic_client(url) as c:
        resp = c.messages.with_raw_response.create(model="claude-sonnet-4-5", max_tokens=100, messages=messages)
    assert resp.parse().content[0].type == "text"
    assert resp.headers["x-context-proxy-overflow-retries"] == "1" and "media" in resp.headers["x-context-proxy-defenses"]
    seen = anthropic_state.message_requests
    assert [r.status for r in seen] == [413, 200] and not [r for r in seen if is_summary_call(r.json)]
    sent = seen[-1].json["messages"]
    assert [b["type"] for b in sent[-1]["content"]] == ["image", "text"]  # the newest turn's image kept
    for turn in sent[:-1:2]:  # the older ones: a reference in the image's place, the text kept
        assert [b["type"] for b in turn["content"]] == ["text", "text"] and "/artifacts/" in turn["content"][0]["text"]
    # the session's artifacts: each image, from the turn that carried it (issue 20)
    from tests.support.polling import wait_for

    with httpx.Client(base_url=url, headers={"x-api-key": ANTHROPIC_KEY}, timeout=30) as http:
        session = wait_for(lambda: (http.get("/sessions").json()["data"] or [None])[0], 10.0)
        assert session is not None

        def all_logged() -> list[dict[str, Any]] | None:
            page: list[dict[str, Any]] = http.get(f"/sessions/{session['id']}/messages").json()["data"]
            return page if len(page) == 8 else None  # the 7 turns sent and the reply

        logged = wait_for(all_logged, 10.0)
        assert logged is not None
        artifacts = http.get(f"/sessions/{session['id']}/artifacts").json()["data"]
    urls = {f"data:image/png;base64,{m['content'][0]['source']['data']}": m["id"] for m in logged[:-2:2]}
    assert len(artifacts) == 3 and {a["message"] for a in artifacts} == set(urls.values())
    for artifact in artifacts:
        url_of = next(u for u, message in urls.items() if message == artifact["message"])
        assert (artifact["kind"], artifact["media_type"], artifact["bytes"]) == ("image", "image/png", len(url_of))
        assert artifact["id"] in str(sent)


@pytest.mark.parametrize("shape", ["text", "tool"])
def test_a_replys_usage_calibrates_the_estimate_for_tool_conversations_too(
        shape: str, anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState, tmp_path: Path) -> None:
    """Tool calls, results and thinking are counted, not estimated: a Messages reply's usage
    calibrates the estimate ratio for them as for text (found by breaking the route: only chat's
    text part types counted as text, so no agent request on Messages ever calibrated it)."""
    from tests.support.polling import wait_for

    anthropic_state.windows[MODEL] = 100_000
    anthropic_state.responder = lambda request: reply(text("ok " * 50))
    url = anthropic_proxy(models_file=models_file(tmp_path, {MODEL: 100_000}), admin_api_keys=ANTHROPIC_KEY)
    messages: list[Any] = [{"role": "user", "content": file_text(0, 200)}]
    if shape == "tool":
        messages = [{"role": "user", "content": "go"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_a", "name": "read_file",
                                                       "input": {"path": "x"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a",
                                                  "content": file_text(0, 200)}]}]
    with httpx.Client(base_url=url, headers={"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"},
                      timeout=60) as http:
        for _ in range(4):
            r = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 100, "tools": [READ],
                                                "messages": messages})
            assert r.status_code == 200, r.text
        learned = wait_for(lambda: http.get("/limits").json()["data"] or None, 10.0)
    assert learned and learned[0]["model"] == MODEL, learned


def test_a_413_offloads_the_screenshots_older_tool_results_carry(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState) -> None:
    """Screenshots come back inside ``tool_result`` blocks (Claude Code's Read of an image, a
    browser tool): after a 413 those of older results are offloaded in place, the result keeping
    its ``tool_use_id`` and its pairing, the newest one kept."""
    import base64
    import os

    anthropic_state.max_body_bytes = 1_500_000
    messages: list[Any] = [{"role": "user", "content": "Check the page after each change."}]
    for k in range(4):
        shot = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                            "data": base64.b64encode(os.urandom(400_000)).decode()}}
        messages.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_shot{k}", "name": "screenshot", "input": {}}]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_shot{k}",
                                                      "content": [shot, {"type": "text", "text": f"page {k}"}]}]})
    url = anthropic_proxy()
    with anthropic_client(url) as c:
        resp = c.messages.with_raw_response.create(model="claude-sonnet-4-5", max_tokens=100, messages=messages)
    assert resp.parse().content[0].type == "text" and "media" in resp.headers["x-context-proxy-defenses"]
    seen = anthropic_state.message_requests
    assert [r.status for r in seen] == [413, 200]
    results = [m["content"][0] for m in seen[-1].json["messages"] if m["role"] == "user" and isinstance(m["content"], list)]
    assert [r["tool_use_id"] for r in results] == [f"toolu_shot{k}" for k in range(4)]
    assert [b["type"] for b in results[-1]["content"]] == ["image", "text"]  # the newest kept
    for r in results[:-1]:
        assert [b["type"] for b in r["content"]] == ["text", "text"] and "/artifacts/" in r["content"][0]["text"]
