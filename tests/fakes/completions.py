"""``POST /v1/chat/completions`` of the fake upstream: checks, overflow, reply, streaming.

Order of checks (as a provider gateway applies them): JSON parse, body size (413, Anthropic's
``request_too_large``, case 019), strict validation (``validation.py``), tokens-per-minute
quota (413 Groq, case 032), context window (the model's overflow style, ``styles.py``). Then
the responders answer (``responders.py``), as one JSON object or an event stream.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

from tests.fakes.asgi import Exchange, finish, send_part, start
from tests.fakes.responders import Reply, build_prompt, is_summary_request
from tests.fakes.stream_overflow import overflow_frames
from tests.fakes.styles import OverflowContext, OverflowStyle
from tests.fakes.tokens import (
    FALLBACK_BYTES_PER_TOKEN,
    count_prompt_tokens,
    count_text_tokens,
    count_tools_tokens,
    encoding,
    message_text,
    requested_output_tokens,
)
from tests.fakes.validation import validate_chat_request
from tests.fakes.wire import (
    SSE_DONE,
    completion_object,
    first_chunk,
    sse_data,
    stream_chunks,
    usage_object,
)

SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
KEEP_HEAD_TOKENS = 4
"""Ollama keeps the first 4 tokens of an over-long prompt (case 017)."""
OBFUSCATION_PAD = "v8Qe2LrTz0KcXw5NbHj"
"""OpenAI's ``obfuscation`` pad of each streamed chunk (on unless ``stream_options.include_obfuscation``
is ``false``): random characters of varying length, to normalize payload sizes; here cut from
this string, a length per chunk (the client ignores its value)."""
OBFUSCATING_STYLES = frozenset({"openai", "openai-midstream"})
"""The styles of OpenAI itself, the one provider that pads (vLLM, llama.cpp, Ollama and the other
OpenAI-compatible servers send no ``obfuscation``)."""


async def chat_completions(ex: Exchange) -> None:
    """Answer one chat-completions request (see module docstring)."""
    state, body = ex.state, ex.body
    if not isinstance(body, dict):
        msg = "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly.)"
        return await ex.respond_json(400, _openai_error(msg), "invalid")
    model = body.get("model") if isinstance(body.get("model"), str) else ""
    style = state.style_for(model)
    if style.name == "anthropic":
        ex.headers["request-id"] = ex.request_id
    ex.record.is_summary = is_summary_request(body.get("messages"), state.summary_substring)
    if state.max_body_bytes is not None and len(ex.raw) > state.max_body_bytes:
        too_large = {"type": "error", "error": {"type": "request_too_large", "message": "Request exceeds the maximum size"}}
        return await ex.respond_json(413, too_large, "too_large")
    rejection = validate_chat_request(body, style.name, state.policy_for(model))
    if rejection is not None:
        return await ex.respond_json(rejection.status, rejection.body, "invalid")

    prompt_tokens = math.ceil(count_prompt_tokens(body) * state.count_factors.get(model, 1.0))
    output_tokens = requested_output_tokens(body)
    ex.record.prompt_tokens = prompt_tokens
    stream = body.get("stream") is True
    if state.tpm_limit is not None and prompt_tokens + output_tokens > state.tpm_limit:
        return await _tpm_error(ex, model, prompt_tokens + output_tokens)
    window = state.window_for(model)
    prompt_text = None
    if style.is_overflow(window, prompt_tokens, output_tokens):
        if style.delivery != "truncate":
            return await _overflow(ex, style, window, prompt_tokens, output_tokens, stream)
        prompt_text, prompt_tokens = truncate_front(body, window), window
        ex.record.outcome = "truncated"

    prompt = build_prompt(body, state.summary_substring, prompt_text)
    reply = next(r for r in (responder(prompt, state) for responder in state.responders) if r is not None)
    usage = usage_object(prompt_tokens, reply_tokens(reply))
    created = int(time.time())
    completion_id = "chatcmpl-" + ex.request_id.removeprefix("req_")
    answer = completion_object(reply, completion_id=completion_id, created=created, model=model, usage=usage)
    ex.record.reply = answer["choices"][0]["message"]
    ex.record.outcome = ex.record.outcome or "ok"
    if not stream:
        return await _send_completion(ex, answer)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    chunks = stream_chunks(reply, completion_id=completion_id, created=created, model=model,
                           usage=usage if include_usage else None)
    if style.name in OBFUSCATING_STYLES and (body.get("stream_options") or {}).get("include_obfuscation") is not False:
        obfuscate(chunks)
    await _send_stream(ex, [sse_data(c) for c in chunks] + [SSE_DONE])
    return None


def obfuscate(chunks: list[dict[str, Any]]) -> None:
    """Add OpenAI's ``obfuscation`` pad to each chunk object, last (``OBFUSCATION_PAD``)."""
    for i, chunk in enumerate(chunks):
        chunk["obfuscation"] = OBFUSCATION_PAD[: 1 + (7 * i) % len(OBFUSCATION_PAD)]


def reply_tokens(reply: Reply) -> int:
    """Completion tokens of a reply: content + tool-call names and arguments."""
    n = count_text_tokens(reply.content or "")
    for call in reply.tool_calls or []:
        n += count_text_tokens(call["function"]["name"]) + count_text_tokens(call["function"].get("arguments") or "")
    return n


def truncate_front(body: dict[str, Any], window_tokens: int) -> str:
    """The prompt text Ollama's model sees: first 4 and last ``window - 4`` tokens of the rendering."""
    rendered = "".join(f"<|{m.get('role')}|>\n{message_text(m)}\n" for m in body["messages"])
    enc = encoding()
    if enc is None:  # no encoding file: a token is FALLBACK_BYTES_PER_TOKEN bytes
        data, per = rendered.encode("utf-8", "surrogatepass"), FALLBACK_BYTES_PER_TOKEN
        if -(-len(data) // per) <= window_tokens:
            return rendered
        head, tail = data[: KEEP_HEAD_TOKENS * per], data[len(data) - (window_tokens - KEEP_HEAD_TOKENS) * per:]
        return (head + tail).decode("utf-8", "ignore")
    tokens = enc.encode(rendered, disallowed_special=())
    if len(tokens) <= window_tokens:
        return rendered
    kept = tokens[:KEEP_HEAD_TOKENS] + tokens[len(tokens) - (window_tokens - KEEP_HEAD_TOKENS):]
    return str(enc.decode(kept))


def _openai_error(message: str, param: Any = None, code: Any = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


async def _tpm_error(ex: Exchange, model: str, requested_tokens: int) -> None:
    limit = ex.state.tpm_limit
    message = (
        f"Request too large for model `{model}` in organization `org_01hq3x9k2m8n7p6q5r4s3t2v1w` "
        f"service tier `on_demand` on tokens per minute (TPM): Limit {limit}, Requested "
        f"{requested_tokens}, please reduce your message size and try again. Need more tokens? "
        "Upgrade to Dev Tier today at https://console.groq.com/settings/billing"
    )
    body = {"error": {"message": message, "type": "tokens", "code": "rate_limit_exceeded"}}
    headers = {"retry-after": str(ex.state.tpm_retry_after_s), "x-ratelimit-limit-tokens": str(limit),
               "x-ratelimit-remaining-tokens": str(limit)}
    await ex.respond_json(413, body, "rate_limited", headers)


async def _overflow(ex: Exchange, style: OverflowStyle, window: int, prompt_tokens: int,
                    output_tokens: int, stream: bool) -> None:
    body = ex.body
    tools_tokens = count_tools_tokens(body.get("tools"))
    ctx = OverflowContext(window, prompt_tokens, output_tokens, ex.request_id, bool(body.get("tools")), tools_tokens)
    if style.delivery == "silent_empty":
        ex.record.status, ex.record.outcome = 200, "overflow"
        if not stream:
            answer = completion_object(Reply(""), completion_id="chatcmpl-" + ex.request_id[4:],
                                       created=int(time.time()), model=body["model"],
                                       usage=usage_object(prompt_tokens, 0))
            answer["choices"][0]["finish_reason"] = None  # no finish_reason, like the stream
            return await ex.respond_json(200, answer, "overflow")
        chunk = {"id": "chatcmpl-" + ex.request_id[4:], "object": "chat.completion.chunk",
                 "created": int(time.time()), "model": body["model"],
                 "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
        return await _send_raw_stream(ex, [sse_data(chunk), SSE_DONE])
    if stream and style.delivery in ("stream_error", "sse_error"):
        _, error = style.render(ctx)
        ex.record.status, ex.record.outcome = 200, "overflow"
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        first = first_chunk(completion_id="chatcmpl-" + ex.request_id[4:], created=int(time.time()),
                            model=body["model"], include_usage=include_usage)
        return await _send_raw_stream(ex, *overflow_frames(style, error, first))
    status, error = (style.render_plain or style.render)(ctx)
    await ex.respond_json(status, error, "overflow")
    return None


async def _send_raw_stream(ex: Exchange, frames: list[bytes], gap_s: float = 0.0) -> None:
    """HTTP 200 and ``frames`` as they are (``gap_s`` between two)."""
    await start(ex.send, 200, {**SSE_HEADERS, **ex.headers})
    for i, frame in enumerate(frames):
        if i and gap_s:
            await asyncio.sleep(gap_s)
        await send_part(ex.send, frame)
    await finish(ex.send)


async def _apply_stall(ex: Exchange) -> None:
    if ex.fault and ex.fault[0] == "stall":
        await asyncio.sleep(float(ex.fault[1]))


async def _send_completion(ex: Exchange, answer: dict[str, Any]) -> None:
    payload = json.dumps(answer, separators=(",", ":")).encode()
    ex.record.status = 200
    if ex.fault and ex.fault[0] == "cut_stream":
        ex.record.outcome = "fault"
        await start(ex.send, 200, {"content-type": "application/json", **ex.headers})
        await send_part(ex.send, payload[: len(payload) // 2])
        return  # no final body message: uvicorn closes the connection mid-body
    await start(ex.send, 200, {"content-type": "application/json", "content-length": str(len(payload)), **ex.headers})
    await _apply_stall(ex)
    await ex.send({"type": "http.response.body", "body": payload, "more_body": False})


async def _wait_gate(ex: Exchange) -> None:
    gate, state = ex.state.stream_gate, ex.state
    deadline = time.monotonic() + state.stream_gate_timeout_s
    while gate is not None and not gate.is_set() and time.monotonic() < deadline:  # noqa: ASYNC110 - may be a threading.Event
        await asyncio.sleep(0.005)


async def _send_stream(ex: Exchange, frames: list[bytes]) -> None:
    state = ex.state
    cut_after = int(ex.fault[1]) if ex.fault and ex.fault[0] == "cut_stream" else None
    ex.record.status = 200
    await start(ex.send, 200, {**SSE_HEADERS, **ex.headers})
    await _apply_stall(ex)
    for i, frame in enumerate(frames):
        if cut_after is not None and i >= cut_after:
            ex.record.outcome = "fault"
            return  # no final body message: uvicorn closes the connection without [DONE]
        if i and state.chunk_delay_s:
            await asyncio.sleep(state.chunk_delay_s)
        await send_part(ex.send, frame)
        if i + 1 == state.stream_gate_after_chunks:
            state.first_chunk_sent.set()
            await _wait_gate(ex)
    await finish(ex.send)
