"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``, and every
other Anthropic call, relayed to the Anthropic upstream (``anthropic_upstream_url``).

A client reaches it with ``ANTHROPIC_BASE_URL`` set to the proxy (no ``/v1``: the ``anthropic`` SDK
and Claude Code append ``/v1/messages``). The request goes as the client sent it: body, query
(``?beta=true``), ``anthropic-version`` and ``anthropic-beta`` unchanged, the client's
``x-api-key`` or ``Authorization: Bearer``, or with a proxy-held ``anthropic_upstream_api_key`` that
key as ``x-api-key`` (the client's credentials dropped; the body still names what it names: a
``file_id``, a ``container`` or a ``skill_id`` of the operator's account, under the betas that
take them, is the provider's to check). The answer comes back byte for byte,
streams as they arrive, with the headers a client reads (``request-id``, ``retry-after``,
``anthropic-ratelimit-*``: the last not under a proxy-held key, where they are the operator's).
The tenant is the salted hash of whichever key the client sent (``Authenticator.messages_tenant``).
Errors the proxy answers itself are in Anthropic's envelope (``ProxyError.anthropic_body``).

Which requests are Anthropic's (``speaks_anthropic``): the Messages paths, and any other ``/v1/``
path sent with an ``anthropic-version`` header (every Anthropic SDK sends one; OpenAI's do not):
``GET /v1/models`` from an Anthropic client lists Anthropic's models, not OpenAI's.

``POST /v1/messages`` is also logged in its session (``proxy.forward.messages``: the turns in their
native shape, the reply, a request record); ``count_tokens`` and the other calls are not (they
are no turn of a conversation). Not yet (issue 19): the four defenses on Messages.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from proxy.admission import HeldBody
from proxy.errors import Forbidden
from proxy.forward.messages import CLAUDE_CODE_SESSION_HEADER
from proxy.forward.session_ids import header_text
from proxy.routes.answer import STATUS_KEY, CountedEndpoint, send_outcome, send_whole
from proxy.routes.body import read_asgi_body, read_body
from proxy.routes.errors import client_error
from proxy.routes.relay import relay
from proxy.upstream.urls import passthrough_target

router = APIRouter()

MESSAGES_ROUTE = "/v1/messages"
COUNT_TOKENS_ROUTE = "/v1/messages/count_tokens"
ANTHROPIC_VERSION_HEADER = "anthropic-version"
ANTHROPIC_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["type", "error"],
    "properties": {"type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"],
                                                         "properties": {"type": {"type": "string"},
                                                                        "message": {"type": "string"}}}},
}
"""Anthropic's error envelope (``proxy.errors.ProxyError.anthropic_body``)."""
SESSION_HEADERS = frozenset({CLAUDE_CODE_SESSION_HEADER, "x-session-id"})
"""Read as UTF-8 when their bytes are (``header_text``), as the chat route reads ``X-Session-Id``."""

SHARED_KEY_ALLOWED = (
    ("GET", re.compile(r"/v1/models(/[^/]+)?")),
    ("POST", re.compile(r"/v1/messages(/count_tokens)?")),
)
"""What a tenant may reach through the proxy's Anthropic key: stateless calls only. Batches, files,
skills and the admin API read or change the operator's account and are refused (403) unless the
caller is an admin."""


def speaks_anthropic(path: str, headers: Mapping[str, str]) -> bool:
    """Whether a request is for the Anthropic upstream: a Messages path (``/v1/messages`` and
    below), or any other ``/v1/`` path sent with an ``anthropic-version`` header (the read API's
    routes are the proxy's own, whatever the client sends)."""
    if path == MESSAGES_ROUTE or path.startswith(MESSAGES_ROUTE + "/"):
        return True
    return path.startswith("/v1/") and ANTHROPIC_VERSION_HEADER in headers


def anthropic_target(scope: Scope, method: str) -> str:
    """The path on the Anthropic upstream for a request: its raw path as the client wrote it (the
    upstream's base has no ``/v1``: kept) and its query, checked by ``passthrough_target`` (raises
    ``BadRequest``)."""
    raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
    query = scope.get("query_string", b"").decode("latin-1")
    if raw_path == MESSAGES_ROUTE:  # (the Messages route itself: every check passes, the query is kept as it is)
        return MESSAGES_ROUTE + ("?" + query if query else "")
    return "/v1" + passthrough_target(raw_path, query, method)


async def relay_anthropic(request: Request, content: bytes | None = None) -> StreamingResponse:
    """Relay ``request`` (any ``/v1/`` path) to the Anthropic upstream, as the module docstring says.
    Raises ``Unauthorized``/``Forbidden`` (``Authenticator.messages_tenant``), ``Forbidden`` for an
    account-wide path under the proxy's key, ``BadRequest`` for a path that could leave the upstream
    (``passthrough_target``), ``PayloadTooLarge`` past ``max_body_bytes``, ``UpstreamError``."""
    state = request.app.state.proxy
    tenant = state.auth.messages_tenant(request.headers)
    target = anthropic_target(request.scope, request.method)
    key = state.settings.anthropic_upstream_api_key
    if key is not None and state.auth.reader(request.headers) is not None and not any(
            request.method == m and rx.fullmatch(request.url.path) for m, rx in SHARED_KEY_ALLOWED):
        raise Forbidden(f"{request.method} {request.url.path} is not available through this proxy's shared Anthropic "
                        "key (it would reach account-wide state); ask an admin.")
    return await relay(request, state.anthropic_upstream, target, tenant=tenant, upstream_api_key=key,
                       key_header="x-api-key", content=content)


class _MessagesRoute:
    """What ``MetricsMiddleware`` reads from ``scope["route"]``: the route's path template."""

    path = MESSAGES_ROUTE


class MessagesEndpoint(CountedEndpoint):
    """``POST /v1/messages`` as plain ASGI (as ``proxy.routes.chat.ChatEndpoint``: ``ProxyApp``
    reaches it straight, FastAPI's layers cost a fifth of a small request's CPU): authenticate
    (``Authenticator.messages_tenant``), read the body within ``max_body_bytes``, log and forward
    (``proxy.forward.messages.MessagesPipeline``), answer; every failure in Anthropic's envelope."""

    path = MESSAGES_ROUTE

    async def __call__(self, scope: Scope, receive: Receive, send: Send, held: HeldBody | None = None) -> None:
        scope["route"] = _MessagesRoute
        app_state = scope["app"].state
        state = app_state["proxy"]  # (not ``.proxy``: see ``proxy.app.ProxyApp.__call__``)
        items = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        headers = dict(reversed(items))  # the first of repeated names, as Starlette's ``Headers.get``
        for name in SESSION_HEADERS:  # UTF-8 when their bytes are (ASGI gives Latin-1)
            if name in headers:
                headers[name] = header_text(headers[name])
        try:
            tenant = state.auth.messages_tenant(headers)
            target = anthropic_target(scope, "POST")
            raw = await read_asgi_body(receive, headers, state.settings.max_body_bytes, held)
            if raw is None:
                return  # the client left while sending its body: nobody to answer
            outcome = await state.messages.handle(raw, target, headers, items, tenant)
        except Exception as exc:  # noqa: BLE001  (every failure answers in Anthropic's envelope)
            error = client_error(exc, app_state["metrics"])
            scope[STATUS_KEY] = error.status
            body = error.anthropic_body()
            await send_whole(send, error.status, error.asgi_headers(body), body)
            return
        scope[STATUS_KEY] = outcome.status
        await send_outcome(outcome, receive, send)


def messages_route(endpoint: MessagesEndpoint) -> Route:
    """``endpoint`` in the router (``POST`` only; documented by ``OPENAPI_PATH_ITEM``)."""
    return Route(MESSAGES_ROUTE, endpoint, methods=["POST"], include_in_schema=False)


OPENAPI_PATH_ITEM: dict[str, Any] = {
    "post": {
        "tags": ["anthropic"],
        "summary": "Create a Message (Anthropic Messages API; logged in its session)",
        "description": "Anthropic's Messages API, forwarded to the Anthropic upstream as sent (the request body "
                       "and the reply as Anthropic documents them; `stream` answers with `text/event-stream`). "
                       "`x-claude-code-session-id`, then `x-session-id`, names the session (optional).",
        "operationId": "anthropic_messages",
        "parameters": [{"name": name, "in": "header", "required": False, "schema": {"type": "string"}}
                       for name in ("x-api-key", "anthropic-version", "anthropic-beta", "x-claude-code-session-id",
                                    "x-session-id")],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["model", "messages", "max_tokens"], "additionalProperties": True,
            "properties": {"model": {"type": "string"}, "messages": {"type": "array", "items": {"type": "object"}},
                           "max_tokens": {"type": "integer"}, "stream": {"type": "boolean"}}}}}},
        "responses": {
            "200": {"description": "The upstream's Message, or its event stream",
                    "content": {"application/json": {"schema": {"type": "object"}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            "default": {"description": "An error in Anthropic's envelope (the upstream's own, or the proxy's)",
                        "content": {"application/json": {"schema": ANTHROPIC_ERROR_SCHEMA}}},
        },
    }
}
"""The route in the OpenAPI schema (``ProxyApp.openapi`` adds it)."""


async def count_tokens(request: Request) -> StreamingResponse:
    """The count of the request the proxy would forward (``MessagesPipeline.counted_body``: its
    session's events and the defenses applied), relayed as ``relay_anthropic`` relays."""
    state = request.app.state.proxy
    tenant = state.auth.messages_tenant(request.headers)
    raw = await read_body(request, state.settings.max_body_bytes)
    headers = {k: header_text(v) if k in SESSION_HEADERS else v for k, v in request.headers.items()}
    return await relay_anthropic(request, await state.messages.counted_body(raw, headers, tenant))


router.add_api_route(COUNT_TOKENS_ROUTE, count_tokens, methods=["POST"], tags=["anthropic"],
                     summary="Count the tokens of a Messages request", operation_id="anthropic_count_tokens")
