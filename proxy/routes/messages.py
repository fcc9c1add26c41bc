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

from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from proxy.errors import Forbidden
from proxy.forward.messages import CLAUDE_CODE_SESSION_HEADER
from proxy.forward.session_ids import header_text
from proxy.routes.answer import OutcomeResponse
from proxy.routes.body import read_body
from proxy.routes.relay import relay
from proxy.upstream.urls import passthrough_target

router = APIRouter()

MESSAGES_ROUTE = "/v1/messages"
COUNT_TOKENS_ROUTE = "/v1/messages/count_tokens"
ANTHROPIC_VERSION_HEADER = "anthropic-version"
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


async def relay_anthropic(request: Request) -> StreamingResponse:
    """Relay ``request`` (any ``/v1/`` path) to the Anthropic upstream, as the module docstring says.
    Raises ``Unauthorized``/``Forbidden`` (``Authenticator.messages_tenant``), ``Forbidden`` for an
    account-wide path under the proxy's key, ``BadRequest`` for a path that could leave the upstream
    (``passthrough_target``), ``PayloadTooLarge`` past ``max_body_bytes``, ``UpstreamError``."""
    state = request.app.state.proxy
    tenant = state.auth.messages_tenant(request.headers)
    raw_path = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
    target = "/v1" + passthrough_target(raw_path, request.url.query, request.method)
    key = state.settings.anthropic_upstream_api_key
    if key is not None and state.auth.reader(request.headers) is not None and not any(
            request.method == m and rx.fullmatch(request.url.path) for m, rx in SHARED_KEY_ALLOWED):
        raise Forbidden(f"{request.method} {request.url.path} is not available through this proxy's shared Anthropic "
                        "key (it would reach account-wide state); ask an admin.")
    return await relay(request, state.anthropic_upstream, target, tenant=tenant, upstream_api_key=key,
                       key_header="x-api-key")


async def messages(request: Request) -> Response:
    """``POST /v1/messages``: logged in its session and forwarded (``proxy.forward.messages``). Raises
    what ``relay_anthropic`` raises before forwarding, and ``StorageError`` (database down)."""
    state = request.app.state.proxy
    tenant = state.auth.messages_tenant(request.headers)
    raw_path = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
    target = "/v1" + passthrough_target(raw_path, request.url.query, request.method)
    raw = await read_body(request, state.settings.max_body_bytes)
    items = request.headers.items()
    headers = {k: header_text(v) if k in SESSION_HEADERS else v for k, v in reversed(items)}
    return OutcomeResponse(await state.messages.handle(raw, target, headers, items, tenant))


async def count_tokens(request: Request) -> StreamingResponse:
    return await relay_anthropic(request)


router.add_api_route(MESSAGES_ROUTE, messages, methods=["POST"], tags=["anthropic"],
                     summary="Create a Message (Anthropic Messages API; streamed with \"stream\": true)",
                     operation_id="anthropic_messages")
router.add_api_route(COUNT_TOKENS_ROUTE, count_tokens, methods=["POST"], tags=["anthropic"],
                     summary="Count the tokens of a Messages request", operation_id="anthropic_count_tokens")
