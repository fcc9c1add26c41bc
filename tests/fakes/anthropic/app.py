"""The fake Anthropic provider's ASGI application: routes, header checks, answers.

Routes: ``POST /v1/messages`` (JSON Message, or an event stream with ``"stream": true``) and
``POST /v1/messages/count_tokens`` (``{"input_tokens": N}``, ``message_tokens_count.py``); any
other path is a 404 ``not_found_error``. Every request is recorded first (``state.requests``).

Order of checks, as the API's layers apply them:

1. body size over ``state.max_body_bytes`` (32 MB by default) → 413 ``request_too_large``,
   ``Request exceeds the maximum allowed number of bytes.`` (errors docs: Cloudflare answers it
   before the API, so before authentication);
2. credentials: ``x-api-key``, or ``Authorization: Bearer`` (what the official SDK sends for an
   API key, ``anthropic/_client.py``); none → 401 ``authentication_error`` ``x-api-key header is
   required``; a key outside ``state.api_keys`` → 401 ``invalid x-api-key`` (both as the API
   answers them in public reports: n8n-io/n8n#37930; the API docs' authentication section);
3. ``anthropic-version`` missing → 400 ``anthropic-version: header is required`` (versioning
   docs: the header is required; wording from yrvelez/claudeR#1). Any value is accepted and
   recorded; ``anthropic-beta`` is recorded unchanged and opens the beta body fields;
4. a scripted fault of ``state.fail_next`` (``state.py``);
5. JSON, then ``validation.py``, ``turns.py`` (tool pairing), ``thinking.py`` (signatures);
6. the context window, input counted by ``tokens.py`` (wording as the API answers it:
   bolt.new#1748, continuedev/continue#6080)::

       prompt is too long: {input} tokens > {window} maximum
       input length and `max_tokens` exceed context limit: {input} + {max_tokens} > {window}, decrease input length or `max_tokens` and try again

   (the second on ``/v1/messages`` only: the context-windows docs, since Claude 3.7 the API
   validates prompt + ``max_tokens`` instead of lowering ``max_tokens``);
7. the prompt cache (``cache.py``), then the reply (``compose.py``, ``wire.py``).

Response headers: ``request-id`` (``req_011C…``; also ``request_id`` in error bodies) and the
``anthropic-ratelimit-*`` family of the rate-limits docs with example values.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from typing import Any

from tests.fakes.anthropic.compose import compose
from tests.fakes.anthropic.errors import ApiError, error_body, invalid
from tests.fakes.anthropic.state import COUNT_TOKENS_PATH, MESSAGES_PATH, FakeAnthropicState, ReceivedRequest
from tests.fakes.anthropic.thinking import verify_thinking
from tests.fakes.anthropic.tokens import count_input_tokens, prompt_segments
from tests.fakes.anthropic.turns import check_tool_pairing, merge_turns
from tests.fakes.anthropic.validation import check_body
from tests.fakes.anthropic.wire import make_id, message_object, sse_event, stream_events, usage_object
from tests.fakes.asgi import Receive, Scope, Send, decode_headers, finish, read_body, send_json, send_part, start

DEFAULT_FAULT_MESSAGES = {429: "Number of request tokens has exceeded your per-minute rate limit", 500: "Internal server error",
                          529: "Overloaded"}
SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}


def rate_limit_headers() -> dict[str, str]:
    """Example ``anthropic-ratelimit-*`` headers (rate-limits docs), reset a minute from now."""
    reset = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    out: dict[str, str] = {}
    for name, limit in (("requests", 4000), ("tokens", 2_000_000), ("input-tokens", 2_000_000), ("output-tokens", 400_000)):
        out[f"anthropic-ratelimit-{name}-limit"] = str(limit)
        out[f"anthropic-ratelimit-{name}-remaining"] = str(limit - 1 if name == "requests" else limit)
        out[f"anthropic-ratelimit-{name}-reset"] = reset
    return out


class FakeAnthropic:
    """The ASGI application; one instance per ``FakeAnthropicState``."""

    def __init__(self, state: FakeAnthropicState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]
                await send({"type": kind + ".complete"})
                if kind == "lifespan.shutdown":
                    return
        if scope["type"] != "http":
            return
        raw = await read_body(receive)
        try:
            parsed: Any = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        query = scope.get("query_string", b"").decode("latin-1")
        request = self.state.record(method=scope["method"], path=scope["path"], query=query,
                                    headers=dict(decode_headers(scope)), raw=raw, json=parsed)
        request_id = make_id("req_011C")
        headers = {"request-id": request_id, **rate_limit_headers()}
        try:
            await self._answer(request, raw, send, headers)
        except ApiError as exc:
            request.status, request.error = exc.status, exc.message
            request.outcome = request.outcome or "invalid"
            await send_json(send, exc.status, error_body(exc.error_type, exc.message, request_id), {**headers, **exc.headers})

    async def _answer(self, request: ReceivedRequest, raw: bytes, send: Send, headers: dict[str, str]) -> None:
        state = self.state
        endpoint = {MESSAGES_PATH: "messages", COUNT_TOKENS_PATH: "count_tokens"}.get(request.path)
        if endpoint is None or request.method != "POST":
            request.outcome = "not_found"
            raise ApiError(404, "Not Found")
        if len(raw) > state.max_body_bytes:
            request.outcome = "too_large"
            raise ApiError(413, "Request exceeds the maximum allowed number of bytes.")
        _check_headers(request, state)
        fault = state.pop_fault()
        if fault and fault[0] == "delay":
            await asyncio.sleep(float(fault[1]))
            fault = None
        if fault and fault[0] == "status":
            request.outcome = "fault"
            status = int(fault[1])
            message = fault[2] if len(fault) > 2 else DEFAULT_FAULT_MESSAGES.get(status, "Error")
            raise ApiError(status, message, headers=fault[3] if len(fault) > 3 else None)
        body = request.json
        if body is None:
            raise invalid("There was an issue with the format or content of your request: the body is not valid JSON.")
        beta = "beta=true" in request.query or "anthropic-beta" in request.headers
        check_body(body, endpoint, beta, state.extra_fields, output_room=state.output_room_checked)
        turns = merge_turns(body["messages"])
        check_tool_pairing(turns)
        verify_thinking(body, turns, state.signer, state.issued)
        segments = prompt_segments(body)
        input_tokens = count_input_tokens(segments)
        request.input_tokens = input_tokens
        _check_window(request, body, endpoint, input_tokens, state.window_for(body["model"]), state)
        if endpoint == "count_tokens":
            request.status, request.outcome, request.response = 200, "ok", {"input_tokens": input_tokens}
            return await send_json(send, 200, request.response, headers)
        state.cache.min_cacheable_tokens = state.min_cacheable_tokens
        split = state.cache.account(body["model"], segments, body.get("cache_control") is not None)
        composed = compose(body, state.next_reply(request), state.signer)
        ttl = _last_ttl(body)
        usage = usage_object(split, composed.output_tokens, ttl)
        message = message_object(make_id("msg_01"), body["model"], composed.content, composed.stop_reason,
                                 composed.stop_sequence, usage)
        request.status, request.outcome, request.usage, request.response = 200, "ok", usage, message
        if body.get("stream") is True:
            return await self._stream(send, headers, message, fault)
        if fault and fault[0] == "stream_error":  # not a stream: the same error as a status
            request.outcome = "fault"
            raise ApiError(529 if fault[1] == "overloaded_error" else 500, str(fault[2]) if len(fault) > 2 else "Overloaded",
                           str(fault[1]))
        return await send_json(send, 200, message, headers)

    async def _stream(self, send: Send, headers: dict[str, str], message: dict[str, Any], fault: Any) -> None:
        events = stream_events(message)
        if fault and fault[0] == "stream_error":
            self.state.requests[-1].outcome = "fault"
            error = error_body(str(fault[1]), str(fault[2]) if len(fault) > 2 else "Overloaded", None)
            events = [*events[:2], ("error", error)]
        await start(send, 200, {**SSE_HEADERS, **headers})
        for name, data in events:
            await send_part(send, sse_event(name, data))
            if self.state.chunk_delay_s:
                await asyncio.sleep(self.state.chunk_delay_s)
        await finish(send)


def _check_headers(request: ReceivedRequest, state: FakeAnthropicState) -> None:
    key = request.headers.get("x-api-key")
    authorization = request.headers.get("authorization", "")
    if not key and authorization.lower().startswith("bearer "):
        key = authorization[7:].strip()
    if not key:
        request.outcome = "unauthorized"
        raise ApiError(401, "x-api-key header is required")
    if state.api_keys is not None and key not in state.api_keys:
        request.outcome = "unauthorized"
        raise ApiError(401, "invalid x-api-key")
    if not request.headers.get("anthropic-version"):
        raise invalid("anthropic-version: header is required")


def _check_window(request: ReceivedRequest, body: dict[str, Any], endpoint: str, input_tokens: int, window: int,
                  state: FakeAnthropicState) -> None:
    if input_tokens > window:
        request.outcome = "overflow"
        raise invalid(f"prompt is too long: {input_tokens} tokens > {window} maximum")
    max_tokens = body.get("max_tokens", 0) if endpoint == "messages" and state.output_room_checked else 0
    if input_tokens + max_tokens > window:
        request.outcome = "overflow"
        raise invalid(
            f"input length and `max_tokens` exceed context limit: {input_tokens} + {max_tokens} > {window}, "
            "decrease input length or `max_tokens` and try again"
        )


def _last_ttl(body: dict[str, Any]) -> str:
    """The ``ttl`` of the last ``cache_control`` in the prompt (``5m`` when none says ``1h``)."""
    marks: list[Any] = [t.get("cache_control") for t in body.get("tools") or [] if isinstance(t, dict)]
    system = body.get("system")
    marks += [b.get("cache_control") for b in system if isinstance(b, dict)] if isinstance(system, list) else []
    for message in body["messages"]:
        content = message.get("content")
        marks += [b.get("cache_control") for b in content if isinstance(b, dict)] if isinstance(content, list) else []
    marks.append(body.get("cache_control"))
    marks = [m for m in marks if isinstance(m, dict)]
    return str(marks[-1].get("ttl", "5m")) if marks else "5m"
