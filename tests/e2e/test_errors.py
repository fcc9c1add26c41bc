"""End to end: bad input and a failing upstream answered with OpenAI's error envelope (issue 2, point 8).

Bad chat bodies are 400s; an unreachable upstream is a 502, a slow one a 504, each with a clear
message and never a stack trace. Whatever the upstream does, the client's messages are in the log.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.e2e.conftest import Proxy, Upstream
from tests.support.polling import wait_for

ENVELOPE_KEYS = {"message", "type", "param", "code"}
TRACE_MARKERS = ("Traceback", 'File "', "site-packages", "Error(", "\n  ")


def assert_envelope(body: Any, status_type: str) -> dict[str, Any]:
    """``body`` is OpenAI's error envelope of ``status_type``; returns its ``error`` object."""
    assert isinstance(body, dict) and set(body) == {"error"}
    error = body["error"]
    assert set(error) == ENVELOPE_KEYS
    assert error["type"] == status_type
    assert isinstance(error["message"], str) and error["message"]
    return error


def assert_no_stack_trace(text: str) -> None:
    for marker in TRACE_MARKERS:
        assert marker not in text


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def logged_messages(proxy: Proxy, session_id: str) -> list[dict[str, Any]]:
    with proxy.http() as http:
        resp = http.get(f"/sessions/{session_id}/messages")
    return resp.json()["data"] if resp.status_code == 200 else []


# --- 400s for bodies that are not chat requests ----------------------------------------------

BAD_BODIES = {
    "malformed_json": b'{"model": "gpt-4o", "messages": [',
    "not_utf8": b'{"model": "gpt-4o\xff\xfe"}',
    "empty": b"",
    "array": b'[{"role": "user", "content": "hi"}]',
    "string": b'"hello"',
    "missing_model": b'{"messages": [{"role": "user", "content": "hi"}]}',
    "model_not_string": b'{"model": 4, "messages": [{"role": "user", "content": "hi"}]}',
    "missing_messages": b'{"model": "gpt-4o"}',
    "empty_messages": b'{"model": "gpt-4o", "messages": []}',
    "messages_not_list": b'{"model": "gpt-4o", "messages": {"role": "user"}}',
    "message_not_object": b'{"model": "gpt-4o", "messages": ["hi"]}',
    "tool_calls_not_list": b'{"model": "gpt-4o", "messages": [{"role": "assistant", "tool_calls": {}}]}',
}
"""What the proxy cannot log or project. A role it does not know is not here: which roles are
valid is the provider's decision (``tests/e2e/test_unknown_roles.py``)."""


def test_bad_bodies_are_400_envelopes_raw(plain_proxy: Proxy, upstream: Upstream) -> None:
    with plain_proxy.http() as http:
        for name, body in BAD_BODIES.items():
            resp = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
            assert resp.status_code == 400, name
            assert resp.headers["content-type"].startswith("application/json"), name
            assert_envelope(resp.json(), "invalid_request_error")
            assert_no_stack_trace(resp.text)
    assert upstream.state.chat_requests == []  # refused before anything was forwarded


SDK_BAD_REQUESTS = [
    ({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}, "not an object"]}, "messages[1]"),
    ({"model": None, "messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"model": "gpt-4o", "messages": []}, "messages"),
    ({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "stream": True,
      "extra_body": {"messages": "not a list"}}, "messages"),
]


def test_bad_requests_through_sdk(plain_proxy: Proxy, upstream: Upstream) -> None:
    client = plain_proxy.client()
    for kwargs, param in SDK_BAD_REQUESTS:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(**kwargs)
        err = caught.value
        assert err.status_code == 400
        assert err.param == param
        assert err.type == "invalid_request_error"
        assert_no_stack_trace(err.response.text)
    assert upstream.state.chat_requests == []


async def test_bad_request_through_async_sdk(plain_proxy: Proxy) -> None:
    async with plain_proxy.async_client() as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="gpt-4o", messages=[], stream=True)
    assert caught.value.status_code == 400 and caught.value.param == "messages"


def test_unknown_proxy_route_is_404_envelope(plain_proxy: Proxy) -> None:
    with plain_proxy.http() as http:
        resp = http.get("/no/such/route")
    assert resp.status_code == 404
    assert_envelope(resp.json(), "not_found_error")


# --- the upstream fails -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_unreachable_upstream_is_502_and_messages_are_logged(proxy_factory: Callable[..., Proxy], stream: bool) -> None:
    proxy = proxy_factory(upstream_url=f"http://127.0.0.1:{closed_port()}/v1", upstream_connect_timeout_s=2.0)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Is anyone there?"}]
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as caught:
        proxy.client().chat.completions.create(model="gpt-4o", messages=messages, stream=stream,
                                               extra_headers={"X-Session-Id": "dead-upstream"})
    assert time.monotonic() - started < 5.0
    err = caught.value
    assert err.status_code == 502
    assert err.code == "upstream_unreachable"
    assert "could not be reached" in err.message
    assert_envelope(err.response.json(), "upstream_error")
    assert_no_stack_trace(err.response.text)

    logged = wait_for(lambda: logged_messages(proxy, "dead-upstream"))
    assert [(m["role"], m["content"]) for m in logged] == [(m["role"], m["content"]) for m in messages]


def test_unreachable_upstream_on_pass_through_is_502(proxy_factory: Callable[..., Proxy]) -> None:
    proxy = proxy_factory(upstream_url=f"http://127.0.0.1:{closed_port()}/v1")
    with proxy.http() as http:
        resp = http.get("/v1/models")
    assert resp.status_code == 502
    error = assert_envelope(resp.json(), "upstream_error")
    assert error["code"] == "upstream_unreachable"
    assert_no_stack_trace(resp.text)


SLOW_FAULTS = [(("delay", 1.0), False), (("delay", 1.0), True), (("stall", 1.0), False), (("stall", 1.0), True)]
"""``delay``: nothing before the time is up; ``stall``: headers at once, then silence."""


def test_slow_upstream_is_504(proxy_factory: Callable[..., Proxy], upstream: Upstream) -> None:
    proxy = proxy_factory(compaction_enabled=False, upstream_read_timeout_s=0.3)
    for n, (fault, stream) in enumerate(SLOW_FAULTS):
        upstream.state.fail_next.append(fault)
        content = f"Take your time ({n})."
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": content}], "stream": stream}
        started = time.monotonic()
        with proxy.http() as http:
            resp = http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": f"slow-upstream-{n}"})
        assert time.monotonic() - started < 0.9, fault  # the proxy's timeout answered, not the upstream
        assert resp.status_code == 504, fault
        error = assert_envelope(resp.json(), "upstream_error")
        assert error["code"] == "upstream_timeout"
        assert "did not answer in time" in error["message"]
        assert_no_stack_trace(resp.text)
        logged = wait_for(lambda n=n: logged_messages(proxy, f"slow-upstream-{n}"))
        assert [m["content"] for m in logged] == [content]


def test_slow_upstream_through_sdk_is_504(proxy_factory: Callable[..., Proxy], upstream: Upstream) -> None:
    proxy = proxy_factory(upstream_read_timeout_s=0.3)
    upstream.state.fail_next.append(("delay", 1.0))
    with pytest.raises(openai.APIStatusError) as caught:
        proxy.client().chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 504
    assert caught.value.code == "upstream_timeout"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_messages_logged_when_upstream_answers_500(proxy_factory: Callable[..., Proxy], upstream: Upstream, stream: bool) -> None:
    proxy = proxy_factory()
    upstream.state.fail_next.append(("status", 500, {"error": {"message": "boom", "type": "server_error", "param": None, "code": None}}))
    history = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "First answer"},
        {"role": "user", "content": "Second question, lost upstream"},
    ]
    with pytest.raises(openai.InternalServerError) as caught:
        proxy.client().chat.completions.create(model="gpt-4o", messages=history, stream=stream,
                                               extra_headers={"X-Session-Id": "upstream-500"})
    assert caught.value.status_code == 500 and caught.value.body["message"] == "boom"
    logged = wait_for(lambda: logged_messages(proxy, "upstream-500"))
    assert [(m["role"], m["content"]) for m in logged] == [(m["role"], m["content"]) for m in history]
    with proxy.http() as http:
        summary = wait_for(lambda: http.get("/sessions/upstream-500").json()["request_count"] == 1 and
                           http.get("/sessions/upstream-500").json())
    assert summary["message_count"] == 4  # no reply was invented


def test_cut_stream_is_reported_in_band(plain_proxy: Proxy, upstream: Upstream) -> None:
    """An upstream that drops the connection mid-stream: the client gets the chunks so far and an error event."""
    upstream.state.fail_next.append(("cut_stream", 3))
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "one two three four five six seven eight nine"}],
            "stream": True}
    with plain_proxy.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        raw = b"".join(resp.iter_raw())
    events = [e for e in raw.split(b"\n\n") if e]
    assert len(events) == 4 and b"[DONE]" not in raw
    assert b'"upstream_unreachable"' in events[-1]
    assert_no_stack_trace(raw.decode())


def test_client_read_timeout_does_not_break_proxy(plain_proxy: Proxy, upstream: Upstream) -> None:
    """A client that gives up (upstream stalled) leaves the proxy serving the next request."""
    upstream.state.fail_next.append(("delay", 1.0))
    client = plain_proxy.client(timeout=openai.Timeout(5.0, read=0.3))
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "slow"}])
    ok = plain_proxy.client().chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "fast"}])
    assert ok.choices[0].message.content == "OK: fast"
