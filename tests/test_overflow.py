"""Overflow recognition: one fixture per provider style, the non-overflow table, every shared
case that gives an error body, the fake upstream's styles, SSE error events, and a property test
that classification never raises."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.compaction.overflow import Overflow, classify_error, classify_stream_event
from tests.fakes.styles import OVERFLOW_STYLES, OverflowContext
from tests.support.shared import needs_cases

CASES_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "cases"
REQUEST_ID = "req_8c1f20250613a7e9d3b4201477"  # digits a careless parser would read


def _b(body: Any) -> bytes:
    return body if isinstance(body, bytes) else orjson.dumps(body)


def _oai(message: str, code: Any = None, param: Any = None, type_: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# (provider style, status, body, expected limit_tokens)
OVERFLOW_TABLE = [
    ("openai", 400, _oai("This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens. Please reduce the length of the messages.", "context_length_exceeded", "messages"), 128000),
    ("openai-no-number", 400, _oai("Your input exceeds the context window of this model. Please adjust your input and try again.", "context_length_exceeded", "input"), None),
    ("azure", 400, _oai("Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in 301234 tokens. Please reduce the length of the messages.", "context_length_exceeded", "messages"), 272000),
    ("vllm", 400, {"object": "error", "message": "This model's maximum context length is 4096 tokens. However, you requested 5120 tokens (4608 in the messages, 512 in the completion). Please reduce the length of the messages or completion.", "type": "BadRequestError", "param": None, "code": 400}, 4096),
    ("vllm-v1", 400, {"object": "error", "message": "The decoder prompt (length 9000) is longer than the maximum model length of 8192. Make sure that `max_model_len` is no smaller than the number of text tokens.", "type": "BadRequestError", "code": 400}, 8192),
    ("vllm-max-tokens-too-large", 400, {"object": "error", "message": "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum context length is 4096 tokens and your request has 3500 input tokens (1000 > 4096 - 3500).", "type": "BadRequestError", "code": 400}, 4096),
    ("sglang", 400, {"object": "error", "message": "The input (5000 tokens) is longer than the model's context length (4096 tokens).", "type": "BadRequestError", "code": 400}, 4096),
    ("llamacpp", 400, {"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 9123, "n_ctx": 8192}}, 8192),
    ("llamacpp-500", 500, {"error": {"code": 500, "message": "the request exceeds the available context size. try increasing the context size or enable context shift", "type": "exceed_context_size_error", "n_prompt_tokens": 9123, "n_ctx": 4096}}, 4096),
    ("lmstudio", 400, {"error": "The number of tokens to keep from the initial prompt is greater than the context length (n_keep: 13055>= n_ctx: 4096). Try to load the model with a larger context length, or provide a shorter input."}, 4096),
    ("lmstudio-only", 400, {"error": "Trying to keep the first 5213 tokens when context the overflows. However, the model is loaded with context length of only 4096 tokens, which is not enough. Try to load the model with a larger context length, or provide a shorter input"}, 4096),
    ("tgi", 422, {"error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4097. Given: 80125 `inputs` tokens and 4096 `max_new_tokens`", "error_type": "validation"}, 4097),
    ("together", 400, {**_oai("Input validation error: `inputs` tokens + `max_new_tokens` must be <= 32769. Given: 40125 `inputs` tokens and 512 `max_new_tokens`", None, "max_tokens"), "id": "8f2c1a9b7d6e5f40-SJC"}, 32769),
    ("anthropic", 400, {"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 208415 tokens > 200000 maximum"}, "request_id": REQUEST_ID}, 200000),
    ("anthropic-with-output", 400, {"type": "error", "error": {"type": "invalid_request_error", "message": "input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000, decrease input length or `max_tokens` and try again"}}, 200000),
    ("gemini", 400, [{"error": {"code": 400, "message": "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).", "status": "INVALID_ARGUMENT"}}], 1048576),
    ("mistral", 400, {"object": "error", "message": "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length", "type": "invalid_request_error", "param": None, "code": None}, 32768),
    ("deepseek", 400, _oai("This model's maximum context length is 65536 tokens. However, you requested 70312 tokens (62120 in the messages, 8192 in the completion). Please reduce the length of the messages or completion.", "invalid_request_error"), 65536),
    ("fireworks", 400, {"object": "error", "type": "invalid_request_error", "code": "invalid_request_error", "message": "The prompt is too long: 264613, model maximum context length: 262141"}, 262141),
    ("openrouter", 400, {"error": {"message": "This endpoint's maximum context length is 8192 tokens. However, you requested about 9500 tokens (9000 of text input, 500 in the output). Please reduce the length of either one, or use the \"middle-out\" transform to compress your prompt automatically.", "code": 400}, "user_id": "user_2x7Kq9LmN4pR8sT1vW3yZ5"}, 8192),
    ("xai", 400, {"code": "Client specified an invalid argument", "error": "This model's maximum prompt length is 131072 but the request contains 140000 tokens."}, 131072),
    ("moonshot", 400, _oai("Invalid request: Your request exceeded model token limit: 8192"), 8192),
    ("dashscope", 400, {"error": {"code": "invalid_parameter_error", "message": "<400> InternalError.Algo.InvalidParameter: Range of input length should be [1, 30720]", "param": None, "type": "invalid_request_error"}, "request_id": "6a8c47e9-3b7d-9a21-8c4e-202406131234"}, 30720),
    ("groq-context", 400, _oai("Please reduce the length of the messages or completion.", "context_length_exceeded", "messages"), None),
    ("bedrock", 400, {"message": "Input is too long for requested model."}, None),
    ("detail-string", 400, {"detail": "This model's maximum context length is 2048 tokens. However, you requested 3000 tokens."}, 2048),
    ("plain-text", 400, b"This model's maximum context length is 16384 tokens, request id 99999999", 16384),
    ("gemini-commas", 400, {"error": {"message": "The input token count (2,000,000) exceeds the maximum number of tokens allowed (1,048,576)."}}, 1048576),
]

# (name, status, body): not overflows, passed through untouched.
NOT_OVERFLOW_TABLE = [
    ("openai-output-cap", 400, _oai("max_tokens is too large: 20480. This model supports at most 16384 completion tokens, whereas you provided 20480.", "invalid_value", "max_tokens")),
    ("dashscope-output-cap", 400, {"error": {"code": "invalid_parameter_error", "message": "<400> InternalError.Algo.InvalidParameter: Range of max_tokens should be [1, 8192]"}}),
    ("groq-tpm-413", 413, _oai("Request too large for model `llama-3.1-8b-instant` in organization `org_01hq8` service tier `on_demand` on tokens per minute (TPM): Limit 6000, Requested 12328, please reduce your message size and try again.", "rate_limit_exceeded", None, "tokens")),
    ("openai-429-tpm", 429, _oai("Rate limit reached for gpt-4o in organization org-123 on tokens per min (TPM): Limit 30000, Used 29000, Requested 4000.", "rate_limit_exceeded", None, "tokens")),
    ("anthropic-429", 429, {"type": "error", "error": {"type": "rate_limit_error", "message": "This request would exceed the rate limit for your organization of 40,000 input tokens per minute."}}),
    ("quota", 429, _oai("You exceeded your current quota, please check your plan and billing details.", "insufficient_quota", None, "insufficient_quota")),
    ("dangling-tool-call", 400, _oai("An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. (insufficient tool messages following tool_calls message)", "invalid_request_error")),
    ("anthropic-tool-use", 400, {"type": "error", "error": {"type": "invalid_request_error", "message": "messages.4: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_01"}}),
    ("unsupported-parameter", 400, _oai("Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.", "unsupported_parameter", "max_tokens")),
    ("unrecognized-argument", 400, _oai("Unrecognized request argument supplied: max_completion_tokens")),
    ("stream-options", 400, _oai("The 'stream_options' parameter is only allowed when 'stream' is enabled.", None, "stream_options")),
    ("developer-role", 400, _oai("messages[0].role: unknown variant `developer`, expected one of `system`, `user`, `assistant`, `tool`", "invalid_request_error")),
    ("xai-name", 400, {"code": "Client specified an invalid argument", "error": "Only messages of role 'user' can have a name."}),
    ("invalid-json", 400, _oai("We could not parse the JSON body of your request.")),
    ("server-error", 500, _oai("The server had an error while processing your request. Sorry about that!", None, None, "server_error")),
    ("bad-gateway-html", 502, b"<html><body>502 Bad Gateway</body></html>"),
    ("overloaded", 529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ("success", 200, {"id": "chatcmpl-1", "choices": []}),
    ("empty", 400, b""),
]


@pytest.mark.parametrize(("style", "status", "body", "limit"), OVERFLOW_TABLE, ids=[r[0] for r in OVERFLOW_TABLE])
def test_overflow_styles_are_recognized_with_their_stated_limit(style: str, status: int, body: Any, limit: int | None) -> None:
    result = classify_error(status, _b(body), {"content-type": "application/json"})
    assert result is not None, style
    assert result.kind == "context"
    assert result.limit_tokens == limit
    assert result.message


@pytest.mark.parametrize(("name", "status", "body"), NOT_OVERFLOW_TABLE, ids=[r[0] for r in NOT_OVERFLOW_TABLE])
def test_other_errors_are_not_overflows(name: str, status: int, body: Any) -> None:
    assert classify_error(status, _b(body)) is None


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (413, {"type": "error", "error": {"type": "request_too_large", "message": "Request exceeds the maximum size"}}),
        (413, b"<html><head><title>413 Request Entity Too Large</title></head><body>nginx</body></html>"),
    ],
)
def test_413_without_quota_markers_is_a_body_size_overflow(status: int, body: Any) -> None:
    result = classify_error(status, _b(body))
    assert result == Overflow("body_size", None, "http-413", result.message if result else "")


def test_limit_is_the_maximum_not_the_prompt_size_nor_ids() -> None:
    body = {"error": {"message": "prompt is too long: 300000 tokens > 200000 maximum", "type": "invalid_request_error"},
            "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy", "model": "llama-3.1-8b"}
    assert classify_error(400, _b(body)).limit_tokens == 200000  # type: ignore[union-attr]


# --- the fake upstream's styles (tests/fakes/styles.py) ---------------------------------------

_FAKE_ERROR_STYLES = sorted(n for n, s in OVERFLOW_STYLES.items() if s.delivery != "truncate" and s.delivery != "silent_empty")


@pytest.mark.parametrize("name", _FAKE_ERROR_STYLES)
@pytest.mark.parametrize(("window", "prompt", "output"), [(2048, 2900, 512), (131072, 140123, 0), (4096, 3900, 1024)])
def test_every_fake_upstream_style_is_an_overflow_with_its_window(name: str, window: int, prompt: int, output: int) -> None:
    status, body = OVERFLOW_STYLES[name].render(OverflowContext(window, prompt, output, "req_20240613123456789012", True, 321))
    result = classify_error(status, _b(body))
    assert result is not None and result.kind == "context"
    assert result.limit_tokens == window


# --- the shared cases (/work/shared/cases/*.json) ---------------------------------------------

_PLACEHOLDER = re.compile(r"<(?!\d+>)[^<>\s]+>")  # <X>, <prompt+max_tokens>; not DashScope's "<400>"
_REPEAT = re.compile(r"\{\{repeat:(\d+):(.*?)\}\}", re.DOTALL)


def _expand(text: str) -> str:
    return _REPEAT.sub(lambda m: m.group(2) * int(m.group(1)), _PLACEHOLDER.sub("99999", text))


def _bodies_in(text: str) -> list[tuple[int, Any]]:
    """Every ``HTTP <status> ... {json}`` error stated in a case's text, placeholders filled."""
    out = []
    for match in re.finditer(r"HTTP (\d{3})\b", text):
        rest = _expand(text[match.end():])
        start = min((i for i in (rest.find("{"), rest.find("[")) if i >= 0), default=-1)
        if start < 0:
            continue
        try:
            body, _ = json.JSONDecoder().raw_decode(rest[start:])
        except json.JSONDecodeError:
            continue
        out.append((int(match.group(1)), body))
    return out


def _case_errors() -> list[Any]:
    params = []
    for path in sorted(CASES_DIR.glob("*.json")):
        case = json.loads(path.read_text())
        upstream = case.get("upstream", {})
        window = upstream.get("context_window_tokens")
        style = upstream.get("overflow_style") or ""
        # newer cases write the numbers as bare X (the prompt) and N (the window)
        stated = re.sub(r"(?<![<\w])N(?![>\w])", str(window), re.sub(r"(?<![<\w])X(?![>\w])", str((window or 0) + 900), style))
        for status, body in _bodies_in(stated):
            # a body that states no window (OpenAI Responses: "exceeds the context window of this model")
            expected = ("context", window if str(window) in json.dumps(body) else None)
            params.append(pytest.param(status, body, expected, id=f"{case['id']}-style"))
        if style and not _bodies_in(style):
            message = re.search(r"message '(.+)'$", style)
            if message:  # case 011: the body is described, not given
                param = re.search(r"param '(\w+)'", style)
                text = _expand(message.group(1))
                body = _oai(text, None, param.group(1) if param else None)
                params.append(pytest.param(400, body, ("context", window), id=f"{case['id']}-style-message"))
            else:  # a named style without a body: the fake upstream's rendering of it
                name = style.split()[0]
                status, body = OVERFLOW_STYLES[name].render(OverflowContext(window, window + 900, 0, REQUEST_ID))
                params.append(pytest.param(status, body, ("context", window), id=f"{case['id']}-style-{name}"))
        for i, rule in enumerate(upstream.get("rules", [])):
            for status, body in _bodies_in(rule):
                expected = ("body_size", None) if case["id"] == "019" else None
                params.append(pytest.param(status, body, expected, id=f"{case['id']}-rule{i}"))
    return params


CASE_ERRORS = _case_errors()


@needs_cases
def test_case_files_were_found_and_parsed() -> None:
    ids = {p.id for p in CASE_ERRORS}
    assert {"008-style", "010-style", "011-style-message", "013-style", "014-style", "019-rule0", "031-rule0", "032-rule0"} <= ids


@pytest.mark.parametrize(("status", "body", "expected"), CASE_ERRORS)
def test_shared_case_errors(status: int, body: Any, expected: tuple[str, int | None] | None) -> None:
    if status == 200:  # case 014: the error arrives as the first event of a 200 stream
        result = classify_stream_event(b"data: " + _b(body))
    else:
        result = classify_error(status, _b(body))
    if expected is None:
        assert result is None
    else:
        assert result is not None
        assert (result.kind, result.limit_tokens) == expected


# --- stream events ----------------------------------------------------------------------------


def test_stream_error_event_before_content_is_an_overflow() -> None:
    event = b'data: {"error":{"code":500,"message":"the request exceeds the available context size. try increasing the context size or enable context shift","type":"exceed_context_size_error","n_prompt_tokens":2649,"n_ctx":2048}}'
    result = classify_stream_event(event)
    assert result is not None and result.limit_tokens == 2048 and result.provider_style == "llamacpp"
    generic = classify_stream_event(orjson.dumps(_oai("This model's maximum context length is 2048 tokens.", "context_length_exceeded")))
    assert generic is not None and generic.limit_tokens == 2048
    anthropic = classify_stream_event(b'{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 3000 tokens > 2048 maximum"}}')
    assert anthropic is not None and anthropic.limit_tokens == 2048


@pytest.mark.parametrize(
    "event",
    [
        b'data: {"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","content":"maximum context length is 5 tokens"}}]}',
        b"data: [DONE]",
        b"",
        b"data: {not json",
        b'data: {"error":{"message":"Overloaded","type":"overloaded_error"}}',
    ],
)
def test_ordinary_or_unrelated_stream_events_are_not_overflows(event: bytes) -> None:
    assert classify_stream_event(event) is None


# --- never raises -----------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(["error", "message", "detail", "code", "type", "n_ctx", "x"]), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(status=st.integers(min_value=-1, max_value=1000), body=st.binary(max_size=300))
def test_classify_error_never_raises_on_bytes(status: int, body: bytes) -> None:
    result = classify_error(status, body)
    assert result is None or isinstance(result, Overflow)
    assert classify_stream_event(body) is None or isinstance(classify_stream_event(body), Overflow)


@settings(max_examples=200, deadline=None)
@given(status=st.sampled_from([400, 413, 422, 500]), body=_json)
def test_classify_error_never_raises_on_json_shapes(status: int, body: Any) -> None:
    result = classify_error(status, json.dumps(body).encode())
    assert result is None or isinstance(result, Overflow)
    if result is not None and result.limit_tokens is not None:
        assert result.limit_tokens > 0


# --- echoed client strings and the stated prompt size (issue 15) ------------------------------

_UNANSWERED = ("An assistant message with 'tool_calls' must be followed by tool messages responding to each "
               "'tool_call_id'. The following tool_call_ids did not have response messages: {ids}")


def _dangling(*ids: str) -> dict[str, Any]:
    calls = [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids]
    return {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"},
                                            {"role": "assistant", "content": None, "tool_calls": calls},
                                            {"role": "user", "content": "go on"}]}


@pytest.mark.parametrize("ids", [("maximum context length is 300 tokens",),
                                 ("maximum context length is 300", "tokens"),
                                 ("call_1", "This model's maximum context length is 300 tokens. Context_length_exceeded")])
def test_an_error_that_echoes_client_ids_is_not_an_overflow(ids: tuple[str, ...]) -> None:
    sent = _dangling(*ids)
    body = _b(_oai(_UNANSWERED.format(ids=", ".join(ids)), None, "messages.[1].role"))
    assert classify_error(400, body, sent=sent) is None
    assert classify_stream_event(b"data: " + body, sent=sent) is None


def test_an_unknown_field_quoted_back_is_not_an_overflow() -> None:
    sent = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "maximum context length is 300 tokens": 1}
    body = _b(_oai("Unrecognized request argument supplied: maximum context length is 300 tokens", None, None))
    assert classify_error(400, body, sent=sent) is None


def test_without_the_request_the_echo_would_have_been_read_as_a_window() -> None:
    """What the masking prevents (finding 2 of issue 15): the same body read without ``sent``."""
    body = _b(_oai(_UNANSWERED.format(ids="maximum context length is 300 tokens"), None, None))
    result = classify_error(400, body)
    assert result is not None and result.limit_tokens == 300


@pytest.mark.parametrize(("logged", "limit"), [(8192, 4096), (4096, None)])
def test_a_real_overflow_is_read_when_the_conversation_quotes_such_words(logged: int, limit: int | None) -> None:
    """A coding agent debugging an LLM server has the wording in a tool output. The overflow is
    still recognized; a stated number is believed unless its very wording is in the request (the
    provider may be quoting it), in which case the retry is sized from the estimate instead."""
    log = f"vllm | ERROR: This model's maximum context length is {logged} tokens. However, you requested 5000 tokens\n" * 20
    sent = {"model": "m", "messages": [{"role": "tool", "tool_call_id": "c", "content": log}]}
    text = "This model's maximum context length is 4096 tokens. However, your messages resulted in 5210 tokens."
    result = classify_error(400, _b(_oai(text, None, "messages")), sent=sent)
    assert result is not None and (result.limit_tokens, result.prompt_tokens) == (limit, 5210)


def test_a_partial_quote_of_a_client_string_states_no_numbers() -> None:
    """vLLM's validation errors quote ``input_value`` cut to 25 characters: not a verbatim quote,
    but its words are the client's all the same."""
    role = "n_keep: 9000 >= n_ctx: 4096 padding padding padding"
    sent = {"model": "m", "messages": [{"role": role, "content": "hi"}]}
    text = f"1 validation error: messages.0.role Input should be 'user' [type=literal_error, input_value='{role[:25]}...']"
    result = classify_error(400, _b(_oai(text, None, None)), sent=sent)
    assert result is None or (result.limit_tokens, result.prompt_tokens) == (None, None)


def test_a_case_folding_character_does_not_shift_the_mask() -> None:
    """``"İ".lower()`` is two characters: offsets of the lowered text must not be used on the original."""
    ids = ["\u0130" * 7] * 8 + ["maximum context length is 4096 tokens"]
    body = _b(_oai(_UNANSWERED.format(ids=", ".join(ids)), None, "messages.[1].role"))
    assert classify_error(400, body, sent=_dangling(*ids)) is None


def test_too_many_client_strings_to_read_means_no_stated_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    import proxy.compaction.overflow as overflow_module

    monkeypatch.setattr(overflow_module, "MAX_ECHO_STRINGS", 10)
    sent = _dangling("maximum context length is 4096 tokens")
    sent["messages"].append({"role": "user", "content": [{"type": "text", "text": f"filler text {i}"} for i in range(50)]})
    body = _b(_oai(_UNANSWERED.format(ids="maximum context length is 4096 tokens"), None, None))
    result = classify_error(400, body, sent=sent)
    assert result is None or (result.limit_tokens, result.prompt_tokens) == (None, None)


@pytest.mark.parametrize(("text", "prompt"), [
    ("prompt is too long: 250000 tokens > 200000 maximum", 250000),
    ("input length and `max_tokens` exceed context limit: 198000 + 8192 > 200000", 198000),
    ("The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).", 1200000),
    ("Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length", 40000),
    ("The prompt is too long: 264613, model maximum context length: 262141", 264613),
    ("This model's maximum prompt length is 131072 but the request contains 140000 tokens.", 140000),
    ("The input (5000 tokens) is longer than the model's context length (4096 tokens).", 5000),
    ("The decoder prompt (length 5000) is longer than the maximum model length of 4096.", 5000),
    (("This model's maximum context length is 8192 tokens. However, you requested 9000 tokens (8000 in the messages, "
      "1000 in the completion). Please reduce the length of the messages or completion."), 8000),
    ("`inputs` tokens + `max_new_tokens` must be <= 4097. Given: 80125 `inputs` tokens and 4096 `max_new_tokens`", 80125),
    ("Your request exceeded model token limit: 8192", None),
])
def test_the_stated_prompt_size_is_read(text: str, prompt: int | None) -> None:
    result = classify_error(400, _b(_oai(text, None, None)))
    assert result is not None and result.prompt_tokens == prompt


def test_llamacpp_states_the_prompt_in_a_field() -> None:
    event = b'data: {"error":{"code":500,"message":"the request exceeds the available context size","type":"exceed_context_size_error","n_prompt_tokens":2649,"n_ctx":2048}}'
    result = classify_stream_event(event)
    assert result is not None and (result.limit_tokens, result.prompt_tokens) == (2048, 2649)
