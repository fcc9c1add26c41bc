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

Besides the window N, a wording may state the rejected prompt's size X (``Overflow.prompt_tokens``,
``PROMPT_RULES``; llama.cpp's ``n_prompt_tokens`` field). Both numbers are the provider's words
only: given the request that was sent (``sent=``), text that quotes a client's own strings (ids,
names, values a 400 lists back) is masked before the rules read it, and a number whose wording
occurs inside a client string is not believed (``proxy.compaction.limits`` judges the rest).

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

from proxy.json_text import parse_json

SentBody = Mapping[str, object]
"""The request body that was forwarded, parsed (a JSON object: its values are read as JSON)."""


@dataclass(frozen=True)
class Overflow:
    """A recognized overflow. ``limit_tokens`` is the stated context window (``None`` if not
    stated); ``provider_style`` names the rule that matched; ``message`` is the provider's text;
    ``prompt_tokens`` the size of the rejected prompt as the provider states it (``None`` if not
    stated). Both numbers come from the provider's own wording only, never from text that
    echoes the client's strings (see ``classify_error``'s ``sent``)."""

    kind: Literal["context", "body_size"]
    limit_tokens: int | None
    provider_style: str
    message: str
    prompt_tokens: int | None = None


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

PROMPT_RULES: tuple[re.Pattern[str], ...] = tuple(
    re.compile(r, re.IGNORECASE)
    for r in (
        r"prompt is too long: (?P<prompt>\d[\d,]*)",  # Anthropic, Fireworks
        r"exceed context limit: (?P<prompt>\d+) \+",  # Anthropic, input + max_tokens
        r"input token count \((?P<prompt>\d+)\)",  # Gemini
        r"prompt contains (?P<prompt>\d+) tokens",  # Mistral
        r"request contains (?P<prompt>\d+) tokens",  # xAI
        r"the input \((?P<prompt>\d+) tokens\)",  # SGLang
        r"prompt \(length (?P<prompt>\d+)\)",  # vLLM V1
        r"\((?P<prompt>\d+) in the messages",  # OpenAI: "you requested X tokens (Y in the messages, ...)"
        r"messages resulted in (?P<prompt>\d+) tokens",  # OpenAI, DeepSeek
        r"given: (?P<prompt>\d+) `?inputs`? tokens",  # TGI, Together
        r"n_keep:\s*(?P<prompt>\d+)\s*>=?\s*n_ctx",  # LM Studio
    )
)
"""Wordings that state the rejected prompt's size X (read only once a rule has matched)."""

MIN_ECHO_CHARS = 8
"""Client strings at least this long are masked out of an error's text before it is read: a
provider that quotes a client's id, name or value (OpenAI lists unanswered ``tool_call_id``s)
must not make that text read as an overflow or a stated window. Shorter strings are left (they
would mask the provider's own words), and no rule's wording fits in pieces shorter than this."""
MAX_ECHO_STRINGS = 100_000
"""Client strings looked at, at most (a body is walked only when an error's text matched a rule)."""
MAX_MASK_CHARS = 8_000_000
"""Characters of error text searched, over all client strings, before masking gives up (and no
stated number is believed): strings that share their first characters with the text are each
searched for, so without a bound a crafted body costs strings x text."""

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
    n_prompt: int | None = None


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
        n_prompt = node.get("n_prompt_tokens")
        if isinstance(n_prompt, int) and not isinstance(n_prompt, bool) and n_prompt > 0:
            out.n_prompt = n_prompt
        for key in ("error", "message", "detail", "msg", "errors", "details"):
            if key in node:
                _collect(node[key], out, depth + 1)


def _parse(body: bytes) -> _Parsed:
    out = _Parsed([], set(), None)
    try:
        data = parse_json(body)  # a lone surrogate escape is read (``proxy.json_text``)
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


WIRE_KEYS = frozenset({
    "messages", "content", "tool_calls", "tool_call_id", "function", "function_call", "functions", "arguments",
    "parameters", "properties", "description", "required", "additionalProperties", "max_tokens",
    "max_completion_tokens", "stream_options", "include_usage", "response_format", "temperature", "tool_choice",
    "image_url", "input_audio", "reasoning_effort", "parallel_tool_calls", "presence_penalty", "frequency_penalty",
    "logit_bias", "top_logprobs", "annotations", "reasoning_content", "json_schema", "prediction", "modalities",
    "metadata", "service_tier", "cache_control", "prompt_cache_key", "safety_identifier", "web_search_options",
})
"""Keys of OpenAI's chat request schema: a body's keys are masked like its values (an unknown
field's name may be quoted back), except these, which are the provider's words as much as ours."""


def _fold(text: str) -> str:
    """``text`` lower-cased character for character (same length, so offsets agree): the few
    characters whose lower case is longer (``İ``) become ``\x01``."""
    low = text.lower()
    if len(low) == len(text):  # lower() never shortens: equal lengths mean one to one
        return low
    return "".join(c if len(c) == 1 else "\x01" for c in map(str.lower, text))


class _Echoes:
    """The client's strings in the request body ``sent`` (values, and keys but ``WIRE_KEYS``), at
    least ``MIN_ECHO_CHARS`` long; at most ``MAX_ECHO_STRINGS`` of them (``complete`` says
    whether that was all, and whether ``mask`` searched for all of them). Read only when an
    error's text matched an overflow rule."""

    def __init__(self, sent: SentBody) -> None:
        self.strings: list[str] = []
        stack: list[object] = [sent]
        while stack:
            node = stack.pop()
            if isinstance(node, str):
                if len(node) >= MIN_ECHO_CHARS:
                    if len(self.strings) >= MAX_ECHO_STRINGS:
                        break
                    self.strings.append(node)
            elif isinstance(node, dict):
                stack.extend(k for k in node if k not in WIRE_KEYS)
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
        self.complete = not stack
        self._haystack: str | None = None

    def mask(self, text: str) -> str:
        """``text`` with each verbatim quote of a client string (case-insensitive) replaced by NUL
        characters of the same length (no rule matches across a NUL). Linear in the strings and
        in ``text``: a string is searched for only when its first ``MIN_ECHO_CHARS`` characters
        occur in ``text``, and a search goes on after each occurrence."""
        folded = _fold(text)
        n, k = len(folded), MIN_ECHO_CHARS
        if n < k:
            return text
        shingles = {folded[i:i + k] for i in range(n - k + 1)}
        covered = bytearray(n)
        budget = MAX_MASK_CHARS
        for string in self.strings:
            if len(string) > n or _fold(string[:k]) not in shingles:
                continue
            budget -= n
            if budget < 0:  # many strings alike: stop, and believe no stated number (``quote``)
                self.complete = False
                break
            needle = _fold(string)
            start = folded.find(needle)
            while start != -1:
                covered[start:start + len(needle)] = b"\x01" * len(needle)
                start = folded.find(needle, start + len(needle))
        if not any(covered):
            return text
        return "".join("\x00" if c else ch for ch, c in zip(text, covered, strict=True))

    def quote(self, fragment: str) -> bool:
        """Does ``fragment`` occur (case-insensitive) inside some client string, or might it (not
        every string was read)? A provider that quotes a client's string in part (vLLM cuts
        ``input_value`` at 25 characters) is quoting it, not stating numbers of its own."""
        if not self.complete:
            return True
        if self._haystack is None:
            self._haystack = "\x00".join(map(_fold, self.strings))
        return _fold(fragment) in self._haystack


def _rule_match(text: str, status: int) -> tuple[OverflowRule, re.Match[str]] | None:
    for rule in OVERFLOW_RULES:
        match = rule.pattern.search(text)
        if match and (status != 413 or _limit(match)):
            return rule, match
    return None


def _prompt(text: str, echoes: _Echoes | None) -> int | None:
    for pattern in PROMPT_RULES:
        match = pattern.search(text)
        if match:
            if echoes is not None and echoes.quote(match.group(0)):
                return None
            value = int(match.group("prompt").replace(",", ""))
            return value if value > 0 else None
    return None


def _classify(status: int, parsed: _Parsed, sent: SentBody | None) -> Overflow | None:
    """The rules in order: quota and status first (no text read), then the wording on the raw text
    (most errors stop here), and only when a rule matched, the same on the text with the client's
    quoted strings masked; numbers are believed only when their wording quotes no client string."""
    if status == 429 or parsed.codes & _QUOTA_CODES:
        return None
    strong = next((_STRONG_CODES[c] for c in parsed.codes if c in _STRONG_CODES), None)
    if strong is None and (status >= 500 or status < 400):
        return None
    raw = "\n".join(t for t in parsed.texts if t)[: _MESSAGE_CHARS * 4]
    message = raw[:_MESSAGE_CHARS]
    if strong is None and _NOT_OVERFLOW.search(raw) and not _CONTEXT_WORDS.search(raw):
        return None
    found = _rule_match(raw, status)
    echoes, text = None, raw
    if found is not None and sent is not None:
        echoes = _Echoes(sent)
        text = echoes.mask(raw)
        found = _rule_match(text, status) if text is not raw else found
    if found is None:
        if strong:
            return Overflow("context", parsed.n_ctx, strong, message, parsed.n_prompt or _prompt(text, echoes))
        return Overflow("body_size", None, "http-413", message) if status == 413 else None
    rule, match = found
    stated = _limit(match) if echoes is None or not echoes.quote(match.group(0)) else None
    prompt = parsed.n_prompt or _prompt(text, echoes)
    return Overflow("context", parsed.n_ctx or stated, strong or rule.provider_style, message, prompt)


def classify_error(status: int, body: bytes, headers: Mapping[str, str] | None = None, *,
                   sent: SentBody | None = None) -> Overflow | None:
    """Classify an upstream error response. Returns an ``Overflow`` or ``None`` (not an overflow).

    ``status`` is the HTTP status, ``body`` the raw response bytes. ``headers`` is accepted for
    future rules (none need it yet). ``sent``: the request body that was forwarded (a dict), so
    that the client's own strings quoted back in the error text are read as nothing
    (``_Echoes``); ``None`` reads the whole text. Never raises.
    """
    try:
        return _classify(int(status), _parse(bytes(body)), sent)
    except Exception:  # noqa: BLE001 - classification must never break the error path
        return None


def classify_stream_event(data: bytes, *, sent: SentBody | None = None) -> Overflow | None:
    """Classify one server-sent event payload (with or without its ``data:`` prefix) seen before
    any content of an HTTP 200 stream: an ``{"error": ...}`` event (llama.cpp's
    ``exceed_context_size_error``, an Anthropic-style ``{"type": "error"}``) is read as a 400
    error body. Ordinary chunks and ``[DONE]`` give ``None``. ``sent``: as for ``classify_error``.
    Never raises.
    """
    try:
        payload = bytes(data).strip()
        if payload.startswith(b"data:"):
            payload = payload[5:].strip()
        if not payload.startswith(b"{"):
            return None
        parsed = parse_json(payload)
        if not isinstance(parsed, dict) or ("error" not in parsed and parsed.get("type") != "error"):
            return None
        return classify_error(400, payload, sent=sent)
    except Exception:  # noqa: BLE001
        return None
