"""Each public bug report in ``../shared/cases`` as an end-to-end test of the proxy.

The client sends the case's request through the real proxy (uvicorn) to the strict fake upstream
(the case's window and overflow style, chosen by the model name); the test checks what the case
expects of every forwarded request and of the client's response. Runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import SHARED_DIR
from tests.e2e.conftest import CLIENT_KEY, Proxy, Upstream, wait_logged
from tests.fakes.state import ReceivedRequest
from tests.strict import validate_chat_messages

CASES_DIR = SHARED_DIR / "cases"


def expand(value: Any) -> Any:
    """Expand the cases' ``{{repeat:N:TEXT}}`` placeholders."""
    if isinstance(value, str):
        return re.sub(r"\{\{repeat:(\d+):(.*?)\}\}", lambda m: m.group(2) * int(m.group(1)), value, flags=re.DOTALL)
    if isinstance(value, list):
        return [expand(v) for v in value]
    if isinstance(value, dict):
        return {k: expand(v) for k, v in value.items()}
    return value


def load_case(case_id: str) -> dict[str, Any]:
    if not CASES_DIR.is_dir():
        pytest.skip(f"{CASES_DIR} is absent (the shared cases live there)")
    (path,) = CASES_DIR.glob(f"{case_id}-*.json")
    case = json.loads(path.read_text())
    case["request"] = expand(case["request"])
    return case


def expected_answer(case: dict[str, Any]) -> str | None:
    m = re.search(r"'(ANSWER: [^']+)'", " ".join(case["expected"]["client"]))
    return m.group(1) if m else None


def post(proxy: Proxy, body: dict[str, Any], **headers: str) -> httpx.Response:
    with proxy.http() as http:
        return http.post("/v1/chat/completions", json=body, headers=headers)


def model_calls(upstream: Upstream) -> list[ReceivedRequest]:
    return [r for r in upstream.state.chat_requests if not r.is_summary]


def assert_all_forwarded_valid(upstream: Upstream, case: dict[str, Any]) -> None:
    client_roles = {m["role"] for m in case["request"]["messages"]}
    for r in upstream.state.chat_requests:
        msgs = r.json["messages"]
        assert validate_chat_messages(msgs) == [], (r.is_summary, validate_chat_messages(msgs))
        assert {m["role"] for m in msgs} <= client_roles | {"user"}, "a role the client did not use"
        for m in msgs:
            if m.get("role") != "user":
                assert "name" not in m or m in case["request"]["messages"]


def assert_overflows_at_most_once(upstream: Upstream) -> None:
    overflows = [r for r in upstream.state.chat_requests if r.outcome in ("overflow", "too_large")]
    assert len(overflows) <= 1, [(r.is_summary, r.prompt_tokens) for r in overflows]


def write_models(tmp_path: Path, windows: dict[str, int]) -> str:
    path = tmp_path / "models.yaml"
    path.write_text("".join(f'"{k}":\n  context_window_tokens: {v}\n' for k, v in windows.items()))
    return str(path)


# --- cases answered after compaction, non-streaming -------------------------------------------

ANSWERED = ["001", "002", "007", "008", "010", "011", "013", "020", "022", "023", "025", "026"]


@pytest.mark.parametrize("case_id", ANSWERED)
def test_case_is_answered_after_compaction(case_id: str, proxy: Proxy, upstream: Upstream) -> None:
    case = load_case(case_id)
    r = post(proxy, case["request"])
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == expected_answer(case)
    assert_all_forwarded_valid(upstream, case)
    assert_overflows_at_most_once(upstream)
    last = model_calls(upstream)[-1]
    assert last.outcome == "ok"
    assert last.prompt_tokens <= case["upstream"]["context_window_tokens"]
    if case_id == "007":  # the client's tools are forwarded byte-identical, in order, on every request;
        # the only addition is the proxy's own read tool, appended after them (issue 4)
        n = len(case["request"]["tools"])
        for call in model_calls(upstream):
            assert orjson.dumps(call.json["tools"][:n]) == orjson.dumps(case["request"]["tools"])
            assert [t["function"]["name"] for t in call.json["tools"][n:]] in ([], ["context_proxy_read"])
    if case_id in ("001", "022"):  # tool messages stay right after their assistant message
        for call in model_calls(upstream):
            ids = [m.get("tool_call_id") for m in call.json["messages"] if m["role"] == "tool"]
            assert sorted(ids) in ([], sorted(i for m in case["request"]["messages"] for i in [c["id"] for c in m.get("tool_calls") or []]))
    if case_id == "025":
        sent = last.json["messages"]
        originals = case["request"]["messages"]
        for m in sent:
            for call in m.get("tool_calls") or []:
                json.loads(call["function"]["arguments"])  # still valid JSON
        by_id = {c["id"]: m for m in originals for c in m.get("tool_calls") or []}
        for m in sent:
            for call in m.get("tool_calls") or []:
                assert m.get("content") == by_id[call["id"]].get("content")
        # after the overflow the window is known: truncating the old argument is enough, so every
        # call stays, in order, and nothing is summarized (the cascade runs 1 -> 2 -> 3)
        assert not upstream.state.summary_requests
        assert [m["role"] for m in sent] == [m["role"] for m in originals]
        assert [c["id"] for m in sent for c in m.get("tool_calls") or []] == list(by_id)
        (write,) = [c for m in sent for c in m.get("tool_calls") or [] if c["id"] == "call_w1"]
        args = json.loads(write["function"]["arguments"])
        assert set(args) == {"path", "content"} and "truncated" in args["content"] and len(args["content"]) < 200
        assert "truncate_args" in r.headers["x-context-proxy-defenses"].split(",")
        assert "summary" not in r.headers["x-context-proxy-defenses"].split(",")
    if case_id == "020":  # the huge result never goes upstream whole, summary calls included
        huge = max((m["content"] for m in case["request"]["messages"] if m["role"] == "tool"), key=len)
        for call in upstream.state.chat_requests:
            assert huge not in call.body.decode()


def test_case_004_dangling_call_is_not_an_overflow(proxy: Proxy, upstream: Upstream) -> None:
    case = load_case("004")
    r = post(proxy, case["request"])
    assert r.status_code == 400
    assert len(upstream.state.chat_requests) == 1
    assert upstream.state.chat_requests[0].json["messages"] == case["request"]["messages"]
    assert "tool_call_id" in r.json()["error"]["message"]
    sid = r.headers["x-context-proxy-session-id"]
    with proxy.http() as http:
        assert http.get(f"/sessions/{sid}/events").json()["data"] == []


@pytest.mark.parametrize("case_id", ["031", "032"])
def test_output_cap_and_quota_errors_pass_through(case_id: str, proxy: Proxy, upstream: Upstream) -> None:
    case = load_case(case_id)
    if case_id == "032":
        upstream.state.tpm_limit = 6000
    r = post(proxy, case["request"])
    assert len(upstream.state.chat_requests) == 1
    direct = upstream.state.chat_requests[0]
    assert r.status_code == direct.status
    assert r.status_code in (400, 413)
    if case_id == "032":
        assert "retry-after" in r.headers
    with httpx.Client() as http:
        again = http.post(upstream.url + "/chat/completions", json=case["request"])
    assert r.content == again.content


def test_case_005_three_compactions_keep_the_first_task(proxy: Proxy, upstream: Upstream) -> None:
    case = load_case("005")
    messages = copy.deepcopy(case["request"]["messages"])
    question = messages.pop()  # the final QUESTION
    body = {k: v for k, v in case["request"].items() if k != "messages"}
    n = 5
    for _ in range(3):
        r = post(proxy, body | {"messages": [*messages, question]}, **{"x-session-id": "case-005"})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "ANSWER: T-4471"
        for _ in range(5):  # enough new rounds that each send needs a compaction
            n += 1
            messages += [
                {"role": "assistant", "content": None, "tool_calls": [{"id": f"call_f{n}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"configs/service_{n}.ini"})}}]},
                {"role": "tool", "tool_call_id": f"call_f{n}", "content": "setting_name = some_value_here\n" * 70},
                {"role": "assistant", "content": f"service_{n}.ini converted to TOML."},
            ]
    for call in model_calls(upstream):
        text = call.body.decode()
        assert "FACT: deploy_token=T-4471" in text
    wait_logged(proxy, "case-005", 3)
    with proxy.http() as http:
        events = http.get("/sessions/case-005/events").json()["data"]
    assert sum(e["kind"] == "summary" for e in events) >= 2
    assert_all_forwarded_valid(upstream, case)


def test_case_014_llamacpp_error_inside_a_200_stream_is_retried(proxy: Proxy, upstream: Upstream) -> None:
    case = load_case("014")
    body = case["request"] | {"stream": True, "stream_options": {"include_usage": True}}
    with proxy.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        raw = b"".join(r.iter_raw()).decode()
    events = [e[len("data: ") :] for e in raw.split("\n\n") if e.startswith("data: ")]
    assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    assert text == "ANSWER: 1187"
    usage = [c for c in chunks if c.get("usage") and c["choices"] == []]
    assert len(usage) == 1 and usage[0]["usage"]["prompt_tokens"] <= 2048


def test_case_016_configured_window_prevents_the_silent_empty_stream(
    proxy_factory: Any, upstream: Upstream, tmp_path: Path
) -> None:
    case = load_case("016")
    model = case["request"]["model"]
    upstream.state.windows[model] = 2048
    upstream.state.styles[model] = "lmstudio-silent"
    proxy = proxy_factory(models_file=write_models(tmp_path, {model: 2048}))
    client = proxy.client()
    stream = client.chat.completions.create(**(case["request"] | {"stream": True}))
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == expected_answer(case)
    assert all(r.prompt_tokens <= 2048 for r in upstream.state.chat_requests)


def test_case_016_without_a_window_the_empty_stream_is_not_logged_as_a_reply(proxy: Proxy, upstream: Upstream) -> None:
    case = load_case("016")
    model = case["request"]["model"]
    upstream.state.windows[model] = 2048
    upstream.state.styles[model] = "lmstudio-silent"
    body = case["request"] | {"stream": True}
    with proxy.http() as http:
        with http.stream("POST", "/v1/chat/completions", json=body, headers={"x-session-id": "s16"}) as r:
            b"".join(r.iter_raw())
        wait_logged(proxy, "s16", 1)
        msgs = http.get("/sessions/s16/messages").json()["data"]
    assert [m["role"] for m in msgs] == [m["role"] for m in case["request"]["messages"]]


def test_case_017_known_window_avoids_silent_truncation(proxy_factory: Any, upstream: Upstream, tmp_path: Path) -> None:
    case = load_case("017")
    model = case["request"]["model"]
    upstream.state.windows[model] = 2048
    upstream.state.styles[model] = "ollama"
    proxy = proxy_factory(models_file=write_models(tmp_path, {model: 2048}))
    r = post(proxy, case["request"])
    assert r.json()["choices"][0]["message"]["content"] == expected_answer(case)
    for call in model_calls(upstream):
        assert call.prompt_tokens <= 2048
        assert "FACT: launch=2026-03-01" in call.body.decode()


def test_case_017_unknown_window_is_learned_from_usage(proxy: Proxy, upstream: Upstream) -> None:
    case = load_case("017")
    model = case["request"]["model"]
    upstream.state.windows[model] = 2048
    upstream.state.styles[model] = "ollama"
    post(proxy, case["request"], **{"x-session-id": "s17"})  # silently truncated upstream
    wait_logged(proxy, "s17", 1)  # the window is learned from the reply, after the response
    upstream.state.requests.clear()
    r = post(proxy, case["request"], **{"x-session-id": "s17"})
    assert r.json()["choices"][0]["message"]["content"] == expected_answer(case)
    assert all(c.prompt_tokens <= 2048 for c in model_calls(upstream))


def test_case_019_body_size_overflow_offloads_old_images(proxy: Proxy, upstream: Upstream) -> None:
    case = load_case("019")
    upstream.state.max_body_bytes = 1_000_000
    r = post(proxy, case["request"], **{"x-session-id": "s19"})
    assert r.status_code == 200, r.text
    calls = model_calls(upstream)
    assert calls[-1].outcome == "ok" and len(calls[-1].body) < 1_000_000
    refs = set(re.findall(r"art_[0-9a-f]{32}", calls[-1].body.decode()))
    assert refs
    with proxy.http() as http:
        for ref in refs:
            got = http.get(f"/artifacts/{ref}")
            assert got.status_code == 200 and got.json()["content"].startswith("data:image/")


@pytest.mark.parametrize("variant", ["max_tokens", "max_completion_tokens"])
def test_case_028_proxy_calls_use_the_clients_token_limit_field(variant: str, proxy: Proxy, upstream: Upstream) -> None:
    case = load_case("028")
    body = dict(case["request"])
    if variant == "max_completion_tokens":
        upstream.state.reject_max_tokens = True
        body["max_completion_tokens"] = body.pop("max_tokens", 300)
    else:
        upstream.state.reject_max_completion_tokens = True
    r = post(proxy, body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == expected_answer(case)
    other = "max_tokens" if variant == "max_completion_tokens" else "max_completion_tokens"
    assert upstream.state.summary_requests
    for call in upstream.state.chat_requests:
        assert other not in call.json


def test_case_029_summary_call_has_no_stream_options(proxy: Proxy, upstream: Upstream) -> None:
    case = load_case("029")
    client = proxy.client()
    stream = client.chat.completions.create(**case["request"])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected_answer(case)
    usage = [c for c in chunks if c.usage is not None and not c.choices]
    assert len(usage) == 1 and usage[0].usage.prompt_tokens <= 2048
    assert upstream.state.summary_requests
    for s in upstream.state.summary_requests:
        assert "stream_options" not in s.json and not s.json.get("stream")
    retried = model_calls(upstream)[-1].json
    assert retried["stream"] is True and retried["stream_options"] == {"include_usage": True}


def test_keys_are_not_in_forwarded_summaries(proxy: Proxy, upstream: Upstream) -> None:
    """The summary call carries the client's own credentials (no proxy key configured)."""
    case = load_case("008")
    post(proxy, case["request"])
    assert upstream.state.summary_requests
    for s in upstream.state.summary_requests:
        assert s.headers.get("authorization") == f"Bearer {CLIENT_KEY}"


def test_case_043_the_providers_count_is_learned_from_its_overflow_and_applied(proxy: Proxy, upstream: Upstream) -> None:
    """The provider counts 1.5x tiktoken: after one overflow ('prompt is too long: X tokens > N
    maximum') the proxy sizes its summary calls and the retry by the provider's count, and the
    next send is compacted before it is sent (the ratio and window are the tenant's now)."""
    case = load_case("043")
    model = case["request"]["model"]
    upstream.state.count_factors[model] = 1.5
    body = case["request"]
    r = post(proxy, body, **{"x-session-id": "s43"})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == expected_answer(case)
    calls = upstream.state.chat_requests
    assert calls[0].outcome == "overflow"
    assert all(c.outcome == "ok" for c in calls[1:]), [(c.is_summary, c.outcome, c.prompt_tokens) for c in calls]
    assert all("FACT: rollout_date=2026-04-14" in c.body.decode() for c in model_calls(upstream))
    wait_logged(proxy, "s43", 1)

    upstream.state.requests.clear()
    more = "meeting transcript line with names, numbers and a decision about the rollout\n" * 60
    second = body | {"messages": [*body["messages"], r.json()["choices"][0]["message"],
                                  {"role": "user", "content": "More of the transcript:\n" + more},
                                  body["messages"][-1]]}
    r2 = post(proxy, second, **{"x-session-id": "s43"})
    assert r2.status_code == 200, r2.text
    assert r2.json()["choices"][0]["message"]["content"] == expected_answer(case)
    assert "x-context-proxy-overflow-retries" not in r2.headers
    assert all(c.outcome == "ok" for c in upstream.state.chat_requests), [
        (c.is_summary, c.outcome, c.prompt_tokens) for c in upstream.state.chat_requests]
    assert all("FACT: rollout_date=2026-04-14" in c.body.decode() for c in model_calls(upstream))
    wait_logged(proxy, "s43", 2)

    # a send that fits the window by tiktoken's count (under 85% of 4,096) but not by the
    # provider's: compacted before it is sent, because the ratio is known
    upstream.state.requests.clear()
    third = second | {"messages": [*second["messages"], r2.json()["choices"][0]["message"],
                                   {"role": "user", "content": "The rest:\n" + more * 2}, body["messages"][-1]]}
    r3 = post(proxy, third, **{"x-session-id": "s43"})
    assert r3.status_code == 200, r3.text
    assert "x-context-proxy-overflow-retries" not in r3.headers
    assert all(c.outcome == "ok" for c in upstream.state.chat_requests), [
        (c.is_summary, c.outcome, c.prompt_tokens) for c in upstream.state.chat_requests]


def test_case_046_a_compaction_leaves_headroom_and_the_next_sends_reuse_it(
    proxy_factory: Any, upstream: Upstream, tmp_path: Path
) -> None:
    case = load_case("046")
    model = case["request"]["model"]
    proxy = proxy_factory(models_file=write_models(tmp_path, {model: 8192}))
    messages = copy.deepcopy(case["request"]["messages"])
    question = messages.pop()
    body = {k: v for k, v in case["request"].items() if k != "messages"}
    summarized_on: list[int] = []
    for send in range(4):
        before = len(upstream.state.summary_requests)
        r = post(proxy, body | {"messages": [*messages, question]}, **{"x-session-id": "case-046"})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == expected_answer(case)
        if len(upstream.state.summary_requests) > before:
            summarized_on.append(send)
            assert int(r.headers["x-context-proxy-tokens-forwarded"]) <= 0.60 * 8192
        else:
            assert "x-context-proxy-overflow-retries" not in r.headers
        n = len(messages) + send
        messages += [r.json()["choices"][0]["message"], question,
                     {"role": "assistant", "content": None, "tool_calls": [{"id": f"call_x{n}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/handlers/x{n}.py"})}}]},
                     {"role": "tool", "tool_call_id": f"call_x{n}", "content": f"def handle_x{n}(request):\n    return route(request)\n" * 140}]
        wait_logged(proxy, "case-046", send + 1)
    assert 1 <= len(summarized_on) <= 2
    assert all(b - a > 1 for a, b in zip(summarized_on, summarized_on[1:], strict=False))
    for call in model_calls(upstream):
        assert "FACT: handler_a_needs=auth_middleware" in call.body.decode()
    assert_all_forwarded_valid(upstream, case)
