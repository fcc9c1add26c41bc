"""Recognize providers' context-overflow errors and read the context window they state.

Table-driven: ``OVERFLOW_RULES`` lists, per provider style, a regular expression that identifies
the error's wording and, where the wording states it, captures the limit N. N is always the
model's maximum (the context window, or for TGI/Together the maximum of input + ``max_new_tokens``,
which is the same number), never the prompt size X, and never digits from request ids, org ids or
model names: limits are read only from the capture group of a rule anchored on its wording, or
from llama.cpp's numeric ``n_ctx`` field.

Not overflows (``None``): output-cap errors ("max_tokens is too large ... supports at most N
completion tokens", DashScope "Range of max_tokens"), per-minute quota and rate-limit errors
(429; 413 with type ``tokens`` or code ``rate_limit_exceeded``; "tokens per minute"), tool-pairing
400s, unsupported parameters, other 400s and 5xx. A 413 that is not a quota error is a
``body_size`` overflow (the request's bytes, not its tokens: Anthropic's ``request_too_large``,
a proxy's "Request Entity Too Large").

Bodies are parsed defensively: JSON objects, JSON lists (Gemini), string ``error`` fields
(LM Studio, xAI, TGI), nested ``error.message``, top-level ``message`` (Fireworks), ``detail``
(FastAPI-style servers), or plain text. Nothing here raises.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson


@dataclass(frozen=True)
class Overflow:
    """A recognized overflow. ``limit_tokens`` is the stated context window (``None`` if not
    stated); ``provider_style`` names the rule that matched; ``message`` is the provider's text."""

    kind: Literal["context", "body_size"]
    limit_tokens: int | None
    provider_style: str
    message: str


@dataclass(frozen=True)
class OverflowRule:
    """One provider's wording: ``pattern`` matches the error text; group ``limit`` (if present)
    captures the stated window."""

    provider_style: str
    pattern: re.Pattern[str]


def _rule(style: str, regex: str) -> OverflowRule:
    return OverflowRule(style, re.compile(regex, re.IGNORECASE | re.DOTALL))


_N = r"(?P<limit>\d[\d,]*)"

OVERFLOW_RULES: tuple[OverflowRule, ...] = (
    # Azure OpenAI: "Input tokens exceed the configured limit of 272000 tokens."
    _rule("azure", rf"input tokens exceed the configured limit of {_N} tokens"),
    # LM Studio: "(n_keep: 13055>= n_ctx: 2048)"; "loaded with context length of only 4096 tokens"
    _rule("lmstudio", rf"n_keep:\s*\d+\s*>=?\s*n_ctx:\s*{_N}"),
    _rule("lmstudio", rf"context length of only {_N} tokens"),
    # TGI and Together: "`inputs` tokens + `max_new_tokens` must be <= 4097. Given: ..."
    _rule("tgi", rf"`?inputs`? tokens \+ `?max_new_tokens`? must be <= {_N}"),
    _rule("tgi", rf"`?inputs`? must have less than {_N} tokens"),
    # Anthropic: "prompt is too long: 250000 tokens > 200000 maximum";
    # "input length and `max_tokens` exceed context limit: 198000 + 8192 > 200000"
    _rule("anthropic", rf"prompt is too long: \d+ tokens > {_N} maximum"),
    _rule("anthropic", rf"exceed context limit: \d+ \+ \d+ > {_N}"),
    # Gemini: "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."
    _rule("gemini", rf"exceeds the maximum number of tokens allowed \({_N}\)"),
    # Mistral: "Prompt contains 40000 tokens ..., too large for model with 32768 maximum context length"
    _rule("mistral", rf"too large for model with {_N} maximum context length"),
    # Fireworks: "The prompt is too long: 264613, model maximum context length: 262141"
    _rule("fireworks", rf"model maximum context length:?\s*{_N}"),
    # xAI: "This model's maximum prompt length is 131072 but the request contains 140000 tokens."
    _rule("xai", rf"maximum prompt length is {_N}"),
    # Moonshot: "Your request exceeded model token limit: 8192"
    _rule("moonshot", rf"exceeded model token limit:?\s*{_N}"),
    # DashScope (Qwen): "Range of input length should be [1, 2048]"
    _rule("dashscope", rf"range of input length should be \[\s*\d+\s*,\s*{_N}\s*\]"),
    # SGLang: "The input (5000 tokens) is longer than the model's context length (4096 tokens)."
    _rule("sglang", rf"longer than the model's context length \({_N} tokens\)"),
    # vLLM V1: "The decoder prompt (length 5000) is longer than the maximum model length of 4096."
    _rule("vllm", rf"longer than the maximum model length of {_N}"),
    _rule("vllm", rf"too long to fit into the model \(context length {_N}"),
    # OpenAI, DeepSeek, vLLM, OpenRouter, Groq: "This model's maximum context length is 8192 tokens."
    _rule("openai-compatible", rf"maximum context length is {_N} tokens"),
    # SGLang (input + output over the window): "exceeds the model's maximum context length of 4096 tokens"
    _rule("sglang", rf"maximum context length of {_N} tokens"),
    # Cohere: "total number of tokens in the prompt cannot exceed 4081"
    _rule("cohere", rf"tokens in the prompt cannot exceed {_N}"),
    # Wordings without a number.
    _rule("llamacpp", r"exceeds? the available context size|larger than the max context size"),
    _rule("sglang", r"longer than the model's context length"),
    _rule("openai", r"exceeds the context window|context_length_exceeded|context window exceeded"),
    _rule("anthropic", r"prompt is too long"),
    _rule("bedrock", r"input is too long for requested model|too many input tokens"),
    _rule("ollama", r"exceeds (the )?(model'?s? )?context length|context length exceeded"),
    _rule("generic", r"maximum context length|context length is exceeded|reduce the length of the (messages|prompt)"),
)
"""Ordered: rules that capture a limit come before the wordings without one."""

_STRONG_CODES = {
    "context_length_exceeded": "openai",
    "exceed_context_size_error": "llamacpp",
}
"""``error.code``/``error.type`` values that mean overflow whatever the status (even 500)."""

_NOT_OVERFLOW = re.compile(
    r"tokens per (minute|day)|\b(tpm|tpd|rpm)\b|rate.?limit|quota|"
    r"supports at most \d+ completion tokens|range of max_tokens|max_tokens is too large|"
    r"max_completion_tokens is too large",
    re.IGNORECASE,
)
_CONTEXT_WORDS = re.compile(r"context (length|window|size)", re.IGNORECASE)
_QUOTA_CODES = frozenset({"rate_limit_exceeded", "tokens", "insufficient_quota", "rate_limit_error", "requests"})
_MESSAGE_CHARS = 2000


@dataclass
class _Parsed:
    texts: list[str]
    codes: set[str]
    n_ctx: int | None


def _collect(node: Any, out: _Parsed, depth: int = 0) -> None:
    """Walk an error body: every string under message/error/detail/msg, every code/type."""
    if depth > 6:
        return
    if isinstance(node, str):
        out.texts.append(node)
    elif isinstance(node, list):
        for item in node[:20]:
            _collect(item, out, depth + 1)
    elif isinstance(node, dict):
        for key in ("code", "type", "status", "error_type"):
            value = node.get(key)
            if isinstance(value, str):
                out.codes.add(value.strip().lower())
        n_ctx = node.get("n_ctx")
        if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0:
            out.n_ctx = n_ctx
        for key in ("error", "message", "detail", "msg", "errors", "details"):
            if key in node:
                _collect(node[key], out, depth + 1)


def _parse(body: bytes) -> _Parsed:
    out = _Parsed([], set(), None)
    try:
        data = orjson.loads(body)
    except (orjson.JSONDecodeError, TypeError):
        out.texts.append(body[:_MESSAGE_CHARS * 4].decode("utf-8", "replace"))
        return out
    _collect(data, out)
    return out


def _limit(match: re.Match[str]) -> int | None:
    raw = match.groupdict().get("limit")
    if not raw:
        return None
    value = int(raw.replace(",", ""))
    return value if value > 0 else None


def _classify(status: int, parsed: _Parsed) -> Overflow | None:
    text = "\n".join(t for t in parsed.texts if t)[: _MESSAGE_CHARS * 4]
    message = text[:_MESSAGE_CHARS]
    if status == 429 or parsed.codes & _QUOTA_CODES:
        return None
    strong = next((_STRONG_CODES[c] for c in parsed.codes if c in _STRONG_CODES), None)
    if strong is None and (status >= 500 or status < 400):
        return None
    if strong is None and _NOT_OVERFLOW.search(text) and not _CONTEXT_WORDS.search(text):
        return None
    for rule in OVERFLOW_RULES:
        match = rule.pattern.search(text)
        if match and (status != 413 or _limit(match)):
            limit = parsed.n_ctx or _limit(match)
            return Overflow("context", limit, strong or rule.provider_style, message)
    if strong:
        return Overflow("context", parsed.n_ctx, strong, message)
    if status == 413:
        return Overflow("body_size", None, "http-413", message)
    return None


def classify_error(status: int, body: bytes, headers: Mapping[str, str] | None = None) -> Overflow | None:
    """Classify an upstream error response. Returns an ``Overflow`` or ``None`` (not an overflow).

    ``status`` is the HTTP status, ``body`` the raw response bytes. ``headers`` is accepted for
    future rules (none need it yet). Never raises.
    """
    try:
        return _classify(int(status), _parse(bytes(body)))
    except Exception:  # noqa: BLE001 - classification must never break the error path
        return None


def classify_stream_event(data: bytes) -> Overflow | None:
    """Classify one server-sent event payload (with or without its ``data:`` prefix) seen before
    any content of an HTTP 200 stream: an ``{"error": ...}`` event (llama.cpp's
    ``exceed_context_size_error``, an Anthropic-style ``{"type": "error"}``) is read as a 400
    error body. Ordinary chunks and ``[DONE]`` give ``None``. Never raises.
    """
    try:
        payload = bytes(data).strip()
        if payload.startswith(b"data:"):
            payload = payload[5:].strip()
        if not payload.startswith(b"{"):
            return None
        parsed = orjson.loads(payload)
        if not isinstance(parsed, dict) or ("error" not in parsed and parsed.get("type") != "error"):
            return None
        return classify_error(400, payload)
    except Exception:  # noqa: BLE001
        return None
