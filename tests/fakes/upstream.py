"""A fake OpenAI-compatible upstream that behaves like a strict provider, for end-to-end tests.

``create_fake_upstream() -> (app, state)``: ``app`` is a raw ASGI application (run it with
``tests.fakes.server.UvicornServer``), ``state`` a ``FakeState`` that records every request and
holds the controls. Behaviour is chosen by the model name, ``fake-<window>-<style>``
(``fake-8k-vllm``: 8,192-token window, vLLM's overflow error); other names use
``state.windows`` / ``state.styles`` (default 131,072 tokens, ``openai``).

Parts: ``tokens`` (counting rule), ``styles`` (``OVERFLOW_STYLES``, one per provider),
``validation`` (strict checks), ``responders`` (the deterministic model), ``wire`` (chunks),
``completions`` (the chat route), ``endpoints`` (models, embeddings, responses, echo).

Routes: ``POST /v1/chat/completions``, ``GET /v1/models``, ``POST /v1/embeddings``,
``POST /v1/responses``, ``* /v1/echo/{path}``; anything else is a 404 in OpenAI's envelope.
Faults of ``state.fail_next`` apply to every route but ``GET /v1/models``:
``("status", code, body[, headers])`` answers at once; ``("sse", parts)`` answers HTTP 200 with
an event stream of exactly ``parts`` (bytes); ``("delay", s[, status_fault])`` waits before handling (or before that answer); the others
(``cut_stream``, ``stall``) are applied by the chat route.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.fakes.asgi import (
    Exchange,
    Receive,
    Scope,
    Send,
    decode_headers,
    finish,
    read_body,
    send_bytes,
    send_part,
    start,
)
from tests.fakes.completions import chat_completions
from tests.fakes.endpoints import echo, embeddings, list_models, responses
from tests.fakes.responders import DEFAULT_RESPONDERS, Prompt, Reply, Responder
from tests.fakes.state import FakeState, ReceivedRequest
from tests.fakes.styles import OVERFLOW_STYLES, OverflowStyle
from tests.fakes.tokens import count_prompt_tokens

__all__ = [
    "DEFAULT_RESPONDERS", "OVERFLOW_STYLES", "FakeState", "FakeUpstream", "OverflowStyle", "Prompt",
    "ReceivedRequest", "Reply", "Responder", "count_prompt_tokens", "create_fake_upstream",
]


class FakeUpstream:
    """The ASGI application; one instance per ``FakeState``."""

    def __init__(self, state: FakeState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        if scope["type"] != "http":
            return None
        raw = await read_body(receive)
        method, path = scope["method"], scope["path"]
        try:
            parsed: Any = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        record = self.state.record(method=method, path=path, query=scope.get("query_string", b"").decode("latin-1"),
                                   headers=dict(decode_headers(scope)), json=parsed, body=raw)
        fault = None if (method, path) == ("GET", "/v1/models") else self.state.pop_fault()
        ex = Exchange(scope, send, self.state, record, raw, parsed, self.state.next_request_id(), fault)
        if fault and fault[0] == "delay":
            await asyncio.sleep(float(fault[1]))
            fault = fault[2] if len(fault) > 2 else fault  # ("delay", s, ("status", ...)): then that answer
        if fault and fault[0] == "status":
            return await _status_fault(ex, fault)
        if fault and fault[0] == "sse":
            return await _sse_fault(ex, fault)
        await _route(method, path)(ex)
        return None


def _route(method: str, path: str) -> Any:
    if path.startswith("/v1/echo/") or path == "/v1/echo":
        return echo
    routes = {
        ("POST", "/v1/chat/completions"): chat_completions,
        ("GET", "/v1/models"): list_models,
        ("POST", "/v1/embeddings"): embeddings,
        ("POST", "/v1/responses"): responses,
    }
    return routes.get((method, path.rstrip("/")), _not_found)


async def _not_found(ex: Exchange) -> None:
    message = f"Invalid URL ({ex.scope['method']} {ex.scope['path']})"
    await ex.respond_json(404, {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}, "invalid")


async def _status_fault(ex: Exchange, fault: tuple[Any, ...]) -> None:
    status, body = int(fault[1]), fault[2] if len(fault) > 2 else None
    headers = dict(fault[3]) if len(fault) > 3 else {}
    ex.record.status, ex.record.outcome = status, "fault"
    if isinstance(body, (dict, list)):
        return await ex.respond_json(status, body, "fault", headers)
    payload = body.encode() if isinstance(body, str) else (body or b"")
    await send_bytes(ex.send, status, payload, {"content-type": "text/plain; charset=utf-8", **ex.headers, **headers})
    return None


async def _sse_fault(ex: Exchange, fault: tuple[Any, ...]) -> None:
    """HTTP 200 ``text/event-stream`` whose body is ``fault[1]``'s parts, sent as they are."""
    ex.record.status, ex.record.outcome = 200, "fault"
    await start(ex.send, 200, {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", **ex.headers})
    for part in fault[1]:
        await send_part(ex.send, part)
    await finish(ex.send)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def create_fake_upstream(state: FakeState | None = None) -> tuple[FakeUpstream, FakeState]:
    """A new fake upstream app and its state (pass ``state`` to share one)."""
    state = state if state is not None else FakeState()
    return FakeUpstream(state), state
