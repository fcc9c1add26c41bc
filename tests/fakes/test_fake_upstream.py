"""The fake upstream, run under a real uvicorn server and driven by the openai SDK and httpx."""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fakes.server import UvicornServer
from tests.fakes.tokens import IMAGE_PART_TOKENS, count_prompt_tokens, count_text_tokens, encoding, parse_fake_model
from tests.fakes.upstream import OVERFLOW_STYLES, FakeState, Reply, create_fake_upstream
from tests.support.shared import needs_exact_encodings

CASES_DIR = Path(__file__).resolve().parents[3] / "shared" / "cases"
LONG = "alpha beta gamma delta " * 700  # about 2,800 tokens: over a 2k window


@pytest.fixture(scope="module")
def served() -> Any:
    app, state = create_fake_upstream()
    with UvicornServer(app) as server:
        yield server, state


@pytest.fixture
def state(served: Any) -> FakeState:
    served[1].reset()
    return served[1]


@pytest.fixture
def url(served: Any, state: FakeState) -> str:
    return served[0].url


@pytest.fixture
def client(url: str) -> openai.OpenAI:
    with openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0) as c:
        yield c


def post(url: str, body: Any, **kwargs: Any) -> httpx.Response:
    kwargs.setdefault("timeout", 10)
    return httpx.post(url + "/v1/chat/completions", json=body, **kwargs)


def sse_events(text: str) -> list[str]:
    return [block for block in text.split("\n\n") if block.strip()]


# --- model names and token counting ---------------------------------------------------------

def test_model_names_and_counting_rule() -> None:
    assert parse_fake_model("fake-8k-vllm") == (8192, "vllm")
    assert parse_fake_model("fake-128k") == (131072, "openai")
    assert parse_fake_model("fake-3000-llamacpp-2025-midstream") == (3000, "llamacpp-2025-midstream")
    assert parse_fake_model("gpt-4o-mini") is None
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}}
    small = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with_big = count_prompt_tokens({"messages": [{"role": "user", "content": [image]}]})
    with_small = count_prompt_tokens({"messages": [{"role": "user", "content": [small]}]})
    assert with_big == with_small == 3 + 3 + IMAGE_PART_TOKENS
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "description": "x " * 500}}}
    bare = {"messages": [{"role": "user", "content": "hi"}]}
    tools_tokens = count_text_tokens(json.dumps([tool], separators=(",", ":")))
    assert count_prompt_tokens({**bare, "tools": [tool]}) == count_prompt_tokens(bare) + tools_tokens
    assert tools_tokens > (400 if encoding() is not None else 250)  # o200k: "x " is a token; the estimate: 4 bytes


# --- overflow styles ------------------------------------------------------------------------

def expected_overflow(style: str, n: int, x: int, m: int) -> tuple[int, Any]:
    """The exact body each style must send for window n, prompt x, max_tokens m."""
    def openai_env(msg):
        return {"error": {"message": msg, "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}
    oa = openai_env(f"This model's maximum context length is {n} tokens. However, your messages resulted in {x} tokens. Please reduce the length of the messages.")
    requested = f"{x + m} tokens ({x} in the messages, {m} in the completion)"
    vllm = f"This model's maximum context length is {n} tokens. However, you requested {requested}. Please reduce the length of the messages or completion."
    tgi = f"Input validation error: `inputs` tokens + `max_new_tokens` must be <= {n}. Given: {x} `inputs` tokens and {m} `max_new_tokens`"
    table: dict[str, tuple[int, Any]] = {
        "openai": (400, oa), "azure": (400, oa), "sse-error": (400, oa), "openai-midstream": (400, oa),
        "azure-input": (400, openai_env(f"Input tokens exceed the configured limit of {n} tokens. Your messages resulted in {x} tokens. Please reduce the length of the messages.")),
        "vllm": (400, {"object": "error", "message": vllm, "type": "BadRequestError", "param": None, "code": 400}),
        "sglang": (400, {"object": "error", "message": f"The input ({x} tokens) is longer than the model's context length ({n} tokens).", "type": "BadRequestError", "param": None, "code": 400}),
        "llamacpp": (400, {"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": x, "n_ctx": n}}),
        "lmstudio": (400, {"error": f"The number of tokens to keep from the initial prompt is greater than the context length (n_keep: {x}>= n_ctx: {n}). Try to load the model with a larger context length, or provide a shorter input."}),
        "tgi": (422, {"error": tgi, "error_type": "validation"}),
        "gemini": (400, [{"error": {"code": 400, "message": f"The input token count ({x}) exceeds the maximum number of tokens allowed ({n}).", "status": "INVALID_ARGUMENT"}}]),
        "mistral": (400, {"object": "error", "message": f"Prompt contains {x} tokens and 0 draft tokens, too large for model with {n} maximum context length", "type": "invalid_request_error", "param": None, "code": None}),
        "deepseek": (400, {"error": {"message": vllm, "type": "invalid_request_error", "param": None, "code": "invalid_request_error"}}),
        "fireworks": (400, {"object": "error", "type": "invalid_request_error", "code": "invalid_request_error", "message": f"The prompt is too long: {x}, model maximum context length: {n}"}),
        "xai": (400, {"code": "Client specified an invalid argument", "error": f"This model's maximum prompt length is {n} but the request contains {x} tokens."}),
        "moonshot": (400, {"error": {"message": f"Invalid request: Your request exceeded model token limit: {n}", "type": "invalid_request_error"}}),
    }
    table["llamacpp-stream"] = table["llamacpp"]
    return table[style]


@pytest.mark.parametrize("style", sorted(OVERFLOW_STYLES))
def test_each_overflow_style_non_streaming(style: str, url: str, state: FakeState) -> None:
    body = {"model": f"fake-2k-{style}", "messages": [{"role": "user", "content": LONG}], "max_tokens": 100}
    x, response = count_prompt_tokens(body), post(url, body)
    assert x > 2048
    assert response.headers["x-request-id"].startswith("req_8a7f3c9e12345")
    got = response.json()
    if style == "ollama":  # silent front truncation: 200, usage says the window
        assert response.status_code == 200 and got["usage"]["prompt_tokens"] == 2048
        assert state.requests[-1].outcome == "truncated"
        return
    if style == "lmstudio-silent":
        assert response.status_code == 200 and got["choices"][0]["message"]["content"] == ""
        assert got["choices"][0]["finish_reason"] is None
        return
    assert state.requests[-1].outcome == "overflow"
    id_field = {"anthropic": "request_id", "together": "id", "openrouter": "user_id", "dashscope": "request_id"}
    if style in id_field:  # ids full of digits sit next to the stated limit
        assert re.search(r"\d{4,}", got[id_field[style]])
    if style == "anthropic":
        assert got["error"] == {"type": "invalid_request_error", "message": f"prompt is too long: {x} tokens > 2048 maximum"}
        assert got["type"] == "error" and response.headers["request-id"]
    elif style == "together":
        assert got["error"]["message"] == expected_overflow("tgi", 2048, x, 100)[1]["error"]
        assert got["error"]["param"] == "max_tokens" and response.status_code == 400
    elif style == "openrouter":
        assert got["error"]["code"] == 400 and "maximum context length is 2048 tokens" in got["error"]["message"]
        assert f"requested about {x + 100} tokens ({x} of text input, 100 in the output)" in got["error"]["message"]
    elif style == "dashscope":
        assert got["error"]["message"] == "<400> InternalError.Algo.InvalidParameter: Range of input length should be [1, 2048]"
        assert got["error"]["code"] == "invalid_parameter_error" and got["request_id"]
    else:
        assert (response.status_code, got) == expected_overflow(style, 2048, x, 100)


def test_output_counting_styles_add_max_tokens(url: str) -> None:
    messages = [{"role": "user", "content": "alpha beta gamma delta " * 300}]  # ~1,200 tokens
    for style in ("vllm", "tgi", "deepseek", "sglang"):
        assert post(url, {"model": f"fake-2k-{style}", "messages": messages, "max_tokens": 1000}).status_code in (400, 422)
        assert post(url, {"model": f"fake-2k-{style}", "messages": messages, "max_tokens": 100}).status_code == 200
    sglang = post(url, {"model": "fake-2k-sglang", "messages": messages, "max_tokens": 1000}).json()
    assert sglang["message"].startswith("Requested token count exceeds the model's maximum context length of 2048 tokens.")
    assert post(url, {"model": "fake-2k-openai", "messages": messages, "max_tokens": 1000}).status_code == 200


def test_streamed_overflow_styles(url: str) -> None:
    messages = [{"role": "user", "content": LONG}]
    x = count_prompt_tokens({"messages": messages})
    r = post(url, {"model": "fake-2k-llamacpp-2025-midstream", "messages": messages, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[1:] == ["data: [DONE]"] and events[0].startswith("data: ")  # llama.cpp writes [DONE] after
    llamacpp_error = {
        "code": 500, "type": "exceed_context_size_error", "n_prompt_tokens": x, "n_ctx": 2048,
        "message": "the request exceeds the available context size. try increasing the context size or enable context shift"}
    assert json.loads(events[0][6:])["error"] == llamacpp_error
    r = post(url, {"model": "fake-2k-sse-error", "messages": messages, "stream": True})
    event = sse_events(r.text)[0]
    assert r.status_code == 200 and event.startswith("event: error\ndata: ")
    assert json.loads(event.split("data: ", 1)[1])["error"]["code"] == "context_length_exceeded"
    r = post(url, {"model": "fake-2k-openai-midstream", "messages": messages, "stream": True, "stream_options": {"include_usage": True}})
    first, error = sse_events(r.text)  # OpenAI's role-only first chunk, the error, no [DONE]
    assert json.loads(first[6:])["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert json.loads(first[6:])["usage"] is None
    assert json.loads(error[6:])["error"]["code"] == "context_length_exceeded"
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=10, json={
            "model": "fake-2k-llamacpp-stream+comment+role+crlf", "messages": messages, "stream": True}) as r:
        parts = list(r.iter_raw())
    raw = b"".join(parts)
    assert raw.startswith(b": keep-alive\r\n\r\ndata: {") and raw.endswith(b"\r\n\r\ndata: [DONE]\r\n\r\n")
    assert b"\n" not in raw.replace(b"\r\n", b"")
    assert any(p.endswith(b"\r") for p in parts)  # a read ends between a CR and its LF
    raw = post(url, {"model": "fake-2k-llamacpp-stream+errorfield+unterminated", "messages": messages, "stream": True}).content
    assert raw.startswith(b"error: {") and raw.endswith(b"}\n") and json.loads(raw[7:]) == llamacpp_error
    raw = post(url, {"model": "fake-2k-openai-midstream+cr", "messages": messages, "stream": True}).content
    assert b"\n" not in raw and raw.count(b"\r\r") == 2
    r = post(url, {"model": "fake-2k-lmstudio-silent", "messages": messages, "stream": True})
    events = sse_events(r.text)
    assert r.status_code == 200 and events[-1] == "data: [DONE]" and len(events) == 2
    assert json.loads(events[0][6:])["choices"] == [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]


def test_ollama_truncation_hides_the_front(url: str, state: FakeState) -> None:
    state.windows["qwen3:8b"], state.styles["qwen3:8b"] = 2048, "ollama"
    messages = [{"role": "user", "content": "FACT: launch=2026-03-01\n" + LONG},
                {"role": "assistant", "content": "Read it."}, {"role": "user", "content": "QUESTION: launch"}]
    got = post(url, {"model": "qwen3:8b", "messages": messages}).json()
    assert got["usage"]["prompt_tokens"] == 2048
    assert got["choices"][0]["message"]["content"] == "ANSWER: unknown"
    got = post(url, {"model": "qwen3:8b", "messages": messages[:1]}).json()
    echoed = got["choices"][0]["message"]["content"]  # the model saw only the tail
    assert echoed.startswith("OK: ") and "FACT" not in echoed and "delta" in echoed
    state.windows["qwen3:8b"] = 4096
    assert post(url, {"model": "qwen3:8b", "messages": messages}).json()["choices"][0]["message"]["content"] == "ANSWER: 2026-03-01"


# --- strict validation ----------------------------------------------------------------------

CALL = {"id": "call_a", "type": "function", "function": {"name": "read", "arguments": "{\"path\": \"x\"}"}}


def error_of(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    r = post(url, {"model": "fake-8k-openai", **body})
    return r.status_code, r.json()


def test_tool_pairing_rules(url: str) -> None:
    user = {"role": "user", "content": "go"}
    orphan = error_of(url, {"messages": [user, {"role": "tool", "tool_call_id": "call_a", "content": "r"}]})
    assert orphan[0] == 400 and "must be a response to a preceeding message with 'tool_calls'" in orphan[1]["error"]["message"]
    dangling = error_of(url, {"messages": [user, {"role": "assistant", "content": None, "tool_calls": [CALL]}, user]})
    assert dangling == (400, {"error": {
        "message": "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: call_a",
        "type": "invalid_request_error", "param": "messages.[2].role", "code": None}})
    deepseek = post(url, {"model": "fake-8k-deepseek", "messages": [user, {"role": "assistant", "content": None, "tool_calls": [CALL]}, user]})
    assert deepseek.status_code == 400 and deepseek.json()["error"]["message"].endswith("(insufficient tool messages following tool_calls message)")
    at_end = error_of(url, {"messages": [user, {"role": "assistant", "content": "", "tool_calls": [CALL]}]})
    assert at_end[0] == 400
    twice = [user, {"role": "assistant", "content": None, "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_a", "content": "r"}]
    assert error_of(url, {"messages": twice + twice[1:]})[1]["error"]["message"].startswith("Duplicate value for 'tool_call_id'")
    assert error_of(url, {"messages": twice + [twice[2]]})[0] == 400
    for content in (None, ""):  # case 025: both forms accepted
        ok = [user, {"role": "assistant", "content": content, "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_a", "content": "r"}]
        assert error_of(url, {"messages": ok})[0] == 200


def test_roles_names_and_parameters(url: str, state: FakeState) -> None:
    developer = {"messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}]}
    assert error_of(url, developer) == (400, {"error": {
        "message": "messages[0].role: unknown variant `developer`, expected one of `system`, `user`, `assistant`, `tool`",
        "type": "invalid_request_error", "param": None, "code": "invalid_request_error"}})
    state.allow_developer = True
    assert error_of(url, developer)[0] == 200
    named = [{"role": "system", "name": "proxy", "content": "s"}, {"role": "user", "name": "alice", "content": "hi"}]
    r = post(url, {"model": "fake-8k-xai", "messages": named})
    assert (r.status_code, r.json()) == (400, {"code": "Client specified an invalid argument", "error": "Only messages of role 'user' can have a name."})
    assert post(url, {"model": "fake-8k-xai", "messages": named[1:]}).status_code == 200
    user = [{"role": "user", "content": "hi"}]
    assert error_of(url, {"messages": user, "stream_options": {"include_usage": True}}) == (400, {"error": {
        "message": "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
        "type": "invalid_request_error", "param": "stream_options", "code": None}})
    assert error_of(url, {"messages": user, "max_tokens": 20480}) == (400, {"error": {
        "message": "max_tokens is too large: 20480. This model supports at most 16384 completion tokens, whereas you provided 20480.",
        "type": "invalid_request_error", "param": "max_tokens", "code": "invalid_value"}})
    state.reject_max_completion_tokens = True
    assert error_of(url, {"messages": user, "max_completion_tokens": 300})[1]["error"]["message"] == "Unrecognized request argument supplied: max_completion_tokens"
    assert error_of(url, {"messages": user, "max_tokens": 300})[0] == 200
    state.reject_max_completion_tokens, state.reject_max_tokens = False, True
    assert error_of(url, {"messages": user, "max_tokens": 300})[1]["error"]["code"] == "unsupported_parameter"
    assert error_of(url, {"messages": user, "max_completion_tokens": 300})[0] == 200


@pytest.mark.parametrize(("tools", "where", "expected", "got"), [
    ([{"type": "function", "function": {"name": "f", "parameters": "{}"}}], "tools[0].function.parameters", "an object", "a string"),
    ([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "g", "parameters": [1]}}],
     "tools[1].function.parameters", "an object", "an array"),
    ([{"type": "function", "function": {"name": 7}}], "tools[0].function.name", "a string", "an integer"),
    ([{"type": "function", "function": "f"}], "tools[0].function", "an object", "a string"),
    (["f"], "tools[0]", "an object", "a string"),
    ({"f": 1}, "tools", "an array", "an object"),
])
def test_tools_of_a_wrong_type_get_openai_s_400(url: str, tools: Any, where: str, expected: str, got: str) -> None:
    """Never a crash (a 500 the proxy would relay) for a tools shape a provider refuses."""
    assert error_of(url, {"messages": [{"role": "user", "content": "hi"}], "tools": tools}) == (400, {"error": {
        "message": f"Invalid type for '{where}': expected {expected}, but got {got} instead.",
        "type": "invalid_request_error", "param": where, "code": "invalid_type"}})


def test_tools_of_the_right_types_are_accepted(url: str) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": None}}, {"type": "custom", "custom": {"name": "g"}},
             {"type": "function", "function": {"name": "h", "parameters": {"type": "object", "properties": "odd"}}}]
    assert error_of(url, {"messages": [{"role": "user", "content": "hi"}], "tools": tools})[0] == 200


def test_anthropic_blocks(url: str) -> None:
    use = {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "toolu_01", "name": "w", "input": {"city": "Oslo"}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "FACT: oslo_temp=12C"}]}
    ask = {"role": "user", "content": "Weather? QUESTION: oslo_temp"}
    ok = post(url, {"model": "fake-8k-anthropic", "messages": [ask, use, result]})
    assert ok.json()["choices"][0]["message"]["content"] == "ANSWER: 12C"
    missing = post(url, {"model": "fake-8k-anthropic", "messages": [ask, use, {"role": "user", "content": "and?"}]}).json()
    assert missing["error"]["message"].startswith("messages.1: tool_use ids were found without tool_result blocks immediately after: toolu_01")
    orphan = post(url, {"model": "fake-8k-anthropic", "messages": [ask, result]}).json()
    assert "unexpected tool_use_id found in tool_result blocks: toolu_01" in orphan["error"]["message"]
    assert post(url, {"model": "fake-8k-openai", "messages": [ask, use, result]}).json()["error"]["code"] == "invalid_value"


def test_quota_and_body_limits(url: str, state: FakeState) -> None:
    state.tpm_limit = 6000
    body = {"model": "fake-128k-openai", "messages": [{"role": "user", "content": "word " * 5000}], "max_tokens": 2200}
    r = post(url, body)
    requested = count_prompt_tokens(body) + 2200
    assert r.status_code == 413 and r.headers["retry-after"] == "7"
    assert r.json()["error"]["type"] == "tokens" and r.json()["error"]["code"] == "rate_limit_exceeded"
    assert f"Limit 6000, Requested {requested}," in r.json()["error"]["message"]
    state.tpm_limit, state.max_body_bytes = None, 1_000_000
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "iVBORw0K" * 150_000}}
    r = post(url, {"model": "fake-128k-anthropic", "messages": [{"role": "user", "content": [image]}]})
    assert (r.status_code, r.json()) == (413, {"type": "error", "error": {"type": "request_too_large", "message": "Request exceeds the maximum size"}})


# --- the model's behaviour ------------------------------------------------------------------

def test_fact_question_everywhere(client: openai.OpenAI) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "note", "arguments": json.dumps({"text": "x\nFACT: city=Oslo.\n"})}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "FACT: colour=blue)"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "FACT: port=8443, open"},
        {"role": "user", "content": "QUESTION: port"},
    ]
    def ask(key):
        return client.chat.completions.create(
            model="fake-8k-openai", messages=messages[:-1] + [{"role": "user", "content": f"QUESTION: {key}"}]).choices[0].message.content
    assert [ask(k) for k in ("port", "city", "colour", "missing")] == ["ANSWER: 8443", "ANSWER: Oslo", "ANSWER: blue", "ANSWER: unknown"]


def test_summary_keeps_fact_lines(client: openai.OpenAI, state: FakeState) -> None:
    transcript = "user: Task: migrate configs/ INI to TOML\nFACT: a=1\nnoise\nFACT: b=2 (kept)\nFACT: a=1\n"
    messages = [{"role": "system", "content": "You write summaries."},
                {"role": "user", "content": transcript + "\nPlease summarize the conversation above."}]
    text = client.chat.completions.create(model="fake-8k-openai", messages=messages).choices[0].message.content
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["## Session intent", "## Summary and decisions", "## Artifacts", "## Next steps"]
    assert [line for line in text.splitlines() if "FACT:" in line] == ["FACT: a=1", "FACT: b=2 (kept)"]
    assert "Task: migrate configs/ INI to TOML" in text
    again = client.chat.completions.create(model="fake-8k-openai", messages=[
        {"role": "user", "content": text + "\nFACT: c=3\nSummarize the conversation."}]).choices[0].message.content
    assert "Task: migrate configs/ INI to TOML" in again and "FACT: c=3" in again
    assert len(state.summary_requests) == 2 and not state.model_requests
    with pytest.raises(openai.BadRequestError):  # the window applies to summaries too (case 020)
        client.chat.completions.create(model="fake-2k-openai", messages=[{"role": "user", "content": LONG + "summarize the conversation"}])
    assert state.summary_requests[-1].outcome == "overflow"


SCRIPTED = {"role": "assistant", "content": "Reading both files to compare them.", "tool_calls": [
    {"id": "call_p1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"src/a_rather_long_name.py\"}"}},
    {"id": "call_p2", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"b.py\"}"}}]}


def test_scripted_replies_sync_stream_helper(client: openai.OpenAI, state: FakeState) -> None:
    state.script.extend([SCRIPTED, {"role": "assistant", "content": "Done now, all good."}])
    messages = [{"role": "user", "content": "go"}]
    with client.chat.completions.stream(model="fake-8k-openai", messages=messages, stream_options={"include_usage": True}) as stream:
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls" and message.content == SCRIPTED["content"]
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in SCRIPTED["tool_calls"]]
    assert final.usage.prompt_tokens == state.requests[-1].prompt_tokens
    plain = client.chat.completions.create(model="fake-8k-openai", messages=messages)
    assert plain.choices[0].message.content == "Done now, all good." and plain.choices[0].finish_reason == "stop"
    assert client.chat.completions.create(model="fake-8k-openai", messages=messages).choices[0].message.content == "OK: go"


async def test_scripted_replies_async_stream(url: str, state: FakeState) -> None:
    state.script.append(SCRIPTED)
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as aclient:
        stream = await aclient.chat.completions.create(model="fake-8k-openai", messages=[{"role": "user", "content": "go"}], stream=True)
        chunks = [chunk async for chunk in stream]
    deltas = [c.choices[0].delta for c in chunks]
    assert deltas[0].role == "assistant" and deltas[0].content == ""
    assert sum(1 for d in deltas if d.content) >= 2 and sum(1 for d in deltas if d.tool_calls) >= 4
    heads = [d.tool_calls[0] for d in deltas if d.tool_calls and d.tool_calls[0].id]
    assert [(h.index, h.id, h.function.name, h.function.arguments) for h in heads] == [(0, "call_p1", "read_file", ""), (1, "call_p2", "read_file", "")]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_custom_responder_goes_first(client: openai.OpenAI, state: FakeState) -> None:
    state.responders.insert(0, lambda prompt, st: Reply("pong") if "ping" in prompt.last_user_text else None)
    def ask(text):
        return client.chat.completions.create(model="fake-8k-openai", messages=[{"role": "user", "content": text}]).choices[0].message.content
    assert (ask("ping"), ask("other")) == ("pong", "OK: other")


async def test_uvicorn_server_async_and_restartable() -> None:
    app, state = create_fake_upstream()
    server = UvicornServer(app)
    async with server, httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/v1/models")).status_code == 200
    server.stop()  # idempotent
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient() as closed:
            await closed.get(server.url + "/v1/models")
    assert [r.path for r in state.requests] == ["/v1/models"]


# --- faults and streaming control -----------------------------------------------------------

def test_faults(client: openai.OpenAI, url: str, state: FakeState) -> None:
    messages = [{"role": "user", "content": "hello there friend, how are things"}]
    state.fail_next.append(("status", 503, {"error": {"message": "overloaded", "type": "server_error"}}, {"retry-after": "1"}))
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="fake-8k-openai", messages=messages)
    assert info.value.status_code == 503 and info.value.response.headers["retry-after"] == "1"
    state.fail_next.append(("cut_stream", 3))
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for _ in client.chat.completions.create(model="fake-8k-openai", messages=messages, stream=True):
            pass
    assert state.requests[-1].outcome == "fault"
    state.fail_next.append(("stall", 0.5))
    with pytest.raises(httpx.ReadTimeout):
        post(url, {"model": "fake-8k-openai", "messages": messages}, timeout=httpx.Timeout(5, read=0.2))
    state.fail_next.append(("delay", 0.3))
    started = time.monotonic()
    assert client.chat.completions.create(model="fake-8k-openai", messages=messages).choices[0].message.content.startswith("OK:")
    assert time.monotonic() - started >= 0.3


def test_stream_gate_releases_after_first_chunk(url: str, state: FakeState) -> None:
    gate = threading.Event()
    state.stream_gate = gate
    body = {"model": "fake-8k-openai", "messages": [{"role": "user", "content": "one two three four five six"}], "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=5) as response:
        lines = response.iter_lines()
        first = next(line for line in lines if line)
        assert json.loads(first[6:])["choices"][0]["delta"]["role"] == "assistant"
        # the fake sets the event right after writing the chunk: the client may read it first
        assert state.first_chunk_sent.wait(2) and state.requests[-1].outcome == "ok"
        gate.set()
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"


# --- other /v1 paths ------------------------------------------------------------------------

def test_models_embeddings_responses_echo(client: openai.OpenAI, url: str, state: FakeState) -> None:
    state.windows["local-gguf-model"] = 2048
    state.hidden_windows.add("local-gguf-model")
    models = {m.id: m for m in client.models.list()}
    assert models["fake-8k-vllm"].model_extra["context_window"] == 8192
    assert "context_window" not in models["local-gguf-model"].model_extra
    one = client.embeddings.create(model="emb", input=["a", "b"], dimensions=4)
    two = client.embeddings.create(model="emb", input="a", dimensions=4, encoding_format="float")
    assert len(one.data[0].embedding) == 4 and one.data[0].embedding == pytest.approx(two.data[0].embedding)
    assert one.data[0].embedding != one.data[1].embedding
    assert client.responses.create(model="fake-8k-openai", input="hello world").output_text == "OK: hello world"
    raw = b'{"z": 1,  "a": [1,2]}\n'
    r = httpx.put(url + "/v1/echo/files/x?b=2&a=1", content=raw, headers={"X-Custom": "v"})
    got = r.json()
    assert (got["method"], got["path"], got["query"]) == ("PUT", "/v1/echo/files/x", "b=2&a=1")
    assert base64.b64decode(got["body_b64"]) == raw and ["x-custom", "v"] in got["headers"]
    assert httpx.get(url + "/v1/echo/x?status=418").status_code == 418
    streamed = httpx.post(url + "/v1/echo/y?stream=1", content=raw)
    events = [json.loads(e[6:]) for e in sse_events(streamed.text)[:-1]]
    assert b"".join(base64.b64decode(e["body_b64"]) for e in events[1:]) == raw


# --- the shared cases -----------------------------------------------------------------------

CASE_SETUP: dict[str, dict[str, Any]] = {
    "016": {"windows": {"local-gguf-model": 2048}, "styles": {"local-gguf-model": "lmstudio-silent"}},
    "017": {"windows": {"qwen3:8b": 2048}, "styles": {"qwen3:8b": "ollama"}},
    "019": {"max_body_bytes": 1_000_000},
    "032": {"tpm_limit": 6000},
    "043": {"count_factors": {"fake-4k-anthropic": 1.5}},
}
CASE_STATUS = {"004": 400, "014": 200, "016": 200, "017": 200, "019": 413, "031": 400, "032": 413, "046": 200}
UNDER_THE_WINDOW = ("004", "019", "031", "032", "046")
"""Cases whose first request is not over the window (046 grows over four sends)."""


def expand(value: Any) -> Any:
    if isinstance(value, str):
        return re.sub(r"\{\{repeat:(\d+):(.*?)\}\}", lambda m: m.group(2) * int(m.group(1)), value, flags=re.DOTALL)
    if isinstance(value, list):
        return [expand(v) for v in value]
    if isinstance(value, dict):
        return {k: expand(v) for k, v in value.items()}
    return value


def load_cases() -> list[dict[str, Any]]:
    """The chat-completions cases (no ``api`` key, or ``chat-completions``): the Anthropic Messages
    and Responses cases are for APIs this fake's chat route does not speak."""
    cases = [json.loads(p.read_text()) for p in sorted(CASES_DIR.glob("*.json"))]
    return [c for c in cases if c.get("api", "chat-completions") == "chat-completions"]


def configure(state: FakeState, case_id: str) -> None:
    for key, value in CASE_SETUP.get(case_id, {}).items():
        setattr(state, key, value)


def case_params() -> list[Any]:
    if not CASES_DIR.is_dir():
        return [pytest.param(None, id="no-cases", marks=pytest.mark.skip(reason=f"{CASES_DIR} is absent (the shared cases live there)"))]
    return [pytest.param(c, id=c["id"], marks=[needs_exact_encodings]) for c in load_cases()]


@pytest.mark.parametrize("case", case_params())
def test_case_upstream_behaviour(case: dict[str, Any], url: str, state: FakeState) -> None:
    """Sent as is, each case meets its upstream rule; with room, the model answers as expected."""
    configure(state, case["id"])
    request = expand(case["request"])
    r = post(url, request)
    assert r.status_code == CASE_STATUS.get(case["id"], 400), r.text[:300]
    record = state.requests[-1]
    factor = CASE_SETUP.get(case["id"], {}).get("count_factors", {}).get(request["model"], 1.0)
    if case["id"] not in UNDER_THE_WINDOW:
        assert record.outcome in ("overflow", "truncated")
    if case["id"] not in ("004", "019", "031", "032"):  # refused before they are counted
        assert record.prompt_tokens == pytest.approx(case["upstream"]["prompt_tokens_estimate"]["tiktoken_o200k"] * factor, rel=0.05)
    for rule in case["upstream"].get("rules", []):  # rules quoting an exact JSON body
        quoted = re.search(r"HTTP \d+ (\{.*\})\.?$", rule)
        if quoted and case["id"] in ("004", "031"):
            assert r.json() == json.loads(quoted.group(1))
    answer = re.search(r"'(ANSWER: [^']+)'", " ".join(case["expected"]["client"]))
    if answer is None:
        return
    state.reset()
    configure(state, case["id"])
    model = request["model"]
    state.windows[model], state.max_body_bytes = 10_000_000, None
    roomy = {**request, "stream": False}
    roomy.pop("stream_options", None)
    got = post(url, roomy)
    assert got.status_code == 200, got.text[:300]
    assert got.json()["choices"][0]["message"]["content"] == answer.group(1)


def test_streamed_chunks_carry_an_obfuscation_pad_unless_turned_off(url: str) -> None:
    """OpenAI pads every streamed chunk with ``obfuscation`` (random characters of varying length)
    unless ``stream_options.include_obfuscation`` is ``false``; the OpenAI-compatible servers do not."""
    body = {"model": "fake-8k-openai", "messages": [{"role": "user", "content": "say a few words"}], "stream": True}
    chunks = [json.loads(e.removeprefix("data: ")) for e in sse_events(post(url, body).text) if e != "data: [DONE]"]
    pads = [c.get("obfuscation") for c in chunks]
    assert len(chunks) > 2 and all(isinstance(p, str) and p for p in pads) and len(set(pads)) > 1
    assert all(list(c)[-1] == "obfuscation" for c in chunks)  # (after the choices, as OpenAI sends it)
    off = post(url, body | {"stream_options": {"include_obfuscation": False}}).text
    assert "obfuscation" not in off and "chat.completion.chunk" in off and "[DONE]" in off
    other = post(url, body | {"model": "fake-8k-vllm"}).text  # (an OpenAI-compatible server: no pad)
    assert "obfuscation" not in other and "chat.completion.chunk" in other
