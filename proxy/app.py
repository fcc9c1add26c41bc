"""``create_app(settings)``: the ASGI app, its lifespan (the state it builds and owns) and error rendering.

The lifespan builds ``ProxyState`` (the store, the upstream client, the pipeline and every memo and
cache the app uses) and closes it at shutdown; nothing the app uses lives in module globals. The
chat route is ``proxy.routes.chat.ChatEndpoint``, reached straight from ``ProxyApp.__call__``
(see there); every other route goes through FastAPI.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy import __version__
from proxy.admission import SEARCHES_WAITING_PER_SLOT, BodyBudget, PoolShare, SearchSlots
from proxy.compaction.apis import CHAT_API, MESSAGES_API
from proxy.compaction.base import Compactor
from proxy.conversation.prefix import PrefixStates
from proxy.errors import BadRequest, NotFound, ProxyError
from proxy.forward.messages import MessagesPipeline
from proxy.forward.pipeline import ChatPipeline
from proxy.forward.session_log import SessionLog
from proxy.forward.tool_rounds import ToolRounds
from proxy.routes import docs, health, limits, messages, passthrough, read, read_lists, search
from proxy.routes.auth import Authenticator
from proxy.routes.chat import CHAT_ROUTE, ERROR_SCHEMA, OPENAPI_PATH_ITEM, ChatEndpoint, chat_route
from proxy.routes.errors import client_error
from proxy.routes.messages import speaks_anthropic
from proxy.routes.ui import router as ui_router
from proxy.routes.ui import ui_app
from proxy.server.forwarded import forwarded_headers
from proxy.settings import Settings
from proxy.telemetry.metrics import Metrics, MetricsMiddleware
from proxy.tokens.counter import TokenCounter, load_counter
from proxy.upstream.client import Upstream
from proxy.upstream.transport import UpstreamTransport
from storage.errors import StorageError
from storage.migrate import upgrade
from storage.store import Store

log = logging.getLogger("context_proxy.app")


@dataclass
class ProxyState:
    """What the app's lifespan builds, what the routes reach through ``request.app.state.proxy``,
    and what it closes at shutdown.

    Every memo and cache of the app is one of these objects' state (or of the objects they own),
    built here and gone with the app; their bounds are listed in one table, ``proxy.bounds.BOUNDS``.
    """

    settings: Settings
    auth: Authenticator
    store: Store
    upstream: Upstream
    pipeline: ChatPipeline
    anthropic_upstream: Upstream
    """The Anthropic Messages provider (``anthropic_upstream_url``); it shares ``upstream``'s transport
    and pool slots (one pool of connections, one tenant share of it)."""
    messages: MessagesPipeline
    """``POST /v1/messages``'s use case (its log writer, session log and health are ``pipeline``'s)."""
    searches: SearchSlots
    """Read API searches running at once and waiting (``Settings.read_api_max_concurrent_searches``, set in the
    lifespan)."""
    migrated: bool = False
    """The schema is at the newest migration (``/readyz`` is not ready until it is)."""


MIGRATION_RETRY_MAX_S = 30.0


async def _try_upgrade(database_url: str) -> bool:
    try:
        await upgrade(database_url)
        return True
    except StorageError as exc:
        log.error("database migration failed (%s); /readyz reports not ready and it is retried", type(exc).__name__)
        return False


async def _migrate_until_done(state: ProxyState) -> None:
    """Retry the migration with backoff (0.5 s doubling to 30 s) until the database is there."""
    delay = 0.5
    while not state.migrated:
        await asyncio.sleep(delay)
        delay = min(delay * 2, MIGRATION_RETRY_MAX_S)
        state.migrated = await _try_upgrade(state.settings.database_url)
    log.info("database migrated; ready")


def build_compactor(settings: Settings, store: Store, upstream: Upstream, counter: TokenCounter,
                    metrics: Metrics, prefixes: PrefixStates | None = None, *, api: str = "chat") -> Compactor:
    """The defenses when enabled, else the pass-through compactor (``prefixes``: the app's
    per-conversation prefix states, shared with the session log; ``api``: ``chat`` or ``messages``,
    what ``upstream``'s requests speak)."""
    if not settings.compaction_enabled:
        return Compactor()
    from proxy.compaction.compactor import ProjectingCompactor

    return ProjectingCompactor(settings, store, upstream, counter, metrics=metrics, prefixes=prefixes,
                               api=MESSAGES_API if api == "messages" else CHAT_API)


def _transport(settings: Settings, given: object) -> UpstreamTransport | None:
    """``given`` as an ``UpstreamTransport``: an ``httpx.AsyncBaseTransport`` (tests, benchmarks)
    wrapped in ``HttpxTransport`` (httpx is imported only then), anything else as it is."""
    if not hasattr(given, "handle_async_request"):  # httpx's transport method; none of ours has it
        return cast("UpstreamTransport | None", given)  # ``None``: aiohttp
    import httpx

    from proxy.upstream.httpx_transport import HttpxTransport

    assert isinstance(given, httpx.AsyncBaseTransport)
    return HttpxTransport(given, pool_size=settings.upstream_pool_size,
                          connect_timeout_s=settings.upstream_connect_timeout_s,
                          read_timeout_s=settings.upstream_read_timeout_s, keepalive_s=settings.upstream_keepalive_s)


def _upstream(settings: Settings, url: str, transport: UpstreamTransport | None,
              slots: PoolShare | None = None) -> Upstream:
    """An ``Upstream`` to ``url`` sized by the ``upstream_*`` settings (``transport``: ``None`` for
    aiohttp; ``slots``: another upstream's, to share its pool)."""
    return Upstream(url, pool_size=settings.upstream_pool_size, connect_timeout_s=settings.upstream_connect_timeout_s,
                    read_timeout_s=settings.upstream_read_timeout_s, keepalive_s=settings.upstream_keepalive_s,
                    tenant_pool_share=settings.upstream_tenant_pool_share, transport=transport, slots=slots)


def create_app(settings: Settings, *, upstream_transport: object = None) -> FastAPI:
    """The proxy as an ASGI app. ``upstream_transport`` replaces the aiohttp transport: any
    ``proxy.upstream.transport.UpstreamTransport``, or an ``httpx.AsyncBaseTransport`` (tests,
    benchmarks; wrapped in ``proxy.upstream.httpx_transport.HttpxTransport``). Touches no
    process-wide state (the garbage collector is ``context-proxy serve``'s: ``proxy.server.process``)."""
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        migrated = await _try_upgrade(settings.database_url)
        store = await Store.open(settings.database_url, pool_size=settings.database_pool_size)
        upstream = _upstream(settings, settings.upstream_url, _transport(settings, upstream_transport))
        # one pool of connections and slots (the transport closed once, with ``upstream``)
        anthropic_upstream = _upstream(settings, settings.anthropic_upstream_url, upstream.transport, upstream.slots)
        counter = load_counter(settings.tiktoken_cache_dir)  # the defenses' and the tool rounds'
        prefixes = PrefixStates()  # the projection's, the offer's and the session log's, per conversation
        compactor = build_compactor(settings, store, upstream, counter, metrics, prefixes)
        pipeline = ChatPipeline(settings, SessionLog(store, prefixes), upstream, compactor, counter, metrics=metrics)
        messages_compactor = build_compactor(settings, store, anthropic_upstream, counter, metrics, prefixes,
                                             api="messages")
        messages_tools = ToolRounds(settings, store, messages_compactor, counter, api=MESSAGES_API)
        messages_pipeline = MessagesPipeline(settings, pipeline.log, anthropic_upstream, pipeline.writer,
                                             pipeline.health, metrics, pipeline.digest_memo, messages_compactor,
                                             messages_tools, pipeline.entropy)
        searches = settings.read_api_max_concurrent_searches
        state = ProxyState(settings, Authenticator(settings), store, upstream, pipeline, anthropic_upstream,
                           messages_pipeline,
                           SearchSlots(searches, SEARCHES_WAITING_PER_SLOT * searches), migrated=migrated)
        app.state.proxy = state
        retry = None if migrated else asyncio.create_task(_migrate_until_done(state))
        try:
            yield
        finally:
            if retry is not None:
                retry.cancel()
            await pipeline.writer.drain()
            await upstream.aclose()
            await store.close()

    app = ProxyApp(
        title="context-proxy",
        version=__version__,
        description="OpenAI-compatible proxy that keeps agents inside their context window. Read API for sessions.",
        lifespan=lifespan,
        docs_url=None,  # served from the package's assets, not a CDN: proxy.routes.docs
        redoc_url=None,
    )
    docs.install(app)
    app.include_router(health.router)
    for router in (read.router, read_lists.router, search.router, limits.router):
        app.include_router(router, dependencies=[docs.KEY_IN_SCHEMA])  # the /docs Authorize button
    app.router.routes.append(chat_route(app.chat))  # before the pass-through's /v1/{path}
    app.router.routes.append(messages.messages_route(app.messages))  # likewise
    app.include_router(messages.router)  # likewise
    app.include_router(passthrough.router)
    app.state.metrics = metrics
    app.state.body_budget = BodyBudget(settings.max_held_body_bytes, settings.max_body_bytes)
    app.add_route("/metrics", metrics.endpoint, methods=["GET"], include_in_schema=False)
    app.mount("/ui", ui_app(), name="ui")  # the web viewer: HTML, not in the schema
    app.include_router(ui_router)  # / redirects to it; /favicon.ico
    _install_error_handlers(app)
    return app


class ProxyApp(FastAPI):
    """FastAPI whose chat route (``POST /v1/chat/completions``, ``self.chat``) and Messages route
    (``POST /v1/messages``, ``self.messages``) skip FastAPI's own layers (error pages, telemetry,
    body limit: about 5% of a small chat request's CPU, measured with py-spy and cProfile at
    concurrency 16; each endpoint has its own limit, error envelopes and counting), unless FastAPI
    traces requests: then they go through FastAPI,
    ``MetricsMiddleware`` and the router like every other route. The schema documents them
    (``openapi``)."""

    _traced: bool | None = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.chat = ChatEndpoint()
        self.messages = messages.MessagesEndpoint()
        self._forwarded = forwarded_headers(super().__call__)
        """FastAPI's path behind uvicorn's ``X-Forwarded-*`` handling (``proxy.server.forwarded``;
        uvicorn's own is off: ``server_options``). The chat and Messages endpoints, which read
        neither the client's address nor the scheme, skip it unless traced (``__call__``)."""

    def chat_traced(self) -> bool:
        """Whether FastAPI's own OpenTelemetry instrumentation is on, as FastAPI decides it for a
        request (a tracer, meter or logger provider is configured); looked up at the first chat
        request and kept, so a provider must be configured before serving (as
        ``opentelemetry-instrument`` and an application's startup code do). False with a FastAPI
        that has no native telemetry."""
        if self._traced is None:
            telemetry = getattr(self, "_native_telemetry", None)
            self._traced = bool(telemetry is not None and telemetry.enabled())
        return self._traced

    def build_middleware_stack(self) -> ASGIApp:
        return MetricsMiddleware(super().build_middleware_stack(), metrics=self.state.metrics)

    def openapi(self) -> dict[str, Any]:
        """FastAPI's schema with the chat and Messages routes (``proxy.routes.chat.OPENAPI_PATH_ITEM``,
        ``proxy.routes.messages.OPENAPI_PATH_ITEM``) first and OpenAI's error envelope as the
        ``Error`` schema."""
        if self.openapi_schema is None:
            schema = super().openapi()
            schema["paths"] = {CHAT_ROUTE: OPENAPI_PATH_ITEM, messages.MESSAGES_ROUTE: messages.OPENAPI_PATH_ITEM,
                               **schema.get("paths", {})}
            schema.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
            self.openapi_schema = schema
        return self.openapi_schema

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Every HTTP request with a body counted against ``max_held_body_bytes`` while it runs
        (``BodyBudget.hold``; the chat and Messages endpoints' ``counted`` counts it as their body
        is read); the chat and Messages routes straight to their endpoints' ``counted``
        unless traced (class docstring), the rest through FastAPI behind uvicorn's ``X-Forwarded-*``
        handling (``self._forwarded``: its redirects and telemetry name the client's scheme).
        (``state["..."]``, not ``state.X``: Starlette's ``State`` finds an attribute through
        ``__getattr__`` after a failed lookup, an ``AttributeError`` raised and caught inside the
        interpreter for each access.)"""
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        budget = self.state["body_budget"]
        if scope["method"] == "POST" and not self.chat_traced():
            path = scope["path"]
            endpoint = self.chat if path == CHAT_ROUTE else self.messages if path == messages.MESSAGES_ROUTE else None
            if endpoint is not None:
                if self.root_path:
                    scope["root_path"] = self.root_path
                scope["app"] = self
                await endpoint.counted(scope, receive, send, budget)  # (the budget held as ``budget.hold`` holds it)
                return
        await budget.hold(self._forwarded, scope, receive, send)


def _render(exc: ProxyError, request: Request) -> Response:
    """``exc`` in OpenAI's envelope, or in Anthropic's for an Anthropic request
    (``proxy.routes.messages.speaks_anthropic``)."""
    anthropic = speaks_anthropic(request.url.path, request.headers)
    return Response(exc.anthropic_body() if anthropic else exc.body(), status_code=exc.status,
                    media_type="application/json", headers=dict(exc.headers) or None)


def _install_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's envelope (Anthropic's for an Anthropic request: ``_render``): ours as
    they are, a storage error or anything unexpected as ``proxy.routes.errors.client_error`` maps it,
    FastAPI's validation and HTTP errors as 400/404/..."""

    @app.exception_handler(ProxyError)
    async def proxy_error(request: Request, exc: ProxyError) -> Response:
        return _render(exc, request)

    @app.exception_handler(StorageError)
    async def storage_error(request: Request, exc: StorageError) -> Response:
        return _render(client_error(exc, request.app.state.metrics), request)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _render(BadRequest(f"Invalid parameter {where}: {first.get('msg', 'invalid')}", param=where or None),
                       request)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            return _render(NotFound(f"No route {request.url.path}."), request)
        err = ProxyError(str(exc.detail))
        err.status = exc.status_code
        err.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return _render(err, request)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        if isinstance(exc, asyncio.CancelledError):
            raise exc
        return _render(client_error(exc, request.app.state.metrics), request)
