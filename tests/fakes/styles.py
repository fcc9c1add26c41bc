"""Overflow styles of the fake upstream: one per provider, with its exact error shape.

``OVERFLOW_STYLES`` maps a style name (the ``<style>`` of ``fake-<window>-<style>``) to an
``OverflowStyle``. Each style states whether the provider counts the requested output
(``max_tokens``/``max_completion_tokens``) against the window and how the overflow is delivered:

- ``error``: an HTTP error whose status and JSON body ``render`` returns;
- ``stream_error``: with ``stream: true`` an HTTP 200 event stream carrying ``render``'s body in
  an error event (llama.cpp builds of 2025, case 014; ``openai-midstream`` after a role chunk),
  else the HTTP error (``stream_overflow.py`` has the framings, and the ``+`` modifiers);
- ``sse_error``: with ``stream: true`` HTTP 200 and an ``event: error`` event;
- ``truncate``: HTTP 200 after silently keeping the first 4 and last ``window - 4`` tokens
  (Ollama, case 017);
- ``silent_empty``: HTTP 200 with an empty reply (LM Studio GGUF, case 016).

Bodies carry request ids full of digits where the provider puts one, so that a limit parser
reading digits out of ids is caught. Wordings follow the public reports cited in
``/work/shared/cases`` (vLLM and SGLang confirmed against their GitHub issues).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OverflowContext:
    """What a style needs to word its error (all counts in tokens)."""

    window_tokens: int
    prompt_tokens: int
    output_tokens: int
    request_id: str
    has_tools: bool = False
    tools_tokens: int = 0


@dataclass(frozen=True)
class OverflowStyle:
    """One provider's overflow behaviour; ``render`` returns ``(status, json_body)``."""

    name: str
    counts_output: bool
    render: Callable[[OverflowContext], tuple[int, Any]]
    delivery: str = "error"
    render_plain: Callable[[OverflowContext], tuple[int, Any]] | None = None
    """The HTTP error of a ``stream_error`` style when the request does not stream."""
    role_first: bool = False
    """A stream style's error comes after OpenAI's role-only first chunk."""
    done_after: bool = False
    """A stream style sends ``data: [DONE]`` after its error event."""
    framing: frozenset[str] = frozenset()
    """The ``+`` modifiers of the model's style name (``stream_overflow.FRAMINGS``)."""

    def is_overflow(self, window_tokens: int, prompt_tokens: int, output_tokens: int) -> bool:
        """prompt (+ output when the provider counts it) above the window."""
        used = prompt_tokens + (output_tokens if self.counts_output else 0)
        return used > window_tokens


def _openai_envelope(message: str, *, param: Any = "messages", code: Any = "context_length_exceeded") -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


def _openai(c: OverflowContext) -> tuple[int, Any]:
    if c.has_tools:
        resulted = (
            f"{c.prompt_tokens} tokens ({c.prompt_tokens - c.tools_tokens} in the messages, "
            f"{c.tools_tokens} in the functions)"
        )
    else:
        resulted = f"{c.prompt_tokens} tokens"
    return 400, _openai_envelope(
        f"This model's maximum context length is {c.window_tokens} tokens. However, your messages "
        f"resulted in {resulted}. Please reduce the length of the messages."
    )


def _azure_input(c: OverflowContext) -> tuple[int, Any]:
    return 400, _openai_envelope(
        f"Input tokens exceed the configured limit of {c.window_tokens} tokens. Your messages "
        f"resulted in {c.prompt_tokens} tokens. Please reduce the length of the messages."
    )


def _requested(c: OverflowContext) -> str:
    total = c.prompt_tokens + c.output_tokens
    return f"{total} tokens ({c.prompt_tokens} in the messages, {c.output_tokens} in the completion)"


def _vllm(c: OverflowContext) -> tuple[int, Any]:
    message = (
        f"This model's maximum context length is {c.window_tokens} tokens. However, you requested "
        f"{_requested(c)}. Please reduce the length of the messages or completion."
    )
    return 400, {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}


def _sglang(c: OverflowContext) -> tuple[int, Any]:
    if c.prompt_tokens >= c.window_tokens:
        message = (
            f"The input ({c.prompt_tokens} tokens) is longer than the model's context length "
            f"({c.window_tokens} tokens)."
        )
    else:
        message = (
            f"Requested token count exceeds the model's maximum context length of {c.window_tokens} "
            f"tokens. You requested a total of {c.prompt_tokens + c.output_tokens} tokens: "
            f"{c.prompt_tokens} tokens from the input messages and {c.output_tokens} tokens for the "
            "completion. Please reduce the number of tokens in the input messages or the completion "
            "to fit within the limit."
        )
    return 400, {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}


def _llamacpp(c: OverflowContext) -> tuple[int, Any]:
    return 400, {"error": {
        "code": 400,
        "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": c.prompt_tokens,
        "n_ctx": c.window_tokens,
    }}


def _llamacpp_stream(c: OverflowContext) -> tuple[int, Any]:
    return 500, {"error": {
        "code": 500,
        "message": "the request exceeds the available context size. try increasing the context size or enable context shift",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": c.prompt_tokens,
        "n_ctx": c.window_tokens,
    }}


def _lmstudio(c: OverflowContext) -> tuple[int, Any]:
    return 400, {"error": (
        "The number of tokens to keep from the initial prompt is greater than the context length "
        f"(n_keep: {c.prompt_tokens}>= n_ctx: {c.window_tokens}). Try to load the model with a larger "
        "context length, or provide a shorter input."
    )}


def _tgi_message(c: OverflowContext) -> str:
    return (
        f"Input validation error: `inputs` tokens + `max_new_tokens` must be <= {c.window_tokens}. "
        f"Given: {c.prompt_tokens} `inputs` tokens and {c.output_tokens} `max_new_tokens`"
    )


def _tgi(c: OverflowContext) -> tuple[int, Any]:
    return 422, {"error": _tgi_message(c), "error_type": "validation"}


def _together(c: OverflowContext) -> tuple[int, Any]:
    body = _openai_envelope(_tgi_message(c), param="max_tokens", code=None)
    body["id"] = f"nqx2{c.request_id[-12:]}-9c1e2a3b4d5f6789"
    return 400, body


def _anthropic(c: OverflowContext) -> tuple[int, Any]:
    return 400, {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": f"prompt is too long: {c.prompt_tokens} tokens > {c.window_tokens} maximum"},
        "request_id": c.request_id,
    }


def _gemini(c: OverflowContext) -> tuple[int, Any]:
    return 400, [{"error": {
        "code": 400,
        "message": f"The input token count ({c.prompt_tokens}) exceeds the maximum number of tokens allowed ({c.window_tokens}).",
        "status": "INVALID_ARGUMENT",
    }}]


def _mistral(c: OverflowContext) -> tuple[int, Any]:
    return 400, {
        "object": "error",
        "message": f"Prompt contains {c.prompt_tokens} tokens and 0 draft tokens, too large for model with {c.window_tokens} maximum context length",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


def _deepseek(c: OverflowContext) -> tuple[int, Any]:
    return 400, _openai_envelope(
        f"This model's maximum context length is {c.window_tokens} tokens. However, you requested "
        f"{_requested(c)}. Please reduce the length of the messages or completion.",
        param=None, code="invalid_request_error",
    )


def _fireworks(c: OverflowContext) -> tuple[int, Any]:
    return 400, {
        "object": "error",
        "type": "invalid_request_error",
        "code": "invalid_request_error",
        "message": f"The prompt is too long: {c.prompt_tokens}, model maximum context length: {c.window_tokens}",
    }


def _openrouter(c: OverflowContext) -> tuple[int, Any]:
    message = (
        f"This endpoint's maximum context length is {c.window_tokens} tokens. However, you requested "
        f"about {c.prompt_tokens + c.output_tokens} tokens ({c.prompt_tokens} of text input, "
        f"{c.output_tokens} in the output). Please reduce the length of either one, or use the "
        '"middle-out" transform to compress your prompt automatically.'
    )
    return 400, {
        "error": {"message": message, "code": 400, "metadata": {"provider_name": None}},
        "user_id": "user_2Nq8b7304952817Kd4096",
    }


def _xai(c: OverflowContext) -> tuple[int, Any]:
    return 400, {
        "code": "Client specified an invalid argument",
        "error": f"This model's maximum prompt length is {c.window_tokens} but the request contains {c.prompt_tokens} tokens.",
    }


def _moonshot(c: OverflowContext) -> tuple[int, Any]:
    return 400, {"error": {
        "message": f"Invalid request: Your request exceeded model token limit: {c.window_tokens}",
        "type": "invalid_request_error",
    }}


def _dashscope(c: OverflowContext) -> tuple[int, Any]:
    return 400, {
        "error": {
            "code": "invalid_parameter_error",
            "message": f"<400> InternalError.Algo.InvalidParameter: Range of input length should be [1, {c.window_tokens}]",
            "param": None,
            "type": "invalid_request_error",
        },
        "request_id": "6a8c47e9-3b7d-9a21-8c4e-" + c.request_id[-12:],
    }


OVERFLOW_STYLES: dict[str, OverflowStyle] = {
    s.name: s
    for s in (
        OverflowStyle("openai", False, _openai),
        OverflowStyle("azure", False, _openai),
        OverflowStyle("azure-input", False, _azure_input),
        OverflowStyle("vllm", True, _vllm),
        OverflowStyle("sglang", True, _sglang),
        OverflowStyle("llamacpp", False, _llamacpp),
        OverflowStyle("llamacpp-stream", False, _llamacpp_stream, "stream_error", _llamacpp, done_after=True),
        OverflowStyle("openai-midstream", False, _openai, "stream_error", role_first=True),
        OverflowStyle("lmstudio", False, _lmstudio),
        OverflowStyle("tgi", True, _tgi),
        OverflowStyle("anthropic", False, _anthropic),
        OverflowStyle("gemini", False, _gemini),
        OverflowStyle("mistral", False, _mistral),
        OverflowStyle("deepseek", True, _deepseek),
        OverflowStyle("fireworks", False, _fireworks),
        OverflowStyle("together", True, _together),
        OverflowStyle("openrouter", True, _openrouter),
        OverflowStyle("xai", False, _xai),
        OverflowStyle("moonshot", True, _moonshot),
        OverflowStyle("dashscope", False, _dashscope),
        OverflowStyle("sse-error", False, _openai, "sse_error"),
        OverflowStyle("ollama", False, _openai, "truncate"),
        OverflowStyle("lmstudio-silent", False, _openai, "silent_empty"),
    )
}
"""Every overflow style by name; iterate it to test each provider's shape."""

STYLE_ALIASES = {"llamacpp-2025-midstream": "llamacpp-stream"}
"""Names used by the shared cases for the same behaviour (case 014)."""


def style_for(name: str) -> OverflowStyle:
    """The style called ``name`` (aliases resolved; ``+`` framing modifiers kept in ``framing``);
    unknown names are ``openai``."""
    base, *framing = name.split("+")
    style = OVERFLOW_STYLES.get(STYLE_ALIASES.get(base, base), OVERFLOW_STYLES["openai"])
    return dataclasses.replace(style, framing=frozenset(framing)) if framing else style
