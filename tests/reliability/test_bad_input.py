"""Bad input (issue 5, point 3): oversized, malformed, ill-typed, unknown roles, invalid UTF-8,
huge or malformed base64 images, deep nesting, missing fields. Each is a 4xx in OpenAI's error
envelope (never a 5xx) and the turn logged before the garbage is still whole afterwards. Then
hypothesis fuzzes the chat endpoint with generated bodies (bounded examples)."""

from __future__ import annotations

import base64
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import Proxy, Upstream
from tests.reliability.probes import TALLY, assert_envelope

MAX_BODY_BYTES = 64 * 1024
FUZZ_EXAMPLES = int(os.environ.get("CONTEXT_PROXY_FUZZ_EXAMPLES", "200"))


def user(content: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": [{"role": "user", "content": content}]}


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def image(data_url: str) -> dict[str, Any]:
    return user([{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": data_url}}])


REFUSED: dict[str, bytes] = {
    "empty body": b"",
    "malformed JSON": b'{"model": "gpt-4o", "messages": [',
    "not an object": b"[1, 2, 3]",
    "a string": b'"hello"',
    "missing model": orjson.dumps({"messages": [{"role": "user", "content": "x"}]}),
    "missing messages": orjson.dumps({"model": "gpt-4o"}),
    "empty object": b"{}",
    "model not a string": orjson.dumps({"model": 5, "messages": [{"role": "user", "content": "x"}]}),
    "messages not a list": orjson.dumps({"model": "gpt-4o", "messages": "hello"}),
    "messages empty": orjson.dumps({"model": "gpt-4o", "messages": []}),
    "message not an object": orjson.dumps({"model": "gpt-4o", "messages": [1]}),
    "unknown role": orjson.dumps({"model": "gpt-4o", "messages": [{"role": "wizard", "content": "x"}]}),
    "role a list (found by the fuzzer: was a 500)": orjson.dumps({"model": "gpt-4o", "messages": [{"role": ["user"], "content": "x"}]}),
    "role an object": orjson.dumps({"model": "gpt-4o", "messages": [{"role": {"a": 1}, "content": "x"}]}),
    "missing role": orjson.dumps({"model": "gpt-4o", "messages": [{"content": "x"}]}),
    "tool_calls not a list": orjson.dumps({"model": "gpt-4o", "messages": [{"role": "assistant", "content": None, "tool_calls": "x"}]}),
    "stream not a boolean": orjson.dumps(user("x") | {"stream": "yes"}),
    "tools not a list": orjson.dumps(user("x") | {"tools": {"a": 1}}),
    "invalid UTF-8": b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "\xff\xfe\xfd"}]}',
    "NaN": b'{"model": "gpt-4o", "messages": [{"role": "user", "content": NaN}]}',
    "integer past 64 bits": b'{"model": "gpt-4o", "max_tokens": 1' + b"0" * 400 + b', "messages": [{"role": "user", "content": "x"}]}',
    "nested 5000 deep": b'{"model": "gpt-4o", "messages": [{"role": "user", "content": ' + b"[" * 5000 + b"]" * 5000 + b"}]}",
}
"""Bodies the proxy itself must refuse with a 4xx (it never forwards them)."""

FORWARDED: dict[str, bytes] = {
    "malformed base64 image": orjson.dumps(image("data:image/png;base64,!!!not*base64@@")),
    "truncated base64 image": orjson.dumps(image("data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 5).decode()[:-3])),
    "base64 that is not an image": orjson.dumps(image("data:image/png;base64," + base64.b64encode(os.urandom(30_000)).decode())),
    "image with no data": orjson.dumps(image("data:image/png;base64,")),
    "image_url not a string": orjson.dumps(user([{"type": "image_url", "image_url": {"url": 12}}])),
    "unknown content part": orjson.dumps(user([{"type": "hologram", "hologram": {"x": 1}}])),
    "content an integer": orjson.dumps(user(5)),
    "NUL characters": orjson.dumps(user("a\u0000b")),
    "nested 100 deep": orjson.dumps(user(nested(100))),
    "nested 300 deep (past orjson's writer: it was a 400 of the proxy's)":
        b'{"model": "gpt-4o", "messages": [{"role": "user", "content": ' + b"[" * 300 + b"]" * 300 + b"}]}",
    "tool message without id": orjson.dumps({"model": "gpt-4o", "messages": [{"role": "tool", "content": "x"}]}),
    "lone surrogate": b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "\\ud800"}]}',  # valid JSON (proxy.json_text)
}
"""Bodies the proxy may forward (the provider validates them): any status but never a 5xx."""


def logged(http: httpx.Client, session_id: str, requests: int, timeout_s: float = 10) -> list[dict[str, Any]]:
    """The session's messages once ``requests`` requests are logged (the log is written after the reply)."""
    deadline = time.monotonic() + timeout_s
    while http.get(f"/sessions/{session_id}").json().get("request_count", 0) < requests:
        assert time.monotonic() < deadline, f"session {session_id} never reached {requests} logged requests"
        time.sleep(0.02)
    return http.get(f"/sessions/{session_id}/messages").json()["data"]


def post(http: httpx.Client, content: bytes | Iterator[bytes], session: str | None = None) -> httpx.Response:
    headers = {"content-type": "application/json"} | ({"x-session-id": session} if session else {})
    return http.post("/v1/chat/completions", content=content, headers=headers)


def test_every_bad_body_is_a_4xx_envelope_and_the_log_survives(proxy_factory: Callable[..., Proxy], upstream: Upstream) -> None:
    proxy = proxy_factory(max_body_bytes=MAX_BODY_BYTES)
    with proxy.http() as http:
        ok = post(http, orjson.dumps(user("a valid first turn")), "garbage")
        assert ok.status_code == 200
        before = logged(http, "garbage", 1)
        for name, body in REFUSED.items():
            r = post(http, body, "garbage")
            assert 400 <= r.status_code < 500, (name, r.status_code, r.text[:200])
            assert_envelope(r)
            TALLY.add("bad_input_cases")
        huge = orjson.dumps(user("x" * (MAX_BODY_BYTES + 1)))
        assert_envelope(post(http, huge, "garbage"), 413)
        chunked = post(http, iter([huge[:1000], huge[1000:]]), "garbage")  # no content-length: counted while read
        assert_envelope(chunked, 413)
        TALLY.add("bad_input_cases", 2)
        for name, body in FORWARDED.items():
            r = post(http, body, f"forwarded-{name}")
            assert r.status_code < 500, (name, r.status_code, r.text[:300])
            if r.status_code >= 400:
                assert_envelope(r)
            TALLY.add("bad_input_cases")
        big_image = orjson.dumps(image("data:image/png;base64," + base64.b64encode(os.urandom(3 * 1024 * 1024)).decode()))
        assert_envelope(post(http, big_image, "garbage"), 413)
        after = http.get("/sessions/garbage/messages", params={"leaf": before[-1]["id"]}).json()["data"]
    assert after == before  # the turn logged before the garbage is whole
    assert [m["role"] for m in before] == ["user", "assistant"] and before[0]["content"] == "a valid first turn"
    TALLY.add("requests", len(REFUSED) + len(FORWARDED) + 5)


# --- fuzzing --------------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=15,
)
ROLES = st.sampled_from(["system", "user", "assistant", "tool", "developer", "function", "wizard", "", "USER"]) | JSON
PART = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "input_audio", "file", "x"]) | JSON},
    optional={"text": st.text(max_size=50) | JSON,
              "image_url": st.fixed_dictionaries({"url": st.sampled_from(["data:image/png;base64,", "data:image/png;base64,iVBORw0KGgo=",
                                                                         "http://example.invalid/x.png", "data:,x"]) | st.text(max_size=40)})},
)
CALL = st.fixed_dictionaries({"id": st.text(max_size=8) | JSON, "type": st.just("function") | JSON,
                              "function": st.fixed_dictionaries({"name": st.text(max_size=8) | JSON, "arguments": st.text(max_size=20) | JSON})})
MESSAGE = st.fixed_dictionaries(
    {"role": ROLES},
    optional={"content": st.none() | st.text(max_size=200) | st.lists(PART, max_size=3) | JSON,
              "tool_calls": st.lists(CALL, max_size=2) | JSON, "tool_call_id": st.text(max_size=8) | JSON, "name": st.text(max_size=8) | JSON},
)
FUNCTION = st.fixed_dictionaries({"name": st.text(max_size=8) | JSON},
                                  optional={"parameters": st.just({"type": "object"}) | JSON, "description": JSON, "strict": JSON})
TOOLS = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["function", "custom"]) | JSON}, optional={"function": FUNCTION | JSON})
                 | JSON, max_size=3)
"""``tools`` shapes (issue 16, item 12: a ``function`` that was a string, a list or a number was a 500)."""
BODY = st.fixed_dictionaries(
    {"model": st.sampled_from(["gpt-4o", "fake-8k-openai", "fake-8k-vllm"]) | JSON, "messages": st.lists(MESSAGE, max_size=5) | JSON},
    optional={"stream": st.booleans() | JSON, "max_tokens": st.integers(-5, 20_000) | JSON, "tools": TOOLS | JSON,
              "stream_options": JSON, "temperature": JSON},
)
GOOD_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(min_size=1, max_size=200) | st.lists(PART, min_size=1, max_size=3)},
)
NEARLY_VALID = st.fixed_dictionaries(
    {"model": st.sampled_from(["gpt-4o", "fake-8k-openai", "fake-8k-vllm", "fake-4k-anthropic"]),
     "messages": st.lists(GOOD_MESSAGE, min_size=1, max_size=4).map(lambda ms: [*ms, {"role": "user", "content": "go"}])
                 | st.lists(GOOD_MESSAGE | MESSAGE, min_size=1, max_size=5)},
    optional={"stream": st.booleans(), "max_tokens": st.integers(-5, 20_000), "stream_options": st.just({"include_usage": True}) | JSON,
              "tools": st.just([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]) | TOOLS | JSON,
              "tool_choice": st.sampled_from(["none", "auto", "required"]) | JSON,
              "temperature": JSON, "n": st.integers(0, 3)},
)
RAW = st.one_of(
    NEARLY_VALID.map(orjson.dumps),
    NEARLY_VALID.map(orjson.dumps),
    BODY.map(orjson.dumps),
    JSON.map(orjson.dumps),
    st.binary(max_size=300),
    BODY.map(orjson.dumps).flatmap(lambda b: st.integers(0, len(b)).map(lambda i: b[:i])),  # truncated
)


def test_fuzz_chat_endpoint(proxy_factory: Callable[..., Proxy], upstream: Upstream) -> None:
    """Hypothesis-generated bodies through a real socket: every answer is < 500, errors are envelopes."""
    proxy = proxy_factory(max_body_bytes=MAX_BODY_BYTES)
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    with proxy.http() as http:

        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, derandomize=False,
                  suppress_health_check=list(HealthCheck))
        @given(RAW)
        def one(raw: bytes) -> None:
            seen = len(upstream.state.requests)
            r = post(http, raw)
            statuses[r.status_code] += 1
            try:
                if r.status_code >= 500:  # only a provider's own 5xx, relayed as it came (the fake crashed on it)
                    mine = upstream.state.requests[seen:]
                    assert "x-context-proxy-request-id" in r.headers and mine and mine[-1].status in (None, r.status_code), r.text[:300]
                    statuses[-1] += 1
                    return
                if r.status_code >= 400:
                    if "x-context-proxy-request-id" in r.headers:  # the provider's own error, passed through as
                        mine = upstream.state.requests[seen:]  # it came (vLLM's {"object": "error", ...} too)
                        assert mine and mine[-1].status == r.status_code and isinstance(r.json(), dict), r.text[:300]
                    else:
                        assert_envelope(r)
            except (AssertionError, ValueError, KeyError, TypeError) as exc:
                failures.append(f"{r.status_code} {raw[:200]!r}: {exc}")
                raise

        one()
        time.sleep(0.5)  # the last requests' log writes run after their answers
        scraped = http.get("/metrics").text
    # every answered request was logged: no log write failed (a repeated request id once did)
    log_errors = [line for line in scraped.splitlines()
                  if line.startswith("context_proxy_database_errors_total") and float(line.rsplit(" ", 1)[1]) > 0]
    assert not log_errors, log_errors
    TALLY.add("fuzz_chat_cases", sum(statuses.values()))
    TALLY.add("fuzz_chat_failures", len(failures))
    TALLY.add("fuzz_chat_upstream_5xx_relayed", statuses.pop(-1, 0))
    TALLY.add("requests", sum(statuses.values()))
    TALLY.note("fuzz_chat_statuses", {str(k): v for k, v in sorted(statuses.items())})
    print(f"\nchat fuzz: {sum(statuses.values())} cases, statuses {dict(statuses)}, failures {len(failures)}")
    assert not failures, failures[:3]


def test_read_api_ids_with_nul_are_404_not_5xx(proxy_factory: Callable[..., Proxy]) -> None:
    """Found by schemathesis: ``GET /sessions?after=<text with NUL>`` was a 5xx on PostgreSQL (its
    text type cannot hold NUL, so the query itself failed). Such an id names nothing."""
    proxy = proxy_factory()
    with proxy.http() as http:
        assert post(http, orjson.dumps(user("hi")), "nul").status_code == 200
        logged(http, "nul", 1)
        for path, params, status in (("/sessions", {"after": "a\x00b"}, 400), ("/sessions/a%00b", {}, 404),
                                     ("/sessions/a%00b/messages", {}, 404), ("/sessions/nul/messages", {"leaf": "\x00"}, 404),
                                     ("/sessions/nul/messages", {"after": "\x00"}, 400), ("/artifacts/art%00x", {}, 404)):
            assert_envelope(http.get(path, params=params), status)
            TALLY.add("bad_input_cases")
