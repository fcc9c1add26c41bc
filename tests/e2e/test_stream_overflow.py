"""Issue 15: streams hold only what carries nothing; one round loop; the provider's error as it came.

- An overflow that arrives as an error event in an HTTP 200 stream, before anything the stream
  carried (after a role-only chunk, a comment, in every framing of ``tests/fakes/stream_overflow.py``),
  is retried: the client sees only the retry's stream.
- An error event after content is relayed as it came.
- A streamed round of the proxy's read tool that overflows is compacted and retried, as the
  non-streamed one is (one round loop).
- When no retry is left (``max_overflow_retries``, or compaction disabled) the provider's last
  answer reaches the client as the provider sent it, with headers saying what was tried.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Proxy, Upstream
from tests.e2e.test_cases import load_case
from tests.support.shared import needs_exact_encodings

OVERFLOW_BODY = {"error": {"message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. "
                                      "Please reduce the length of the messages.",
                           "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}
ROLE = b'data: {"id":"chatcmpl-up","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}\n\n'
ERROR_EVENT = b"data: " + json.dumps(OVERFLOW_BODY, separators=(",", ":")).encode() + b"\n\n"
HI = [{"role": "user", "content": "hi"}]


def stream(proxy: Proxy, body: dict[str, Any]) -> tuple[httpx.Response, bytes]:
    with proxy.http() as http, http.stream("POST", "/v1/chat/completions", json=body | {"stream": True}) as r:
        return r, b"".join(r.iter_raw())


def data_events(raw: bytes) -> list[str]:
    return [e[len("data: "):] for e in raw.decode().split("\n\n") if e.startswith("data: ")]


# --- each streaming overflow shape is retried; the client sees only the retry's stream ---------

SHAPES = [
    "openai-midstream",  # a role-only chunk, then data: {"error": ...} (OpenAI's envelope), no [DONE]
    "openai-midstream+crlf",
    "llamacpp-stream+role",  # case 014's event after OpenAI's first chunk
    "llamacpp-stream+comment+role",
    "llamacpp-stream+crlf",  # CRLF line ends, a read ending between a CR and its LF
    "llamacpp-stream+cr",  # lone CR line ends
    "llamacpp-stream+unterminated",  # the error is the last bytes, without its blank line
    "llamacpp-stream+errorfield",  # llama.cpp's older `error: {...}` field
    "sse-error+role",  # event: error, after the role chunk
]


@pytest.mark.parametrize("shape", SHAPES)
def test_each_streaming_overflow_shape_is_retried(shape: str, proxy: Proxy, upstream: Upstream) -> None:
    case = load_case("014")
    body = case["request"] | {"model": f"fake-2k-{shape}"}
    r, raw = stream(proxy, body)
    assert r.status_code == 200
    events = data_events(raw)
    assert events.count("[DONE]") == 1 and events[-1] == "[DONE]", raw[:300]
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks) and b'{"error"' not in raw
    assert not any(line.startswith((b"error", b"event: error")) for line in raw.splitlines())
    assert {c["id"] for c in chunks} == {"chatcmpl-" + r.headers["x-request-id"].removeprefix("req_")}  # the retry's only
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "ANSWER: 1187"
    usage = [c for c in chunks if c.get("usage") and c["choices"] == []]
    assert len(usage) == 1 and usage[0]["usage"]["prompt_tokens"] <= 2048
    outcomes = [c.outcome for c in upstream.state.model_requests]
    assert outcomes[0] == "overflow" and outcomes[-1] == "ok" and outcomes.count("overflow") == 1
    assert r.headers["x-context-proxy-overflow-retries"] == "1"


def test_the_sdk_sees_only_the_retry(proxy: Proxy, upstream: Upstream) -> None:
    case = load_case("014")
    chunks = list(proxy.client().chat.completions.create(**(case["request"] | {"model": "fake-2k-openai-midstream", "stream": True})))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ANSWER: 1187"
    assert len({c.id for c in chunks}) == 1


# --- once something was relayed, an error event is relayed as it came --------------------------


def test_an_error_event_after_content_is_relayed_as_it_came(proxy: Proxy, upstream: Upstream) -> None:
    content = ROLE.replace(b'"role":"assistant","content":"","refusal":null', b'"content":"Hel"')
    parts = [ROLE, content, ERROR_EVENT]
    upstream.state.fail_next.append(("sse", parts))
    r, raw = stream(proxy, {"model": "gpt-4o", "messages": HI})
    assert r.status_code == 200
    assert raw == b"".join(parts)  # not retried, nothing added (the upstream's error says why it ended)
    assert len(upstream.state.chat_requests) == 1


# --- one round loop: a streamed read-tool round that overflows is compacted and retried -------

READ_MODEL = "fake-32k-openai"


def offloaded_history(fact: str) -> list[dict[str, Any]]:
    rows = [f"{i:05d} INFO worker-{i % 7} processed batch {i} in {i % 97} ms" for i in range(1500)]
    rows[40] = fact  # early in the artifact (a first read finds it) but not in the stub's preview
    return [
        {"role": "system", "content": "You are an ops agent."},
        {"role": "user", "content": "Fetch the deploy log."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "fetch_log", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "\n".join(rows)},
        {"role": "user", "content": "QUESTION: build_id"},
    ]


@needs_exact_encodings  # a page must overflow the provider's 7,000 tokens as it counts them
@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "json"])
def test_a_read_round_that_overflows_is_compacted_and_retried(streamed: bool, proxy_factory: Any, upstream: Upstream,
                                                               tmp_path: Path) -> None:
    """The proxy believes 32k; the provider serves 7,000 tokens, so the request after the read
    overflows. Both paths (one loop) learn, compact and ask again; a stream keeps relaying."""
    models = tmp_path / "models.yaml"
    models.write_text(f'"{READ_MODEL}":\n  context_window_tokens: 32768\n')
    upstream.state.windows[READ_MODEL] = 7000
    upstream.state.read_tool_search = False  # the model pages: a page is large enough to overflow
    proxy = proxy_factory(models_file=str(models))
    tools = [{"type": "function", "function": {"name": "fetch_log", "description": "Fetch a log.", "parameters": {"type": "object", "properties": {}}}}]
    body = {"model": READ_MODEL, "messages": offloaded_history("FACT: build_id=B-3141"), "tools": tools}
    if streamed:
        r, raw = stream(proxy, body | {"stream_options": {"include_usage": True}})
        events = data_events(raw)
        assert events.count("[DONE]") == 1 and events[-1] == "[DONE]", raw[-300:]
        chunks = [json.loads(e) for e in events[:-1]]
        assert not any("error" in c for c in chunks), raw[-300:]  # no 502 event
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert b"context_proxy_read" not in raw
    else:
        with proxy.http() as http:
            r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["message"]["content"]
    assert text == "ANSWER: B-3141"
    calls = upstream.state.model_requests
    assert [c.outcome for c in calls].count("overflow") == 1
    assert calls[-1].outcome == "ok" and calls[-1].prompt_tokens <= 7000


# --- no retry left: the provider's answer, as it sent it ------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
def test_the_providers_error_is_returned_unchanged_after_the_retries(streamed: bool, proxy: Proxy, upstream: Upstream) -> None:
    upstream.state.fail_next += [("status", 400, OVERFLOW_BODY)] * 5
    with proxy.http() as http:
        r = http.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": HI, "stream": streamed})
    assert r.status_code == 400
    assert r.content == json.dumps(OVERFLOW_BODY, separators=(",", ":")).encode()  # the provider's bytes
    assert r.headers["content-type"] == "application/json"
    # "hi" cannot be compacted: the same body would overflow again, so it is sent once
    assert len(upstream.state.chat_requests) == 1
    assert r.headers["x-context-proxy-overflow-retries"] == "0"
    assert r.headers["x-context-proxy-overflow"]  # the proxy recognized an overflow and says so


def test_text_the_client_saw_before_a_round_overflowed_is_not_said_again(proxy_factory: Any, upstream: Upstream,
                                                                        tmp_path: Path) -> None:
    """The model says something, then calls the read tool; the next round overflows. The retry
    keeps the rounds the client saw, so the model does not start over and repeat itself."""
    import dataclasses

    from tests.fakes import read_tool

    models = tmp_path / "models.yaml"
    models.write_text(f'"{READ_MODEL}":\n  context_window_tokens: 32768\n')
    upstream.state.windows[READ_MODEL] = 7000

    def chatty(prompt: Any, state: Any) -> Any:
        reply = read_tool.respond_read_tool(prompt, state)
        return dataclasses.replace(reply, content="Let me read the log. ") if reply is not None and reply.tool_calls else reply

    upstream.state.responders = [chatty if f is read_tool.respond_read_tool else f for f in upstream.state.responders]
    proxy = proxy_factory(models_file=str(models))
    tools = [{"type": "function", "function": {"name": "fetch_log", "description": "Fetch a log.", "parameters": {"type": "object", "properties": {}}}}]
    body = {"model": READ_MODEL, "messages": offloaded_history("FACT: build_id=B-3141"), "tools": tools}
    _, raw = stream(proxy, body)
    events = data_events(raw)
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    assert text.count("Let me read the log.") == 1, text


def test_a_stream_error_event_is_relayed_as_it_came_when_no_retry_is_left(proxy: Proxy, upstream: Upstream) -> None:
    upstream.state.fail_next += [("sse", [ROLE, ERROR_EVENT])] * 5
    r, raw = stream(proxy, {"model": "gpt-4o", "messages": HI})
    assert r.status_code == 200
    assert raw == ROLE + ERROR_EVENT  # the last attempt's stream, byte for byte; nothing of ours
    # "hi" cannot be compacted: the same body would overflow again, so it is not sent again
    assert len(upstream.state.chat_requests) == 1
    assert r.headers["x-context-proxy-overflow-retries"] == "0"


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
def test_with_compaction_disabled_the_providers_overflow_passes_through(streamed: bool, proxy_factory: Any, upstream: Upstream) -> None:
    proxy = proxy_factory(compaction_enabled=False)
    upstream.state.fail_next.append(("status", 400, OVERFLOW_BODY))
    with proxy.http() as http:
        r = http.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": HI, "stream": streamed})
    assert (r.status_code, r.content) == (400, json.dumps(OVERFLOW_BODY, separators=(",", ":")).encode())
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-context-proxy-overflow-retries"] == "0" and r.headers["x-context-proxy-overflow"]
    upstream.state.fail_next.append(("sse", [ROLE, ERROR_EVENT]))
    r, raw = stream(proxy, {"model": "gpt-4o", "messages": HI})
    assert (r.status_code, raw) == (200, ROLE + ERROR_EVENT)
    assert len(upstream.state.chat_requests) == 2


def test_the_last_attempt_of_a_stream_still_teaches_the_window(proxy_factory: Any, upstream: Upstream) -> None:
    """No retry left (none allowed here), the error event relayed as it came: the compactor has
    learned the window from it all the same, so the next request fits at once."""
    proxy = proxy_factory(max_overflow_retries=0)
    big = load_case("014")["request"] | {"model": "fake-2k-openai-midstream"}
    r, raw = stream(proxy, big)
    assert r.status_code == 200 and b"maximum context length is 2048 tokens" in raw and b"[DONE]" not in raw
    assert [c.outcome for c in upstream.state.model_requests] == ["overflow"]
    upstream.state.requests.clear()
    r, raw = stream(proxy, big)
    assert [c.outcome for c in upstream.state.model_requests] == ["ok"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in map(json.loads, data_events(raw)[:-1]) if c["choices"])
    assert text == "ANSWER: 1187"


def test_an_overflow_nothing_can_shrink_is_the_providers_own_answer_in_its_own_shape(proxy: Proxy, upstream: Upstream) -> None:
    """vLLM's error body has no ``error`` member ({"object": "error", ...}): it is passed through as
    it came, not rewrapped (found by the fuzz test of tests/reliability/test_bad_input.py)."""
    body = {"model": "fake-8k-vllm", "messages": [{"role": "system", "content": "0"}, {"role": "user", "content": "go"}],
            "max_tokens": 8182}
    with proxy.http() as http:
        r = http.post("/v1/chat/completions", json=body)
    direct = httpx.post(upstream.url + "/chat/completions", json=body)
    assert (r.status_code, r.json()) == (direct.status_code, direct.json()) and direct.status_code == 400
    assert "error" not in r.json() and r.headers["x-context-proxy-overflow"]
