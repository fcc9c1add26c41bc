"""``POST /v1/chat/completions``: the one route the defenses apply to, as one plain ASGI endpoint.

``ChatEndpoint`` answers the route; the app builds one and reaches it two ways behind the same
interface: the router (``chat_route``, a Starlette ``Route``, under FastAPI's middleware and
``MetricsMiddleware``) when FastAPI traces requests, else straight from ``ProxyApp.__call__``
through ``ChatEndpoint.counted``, which adds what ``MetricsMiddleware`` would (a request context,
the count, the access line) without wrapping ``send``. FastAPI's layers around an endpoint
(exception and exit-stack middleware, router matching, request and response objects, the anyio
task group of a ``StreamingResponse``) cost about a fifth of a small request's CPU (py-spy under
``tests/benchmarks``), hence the direct way. The OpenAPI schema documents the route from
``OPENAPI_PATH_ITEM`` (``ProxyApp.openapi``), so no FastAPI route stands in for it.

Behaviour: authentication, the body limit (413), OpenAI's error envelopes
(``proxy.routes.errors.client_error``), the pipeline's headers; on a client disconnect mid-stream the
relay is cancelled (so the upstream request is too) and the partial reply logged by the pipeline.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from proxy.admission import HeldBody
from proxy.forward.session_ids import header_text
from proxy.routes.answer import STATUS_KEY, CountedEndpoint, send_outcome
from proxy.routes.body import read_asgi_body
from proxy.routes.errors import client_error

CHAT_ROUTE = "/v1/chat/completions"
"""The client's chat route on the proxy; the upstream's path is ``proxy.upstream.urls.UPSTREAM_CHAT_ROUTE``."""

_ERROR = {"$ref": "#/components/schemas/Error"}
OPENAPI_PATH_ITEM: dict[str, Any] = {
    "post": {
        "tags": ["openai"],
        "summary": "Chat completions (forwarded, logged, compacted)",
        "description": "OpenAI's chat completions, forwarded to the upstream after the proxy's defenses "
                       "(the request body and the reply as OpenAI documents them; `stream` answers with "
                       "`text/event-stream`). `x-session-id` names the session (optional).",
        "operationId": "chat_completions",
        "parameters": [{"name": "x-session-id", "in": "header", "required": False,
                        "schema": {"type": "string"}}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["model", "messages"], "additionalProperties": True,
            "properties": {"model": {"type": "string"}, "messages": {"type": "array", "items": {"type": "object"}},
                           "stream": {"type": "boolean"}}}}}},
        "responses": {
            "200": {"description": "The upstream's reply (a chat.completion, or its event stream)",
                    "content": {"application/json": {"schema": {"type": "object"}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            "default": {"description": "An error in OpenAI's envelope (the upstream's own, or the proxy's)",
                        "content": {"application/json": {"schema": _ERROR}}},
        },
    }
}
"""The route in the OpenAPI schema (``ProxyApp.openapi`` adds it and ``ERROR_SCHEMA``)."""
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}
"""OpenAI's error envelope (``proxy.errors.ProxyError.envelope``)."""


class _ChatRoute:
    """What ``MetricsMiddleware`` reads from ``scope["route"]``: the route's path template."""

    path = CHAT_ROUTE


class ChatEndpoint(CountedEndpoint):
    """The chat route as ASGI. The app's state (``scope["app"].state``) does the work: ``proxy``
    (``ProxyState``: auth, settings, pipeline) and ``metrics``. The status of the response it
    starts goes in ``scope[STATUS_KEY]``."""

    path = CHAT_ROUTE

    async def __call__(self, scope: Scope, receive: Receive, send: Send, held: HeldBody | None = None) -> None:
        scope["route"] = _ChatRoute
        app_state = scope["app"].state
        state = app_state["proxy"]  # (not ``.proxy``: see ``proxy.app.ProxyApp.__call__``)
        items = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        headers = dict(reversed(items))  # the first of repeated names, as Starlette's ``Headers.get``
        if "x-session-id" in headers:  # UTF-8 when its bytes are (ASGI gives Latin-1)
            headers["x-session-id"] = header_text(headers["x-session-id"])
        try:
            tenant = state.auth.chat_tenant(headers)
            raw = await read_asgi_body(receive, headers, state.settings.max_body_bytes, held)
            if raw is None:
                return  # the client left while sending its body: nobody to answer
            outcome = await state.pipeline.handle(raw, headers, items, tenant)
        except Exception as exc:  # noqa: BLE001  (every failure answers in OpenAI's error envelope)
            error = client_error(exc, app_state["metrics"])
            scope[STATUS_KEY] = error.status
            body = error.body()
            await send({"type": "http.response.start", "status": error.status, "headers": error.asgi_headers(body)})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        scope[STATUS_KEY] = outcome.status
        await send_outcome(outcome, receive, send)

def chat_route(endpoint: ChatEndpoint) -> Route:
    """``endpoint`` in the router (``POST`` only; not in FastAPI's generated schema: see ``OPENAPI_PATH_ITEM``)."""
    return Route(CHAT_ROUTE, endpoint, methods=["POST"], include_in_schema=False)
