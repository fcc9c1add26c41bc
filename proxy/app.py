"""``create_app(settings)``: the ASGI app, its lifespan (one upstream client, one store) and error rendering."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy import __version__
from proxy.admission import BodyBudget
from proxy.compaction.base import Compactor
from proxy.errors import BadRequest, NotFound, ProxyError
from proxy.forward.pipeline import ChatPipeline
from proxy.forward.session_log import SessionLog
from proxy.routes import chat, health, limits, passthrough, read
from proxy.routes.auth import Authenticator
from proxy.routes.chat_fast import CHAT_PATH, ChatFastPath, error_of, serve_chat_counted
from proxy.settings import Settings
from proxy.telemetry.metrics import Metrics, MetricsMiddleware
from proxy.upstream.client import Upstream
from storage.errors import StorageError
from storage.migrate import upgrade
from storage.store import Store

log = logging.getLogger("context_proxy.app")


@dataclass
class ProxyState:
    """What the routes reach through ``request.app.state.proxy``."""

    settings: Settings
    auth: Authenticator
    store: Store
    upstream: Upstream
    pipeline: ChatPipeline
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


def build_compactor(settings: Settings, store: Store, upstream: Upstream, metrics: Metrics | None = None) -> Compactor:
    """The defenses when enabled, else the pass-through compactor."""
    if not settings.compaction_enabled:
        return Compactor()
    from proxy.compaction.compactor import ProjectingCompactor

    return ProjectingCompactor(settings, store, upstream, metrics=metrics)


def create_app(settings: Settings, *, upstream_transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """The proxy as an ASGI app. ``upstream_transport`` replaces the aiohttp transport (tests)."""
    if settings.tiktoken_cache_dir:
        os.environ["TIKTOKEN_CACHE_DIR"] = settings.tiktoken_cache_dir
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        migrated = await _try_upgrade(settings.database_url)
        store = await Store.open(settings.database_url, pool_size=settings.database_pool_size)
        upstream = Upstream(
            settings.upstream_url,
            pool_size=settings.upstream_pool_size,
            connect_timeout_s=settings.upstream_connect_timeout_s,
            read_timeout_s=settings.upstream_read_timeout_s,
            keepalive_s=settings.upstream_keepalive_s,
            tenant_pool_share=settings.upstream_tenant_pool_share,
            transport=upstream_transport,
        )
        pipeline = ChatPipeline(
            settings, SessionLog(store), upstream, build_compactor(settings, store, upstream, metrics), metrics=metrics
        )
        state = ProxyState(settings, Authenticator(settings), store, upstream, pipeline, migrated=migrated)
        app.state.proxy = state
        retry = None if migrated else asyncio.create_task(_migrate_until_done(state))
        # the startup objects (tokenizer tables, routes, model table) live as long as the process:
        # out of the collector's sight, a full collection no longer walks them (about 8 ms each,
        # measured in the pipeline benchmark, once every few requests of a long history)
        if not _frozen:  # once per process (each app a test creates would stay in memory)
            gc.freeze()
            _frozen.append(True)
        if settings.gc_young_threshold:
            gc.set_threshold(settings.gc_young_threshold, *gc.get_threshold()[1:])
        try:
            yield
        finally:
            if retry is not None:
                retry.cancel()
            await pipeline.drain()
            await upstream.aclose()
            await store.close()

    app = _ProxyApp(
        title="context-proxy",
        version=__version__,
        description="OpenAI-compatible proxy that keeps agents inside their context window. Read API for sessions.",
        lifespan=lifespan,
    )
    for router in (health.router, read.router, limits.router, chat.router, passthrough.router):
        app.include_router(router)
    app.state.metrics = metrics
    app.state.body_budget = BodyBudget(settings.max_held_body_bytes, settings.max_body_bytes)
    app.add_route("/metrics", metrics.endpoint, methods=["GET"], include_in_schema=False)
    _install_error_handlers(app)
    return app


_frozen: list[bool] = []


class _ProxyApp(FastAPI):
    """FastAPI with ``MetricsMiddleware`` and ``ChatFastPath`` outermost: the chat route skips
    FastAPI's own layers too (error pages, telemetry, body limit: about 5% of a small chat
    request's CPU, measured with py-spy; the chat route has its own limit and error envelopes).
    Every other route still passes all of them."""

    _traced: bool | None = None

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
        return MetricsMiddleware(ChatFastPath(super().build_middleware_stack()), metrics=self.state.metrics)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Every HTTP request with a body counted against ``max_held_body_bytes`` while it runs
        (``BodyBudget.hold``), then ``_serve``."""
        if scope["type"] == "http":
            await self.state.body_budget.hold(self._serve, scope, receive, send)
        else:
            await self._serve(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The chat route straight to ``serve_chat_counted``, unless FastAPI traces requests (then
        through FastAPI, ``MetricsMiddleware`` and ``ChatFastPath``, as every other route). Its
        layers and the wrapped ``send`` were about 5% of a small chat request's CPU (cProfile,
        ``tests/benchmarks`` overhead at concurrency 16)."""
        chat = scope["type"] == "http" and scope["path"] == CHAT_PATH and scope["method"] == "POST"
        if chat and not self.chat_traced():
            if self.root_path:
                scope["root_path"] = self.root_path
            scope["app"] = self
            await serve_chat_counted(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def _render(exc: ProxyError) -> Response:
    return Response(exc.body(), status_code=exc.status, media_type="application/json", headers=dict(exc.headers) or None)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProxyError)
    async def proxy_error(request: Request, exc: ProxyError) -> Response:
        return _render(exc)

    @app.exception_handler(StorageError)
    async def storage_error(request: Request, exc: StorageError) -> Response:
        return _render(error_of(exc, request.app.state.metrics))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _render(BadRequest(f"Invalid parameter {where}: {first.get('msg', 'invalid')}", param=where or None))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            return _render(NotFound(f"No route {request.url.path}."))
        err = ProxyError(str(exc.detail))
        err.status = exc.status_code
        err.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return _render(err)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        if isinstance(exc, asyncio.CancelledError):
            raise exc
        return _render(error_of(exc, request.app.state.metrics))
