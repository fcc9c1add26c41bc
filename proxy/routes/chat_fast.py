"""``POST /v1/chat/completions`` served as plain ASGI, ahead of FastAPI's routing and middleware.

The chat route is the proxy's hot path, and FastAPI's layers around an endpoint (exception and
exit-stack middleware, included-router matching, the request and response objects, the anyio task
group of a ``StreamingResponse``) cost about a fifth of a small request's CPU (measured with
py-spy under ``tests/benchmarks``). ``ChatFastPath`` sits inside ``MetricsMiddleware`` (so the
request is counted, access-logged and has its log context) and answers the chat route itself;
every other request goes on to FastAPI. The FastAPI route in ``proxy.routes.chat`` documents the
endpoint in the OpenAPI schema and hands the request to the same ``serve_chat``.

Behaviour matches the FastAPI route: the same authentication, body limit (413), error envelopes
(``error_of``), headers, and on a client disconnect mid-stream the relay is cancelled (so the
upstream request is too) and the partial reply logged by the pipeline.
"""

from __future__ import annotations

import asyncio
import logging
import time

from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.errors import ProxyError, StorageUnavailableError
from proxy.forward.pipeline import Buffered, Streamed
from proxy.forward.session_ids import header_text
from proxy.routes.body import read_asgi_body
from proxy.telemetry.logs import close_request_context, open_request_context
from proxy.telemetry.metrics import Metrics, served
from storage.errors import StorageError

log = logging.getLogger("context_proxy.app")

CHAT_PATH = "/v1/chat/completions"
STATUS_KEY = "context_proxy.status"
"""Where ``serve_chat`` puts the status of the response it starts (in the ASGI scope)."""
_JSON = [(b"content-type", b"application/json")]


class _ChatRoute:
    """What ``MetricsMiddleware`` reads from ``scope["route"]``: the route's path template."""

    path = CHAT_PATH


def error_of(exc: Exception, metrics: Metrics) -> ProxyError:
    """The OpenAI-style error a failed request answers with (the FastAPI handlers use it too).

    ``ProxyError``: itself. ``StorageError``: a 503 (counted in ``metrics``; the database's own
    message is not shown to clients). Anything else: a 500 with no detail (logged with its
    traceback).
    """
    if isinstance(exc, ProxyError):
        return exc
    if isinstance(exc, StorageError):
        log.error("database error: %s", type(exc).__name__)
        metrics.database_error("request")
        return StorageUnavailableError("The proxy's database is unavailable; try again shortly.")
    log.exception("unexpected error", exc_info=exc)
    return ProxyError("The proxy failed to handle this request (internal error).")


class ChatFastPath:
    """Pure ASGI middleware answering ``POST /v1/chat/completions``; see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != CHAT_PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        scope["route"] = _ChatRoute
        await serve_chat(scope, receive, send)


async def serve_chat(scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one chat request as ASGI (the app's ``state.proxy`` does the work). The status is
    put in ``scope[STATUS_KEY]`` as its response starts (``serve_chat_counted`` counts it)."""
    app_state = scope["app"].state
    state = app_state.proxy
    items = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
    headers = dict(reversed(items))  # the first of repeated names, as Starlette's ``Headers.get``
    if "x-session-id" in headers:  # UTF-8 when its bytes are (ASGI gives Latin-1)
        headers["x-session-id"] = header_text(headers["x-session-id"])
    try:
        tenant = state.auth.chat_tenant(headers)
        raw = await read_asgi_body(receive, headers, state.settings.max_body_bytes)
        if raw is None:
            return  # the client left while sending its body: nobody to answer
        outcome = await state.pipeline.handle(raw, headers, items, tenant)
    except Exception as exc:  # noqa: BLE001  (every failure answers in OpenAI's error envelope)
        error = error_of(exc, app_state.metrics)
        scope[STATUS_KEY] = error.status
        extra = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in error.headers]
        await _send_whole(send, error.status, _JSON + extra if extra else _JSON, error.body())
        return
    scope[STATUS_KEY] = outcome.status
    if isinstance(outcome, Buffered):
        await _send_whole(send, outcome.status, _encode(outcome.headers), outcome.body)
    else:
        await _send_stream(outcome, receive, send)


async def serve_chat_counted(scope: Scope, receive: Receive, send: Send) -> None:
    """``serve_chat`` with what ``MetricsMiddleware`` adds (a request context, the count and the
    access line), without wrapping ``send``: the app calls it directly for the chat route. The
    status counted is the one whose response started (500 if none did, as the middleware)."""
    scope["route"] = _ChatRoute
    started = time.perf_counter()
    fields, token = open_request_context()
    try:
        await serve_chat(scope, receive, send)
    finally:
        try:
            served(scope["app"].state.metrics, "POST", CHAT_PATH, fields.get("model", ""),
                   scope.get(STATUS_KEY, 500), started)
        finally:
            close_request_context(token)


def _encode(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


async def _send_whole(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers = [h for h in headers if h[0] != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_stream(outcome: Streamed, receive: Receive, send: Send) -> None:
    """Relay ``outcome.chunks``; a client disconnect cancels the relay (and with it the upstream
    request). ``outcome.close()`` runs however it ends."""
    task = asyncio.current_task()
    assert task is not None
    disconnected = False

    async def watch() -> None:
        nonlocal disconnected
        while (await receive())["type"] != "http.disconnect":
            pass
        disconnected = True
        task.cancel()

    watcher = asyncio.create_task(watch())
    try:
        await send({"type": "http.response.start", "status": outcome.status, "headers": _encode(outcome.headers)})
        async for chunk in outcome.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except asyncio.CancelledError:
        if not disconnected:
            raise  # the server is shutting down: let it
        task.uncancel()
    finally:
        watcher.cancel()
        if outcome.close is not None:
            # shielded: neither the watcher's late cancel nor a shutdown's stops the cleanup
            # halfway (it logs the request and releases the upstream response)
            try:
                await asyncio.shield(outcome.close())
            except asyncio.CancelledError:
                if not disconnected:
                    raise
                task.uncancel()  # the watcher's cancel, come late: the client is gone, all is done
