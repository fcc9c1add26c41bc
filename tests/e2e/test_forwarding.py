"""End to end: the OpenAI surface forwarded faithfully (issue 2, points 3 and 9).

Real parts only: the proxy and the fake strict upstream each under uvicorn, the official
``openai`` SDK (sync and async, streaming and not) as the client, SQLite and PostgreSQL (the
``database_url`` fixture). Equivalence is checked against a second SDK client pointed straight at
the upstream with the same scripted reply: everything but the per-request ``id``/``created`` (the
fake numbers them per request) must be identical, chunk by chunk for streams.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import CLIENT_KEY, Proxy, Upstream

PER_REQUEST_FIELDS = ("id", "created")
"""Fields the fake upstream makes unique per request; everything else must match."""

SYSTEM = {"role": "system", "content": "You are a careful assistant."}
USER = {"role": "user", "content": "What is the weather in Paris and in Rome?"}

TEXT_REPLY = {"role": "assistant", "content": "It is sunny in Paris, and it rains in Rome today, sadly."}
PARALLEL_REPLY = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call_paris_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius", "days": 3}'}},
        {"id": "call_rome_2", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Rome", "unit": "celsius", "days": 3}'}},
    ],
}
CONTENT_AND_CALL_REPLY = {
    "role": "assistant",
    "content": "Let me look that up for you.",
    "tool_calls": [{"id": "call_look_1", "type": "function",
                    "function": {"name": "search", "arguments": '{"query": "weather Paris Rome"}'}}],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "search", "description": "Web search.",
                                      "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}},
]
REPLIES = {"text": TEXT_REPLY, "parallel_tool_calls": PARALLEL_REPLY, "content_and_call": CONTENT_AND_CALL_REPLY}


def direct_client(upstream: Upstream) -> openai.OpenAI:
    return openai.OpenAI(base_url=upstream.url, api_key=CLIENT_KEY, max_retries=0)


def direct_async_client(upstream: Upstream) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=upstream.url, api_key=CLIENT_KEY, max_retries=0)


def comparable(obj: Any) -> dict[str, Any]:
    """``model_dump`` of an SDK object without the per-request fields."""
    dumped = obj.model_dump()
    for key in PER_REQUEST_FIELDS:
        dumped.pop(key, None)
    return dumped


def request_kwargs(stream: bool) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"model": "gpt-4o", "messages": [SYSTEM, USER], "tools": TOOLS}
    if stream:
        kwargs["stream"] = True
        kwargs["stream_options"] = {"include_usage": True}
    return kwargs


# --- 1. the SDK receives the same thing through the proxy as straight from the upstream --------


def test_sync_non_streaming_same_as_direct(any_proxy: Proxy, upstream: Upstream) -> None:
    direct_sdk, proxy_sdk = direct_client(upstream), any_proxy.client()
    for name, reply in REPLIES.items():
        upstream.state.script.extend([reply, reply])
        direct = direct_sdk.chat.completions.create(**request_kwargs(False))
        via_proxy = proxy_sdk.chat.completions.create(**request_kwargs(False))

        assert comparable(via_proxy) == comparable(direct), name
        message = via_proxy.choices[0].message
        assert message.content == reply["content"]
        expected_calls = reply.get("tool_calls")
        assert [c.model_dump() for c in message.tool_calls or []] == (expected_calls or [])
        assert via_proxy.choices[0].finish_reason == ("tool_calls" if expected_calls else "stop")
        assert via_proxy.usage is not None and via_proxy.usage.total_tokens > 0
        assert via_proxy.usage == direct.usage


def test_sync_streaming_same_chunks_as_direct(any_proxy: Proxy, upstream: Upstream) -> None:
    direct_sdk, proxy_sdk = direct_client(upstream), any_proxy.client()
    for name, reply in REPLIES.items():
        upstream.state.script.extend([reply, reply])
        direct = [comparable(c) for c in direct_sdk.chat.completions.create(**request_kwargs(True))]
        via_proxy_chunks = list(proxy_sdk.chat.completions.create(**request_kwargs(True)))
        via_proxy = [comparable(c) for c in via_proxy_chunks]

        assert via_proxy == direct, name
        assert len(via_proxy) >= 4
        finish = [c.choices[0].finish_reason for c in via_proxy_chunks if c.choices and c.choices[0].finish_reason]
        assert finish == ["tool_calls" if reply.get("tool_calls") else "stop"]
        assert via_proxy_chunks[-1].usage is not None and via_proxy_chunks[-1].usage.completion_tokens > 0
        text = "".join(c.choices[0].delta.content or "" for c in via_proxy_chunks if c.choices)
        assert text == (reply["content"] or "")


async def test_async_non_streaming_same_as_direct(any_proxy: Proxy, upstream: Upstream) -> None:
    upstream.state.script.extend([PARALLEL_REPLY, PARALLEL_REPLY])
    async with direct_async_client(upstream) as direct_client_, any_proxy.async_client() as proxy_client:
        direct = await direct_client_.chat.completions.create(**request_kwargs(False))
        via_proxy = await proxy_client.chat.completions.create(**request_kwargs(False))
    assert comparable(via_proxy) == comparable(direct)
    assert [c.id for c in via_proxy.choices[0].message.tool_calls or []] == ["call_paris_1", "call_rome_2"]
    assert via_proxy.choices[0].finish_reason == "tool_calls"


async def test_async_streaming_same_chunks_as_direct(any_proxy: Proxy, upstream: Upstream) -> None:
    upstream.state.script.extend([CONTENT_AND_CALL_REPLY, CONTENT_AND_CALL_REPLY])
    async with direct_async_client(upstream) as direct_client_, any_proxy.async_client() as proxy_client:
        direct = [comparable(c) async for c in await direct_client_.chat.completions.create(**request_kwargs(True))]
        via_proxy = [comparable(c) async for c in await proxy_client.chat.completions.create(**request_kwargs(True))]
    assert via_proxy == direct
    arguments = "".join(
        (call["function"] or {}).get("arguments") or ""
        for chunk in via_proxy for choice in chunk["choices"] for call in choice["delta"].get("tool_calls") or []
    )
    assert arguments == CONTENT_AND_CALL_REPLY["tool_calls"][0]["function"]["arguments"]


def test_parallel_tool_results_round_trip(any_proxy: Proxy, upstream: Upstream) -> None:
    """The SDK's parallel calls, answered and sent back, pass the strict upstream's pairing check."""
    upstream.state.script.append(PARALLEL_REPLY)
    client = any_proxy.client()
    first = client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, USER], tools=TOOLS)
    calls = first.choices[0].message.tool_calls or []
    messages: list[Any] = [SYSTEM, USER, first.choices[0].message]
    messages += [{"role": "tool", "tool_call_id": c.id, "content": f"sunny in {c.id}"} for c in calls]
    second = client.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "OK: sunny in call_rome_2"
    assert upstream.state.chat_requests[-1].status == 200


def test_forwarded_body_is_the_clients_bytes(plain_proxy: Proxy, upstream: Upstream) -> None:
    """With the defenses off, the upstream receives the client's body byte for byte."""
    raw = b'{"model":"gpt-4o",  "messages":[{"role":"user","content":"caf\\u00e9 \xe2\x9c\x93"}],"x_vendor_field":{"keep":[1,2.50,null]}}'
    with plain_proxy.http() as http:
        resp = http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 200
    assert upstream.state.chat_requests[-1].body == raw


# --- 2. streaming is relayed as it arrives ----------------------------------------------------


def test_first_chunk_reaches_sdk_while_upstream_is_held(any_proxy: Proxy, upstream: Upstream) -> None:
    state = upstream.state
    gate = threading.Event()
    state.stream_gate, state.stream_gate_after_chunks, state.stream_gate_timeout_s = gate, 2, 30.0
    state.script.append(TEXT_REPLY)
    client = any_proxy.client(timeout=openai.Timeout(10.0, read=5.0))  # a buffering proxy would time out here
    started = time.monotonic()
    stream = client.chat.completions.create(model="gpt-4o", messages=[USER], stream=True)
    first = next(iter(stream))
    waited_s = time.monotonic() - started
    # the fake flags its first chunk right after writing it, so the flag may trail the client by a hair
    assert state.first_chunk_sent.wait(2.0) and not gate.is_set()
    assert waited_s < 5.0
    assert first.choices[0].delta.role == "assistant"
    gate.set()
    rest = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in [first, *rest] if c.choices) == TEXT_REPLY["content"]


async def test_first_bytes_reach_async_client_while_upstream_is_held(plain_proxy: Proxy, upstream: Upstream) -> None:
    state = upstream.state
    gate = threading.Event()
    state.stream_gate, state.stream_gate_after_chunks, state.stream_gate_timeout_s = gate, 1, 30.0
    body = {"model": "gpt-4o", "messages": [USER], "stream": True}
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=5.0)) as http:
        async with http.stream("POST", plain_proxy.url + "/v1/chat/completions", json=body,
                               headers={"authorization": f"Bearer {CLIENT_KEY}"}) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            parts = resp.aiter_raw()
            first = await parts.__anext__()
            assert first.startswith(b"data: ") and not gate.is_set()
            gate.set()
            rest = b"".join([p async for p in parts])
    assert (first + rest).endswith(b"data: [DONE]\n\n")


# --- 3. other /v1 paths pass through untouched -------------------------------------------------


def assert_no_session(proxy: Proxy) -> None:
    with proxy.http() as http:
        listing = http.get("/sessions").json()
    assert listing["data"] == []


def test_models_and_embeddings_pass_through(any_proxy: Proxy, upstream: Upstream) -> None:
    direct, via = direct_client(upstream), any_proxy.client()
    assert [m.model_dump() for m in via.models.list()] == [m.model_dump() for m in direct.models.list()]
    for encoding_format in ("float", "base64"):
        kwargs: dict[str, Any] = {"model": "text-embedding-3-small", "input": ["alpha", "beta gamma"],
                                  "encoding_format": encoding_format}
        got, expected = via.embeddings.create(**kwargs), direct.embeddings.create(**kwargs)
        assert [d.embedding for d in got.data] == [d.embedding for d in expected.data]
        assert got.usage == expected.usage and got.model == expected.model
    assert_no_session(any_proxy)


BINARY_BODY = bytes(range(256)) + b'{"model": "not-a-chat"}' + "ünïcode ✓".encode()


def test_echo_pass_through_is_exact(plain_proxy: Proxy, upstream: Upstream) -> None:
    query = "a=1&b=two%20words&b=again&empty=&sym=%E2%9C%93&plus=x+y"
    for method in ("POST", "PUT", "PATCH", "DELETE", "GET"):
        body = b"" if method == "GET" else BINARY_BODY
        with plain_proxy.http() as http:
            resp = http.request(method, f"/v1/echo/some/deep/path?{query}", content=body,
                                headers={"x-custom-header": "Value 1", "content-type": "application/octet-stream",
                                         "openai-organization": "org-xyz"})
        assert resp.status_code == 200, method
        echoed = resp.json()
        assert echoed["method"] == method
        assert echoed["path"] == "/v1/echo/some/deep/path"
        assert echoed["query"] == query
        assert base64.b64decode(echoed["body_b64"]) == body
        headers = {name: value for name, value in echoed["headers"]}
        assert headers["x-custom-header"] == "Value 1"
        assert headers["openai-organization"] == "org-xyz"
        assert headers["content-type"] == "application/octet-stream"
        assert headers["authorization"] == f"Bearer {CLIENT_KEY}"  # by default the client's key goes upstream
        received = upstream.state.requests[-1]
        assert (received.method, received.body, received.query) == (method, body, query)
    assert_no_session(plain_proxy)


def test_echo_status_and_streaming_pass_through(plain_proxy: Proxy, upstream: Upstream) -> None:
    with plain_proxy.http() as http:
        teapot = http.post("/v1/echo/x?status=418", content=b"short and stout")
        assert teapot.status_code == 418
        assert base64.b64decode(teapot.json()["body_b64"]) == b"short and stout"
        with http.stream("POST", "/v1/echo/stream?stream=1", content=BINARY_BODY) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            raw = b"".join(resp.iter_raw())
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    assert json.loads(events[0])["method"] == "POST"
    pieces = [base64.b64decode(json.loads(e)["body_b64"]) for e in events[1:-1]]
    assert len(pieces) == 3 and b"".join(pieces) == BINARY_BODY
    assert_no_session(plain_proxy)


def test_responses_api_passes_through(plain_proxy: Proxy, upstream: Upstream) -> None:
    direct = direct_client(upstream).responses.create(model="gpt-4o", input="Say hello")
    via = plain_proxy.client().responses.create(model="gpt-4o", input="Say hello")
    assert via.output_text == direct.output_text == "OK: Say hello"
    assert_no_session(plain_proxy)


# --- 4. headers and upstream errors passed back -----------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_response_headers_passed_back(any_proxy: Proxy, upstream: Upstream, stream: bool) -> None:
    body = {"model": "gpt-4o", "messages": [USER], "stream": stream}
    with any_proxy.http() as http:
        resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200
    received = upstream.state.chat_requests[-1]
    assert resp.headers["content-type"] == ("text/event-stream; charset=utf-8" if stream else "application/json")
    assert resp.headers["x-request-id"].startswith("req_8a7f3c9e12345")
    assert resp.headers["x-ratelimit-remaining-requests"] == "9999"
    assert resp.headers["x-ratelimit-remaining-tokens"] == "1999000"
    assert resp.headers["openai-processing-ms"] == "42"
    assert received.status == 200


RATE_LIMIT_BODY = {"error": {"message": "Rate limit reached for gpt-4o in organization org-1 on requests per min (RPM): "
                                        "Limit 3, Used 3, Requested 1. Please try again in 20s.",
                             "type": "requests", "param": None, "code": "rate_limit_exceeded"}}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_rate_limit_429_passed_through(any_proxy: Proxy, upstream: Upstream, stream: bool) -> None:
    headers = {"retry-after": "20", "x-ratelimit-limit-requests": "3", "x-ratelimit-reset-requests": "20s"}
    upstream.state.fail_next.append(("status", 429, RATE_LIMIT_BODY, headers))
    with pytest.raises(openai.RateLimitError) as caught:
        any_proxy.client().chat.completions.create(model="gpt-4o", messages=[USER], stream=stream)
    err = caught.value
    assert err.status_code == 429
    assert err.body == RATE_LIMIT_BODY["error"]
    assert err.response.headers["retry-after"] == "20"
    assert err.response.headers["x-ratelimit-reset-requests"] == "20s"
    assert err.response.headers["x-request-id"].startswith("req_")
    assert err.response.content == json.dumps(RATE_LIMIT_BODY, separators=(",", ":")).encode()


UPSTREAM_ERRORS = [
    (400, {"error": {"message": "Invalid value for 'temperature'.", "type": "invalid_request_error",
                     "param": "temperature", "code": "invalid_value"}}),
    (403, b"<html><body>Forbidden by the gateway</body></html>"),
    (500, "The server had an error while processing your request. Sorry about that!"),
    (503, {"error": {"message": "The engine is currently overloaded.", "type": "server_error", "param": None, "code": None}}),
]


def test_upstream_error_bodies_passed_through_unchanged(any_proxy: Proxy, upstream: Upstream) -> None:
    with any_proxy.http() as http:
        for status, body in UPSTREAM_ERRORS:
            expected = json.dumps(body, separators=(",", ":")).encode() if isinstance(body, dict) else (
                body.encode() if isinstance(body, str) else body)
            content_type = "application/json" if isinstance(body, dict) else "text/plain; charset=utf-8"
            for stream in (False, True):
                upstream.state.fail_next.append(("status", status, body))
                resp = http.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": [USER], "stream": stream})
                assert (resp.status_code, resp.content) == (status, expected)
                assert resp.headers["content-type"] == content_type
            upstream.state.fail_next.append(("status", status, body))
            other = http.post("/v1/embeddings", json={"model": "text-embedding-3-small", "input": "x"})
            assert (other.status_code, other.content) == (status, expected)
            assert other.headers["content-type"] == content_type
