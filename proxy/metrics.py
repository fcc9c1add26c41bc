"""Prometheus metrics of one app, served at ``/metrics``, and the middleware that counts requests.

``Metrics`` owns its own ``CollectorRegistry`` (created in ``create_app``; no module-level
registry, so several apps in one process, as in the tests, never clash). Metric names:

| metric | type | labels | recorded by |
|---|---|---|---|
| ``context_proxy_requests_total`` | counter | route, model, status | middleware, every HTTP request |
| ``context_proxy_request_duration_seconds`` | histogram | route | middleware (until the last byte) |
| ``context_proxy_upstream_latency_seconds`` | histogram | model | pipeline (to the upstream's headers) |
| ``context_proxy_tokens_client_total`` | counter | model | pipeline: prompt tokens as the client sent them |
| ``context_proxy_tokens_forwarded_total`` | counter | model | pipeline: prompt tokens as forwarded |
| ``context_proxy_defenses_applied_total`` | counter | defense | pipeline: forwarded requests a defense changed |
| ``context_proxy_compactions_total`` | counter | kind | compactor: compaction events stored |
| ``context_proxy_overflows_total`` | counter | outcome | pipeline: ``retried``, ``recovered``, ``unrecoverable`` |
| ``context_proxy_artifacts_stored_total`` | counter | outcome | compactor: ``stored`` / ``failed`` |
| ``context_proxy_database_errors_total`` | counter | where | app, pipeline, compactor |
| ``context_proxy_tokenizer_exact`` | gauge | encoding | compactor: 1 = tiktoken, 0 = byte estimate |

Tokens are the proxy's tiktoken estimates (``proxy.tokens``), summed over requests: graph
``rate(tokens_client) - rate(tokens_forwarded)`` for tokens saved. ``model`` is the request's
``model`` field (empty for routes that carry none); the label values an operator sees are
therefore as many as the models the clients use.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.logging_setup import request_context, write_direct

access_log = logging.getLogger("context_proxy.access")

LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
"""Seconds; LLM calls take from tens of milliseconds (errors) to minutes (long generations)."""
QUIET_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})
"""Probe and scrape routes: counted, but their access lines are DEBUG, not INFO."""


class Metrics:
    """The proxy's metrics in a registry of their own. Methods never raise on bad label values."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        r = self.registry
        self.requests = Counter("context_proxy_requests", "HTTP requests by route, model and status.",
                                ("route", "model", "status"), registry=r)
        self.request_duration = Histogram("context_proxy_request_duration_seconds",
                                          "Time to serve a request, until its last byte (streams included).",
                                          ("route",), buckets=LATENCY_BUCKETS_S, registry=r)
        self.upstream_latency = Histogram("context_proxy_upstream_latency_seconds",
                                          "Time from sending a chat request upstream to its response headers.",
                                          ("model",), buckets=LATENCY_BUCKETS_S, registry=r)
        self.tokens_client = Counter("context_proxy_tokens_client", "Prompt tokens the clients sent (estimate).",
                                     ("model",), registry=r)
        self.tokens_forwarded = Counter("context_proxy_tokens_forwarded", "Prompt tokens forwarded upstream (estimate).",
                                        ("model",), registry=r)
        self.defenses = Counter("context_proxy_defenses_applied", "Forwarded requests changed by each defense.",
                                ("defense",), registry=r)
        self.compactions = Counter("context_proxy_compactions", "Compaction events stored, by kind.",
                                   ("kind",), registry=r)
        self.overflows = Counter("context_proxy_overflows", "Context-overflow errors from the upstream, by outcome.",
                                 ("outcome",), registry=r)
        self.artifacts = Counter("context_proxy_artifacts_stored", "Artifacts written (offloaded content), by outcome.",
                                 ("outcome",), registry=r)
        self.database_errors = Counter("context_proxy_database_errors", "Database errors, by where they surfaced.",
                                       ("where",), registry=r)
        self.tokenizer_exact = Gauge("context_proxy_tokenizer_exact",
                                     "1 if the tiktoken encoding is loaded (exact counts), 0 if counts are estimated.",
                                     ("encoding",), registry=r)

    def _child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, remembered: ``labels`` validates and locks on every call
        (about 6% of a small chat request's CPU with the four calls a request makes, py-spy under
        ``tests/benchmarks``). As many entries as the registry has label sets."""
        key = (metric, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    # --- one call per event, named after what happened ------------------------------------------

    def request_served(self, route: str, model: str, status: int, duration_s: float) -> None:
        """One HTTP request answered (by the middleware)."""
        self._child(self.requests, route, model, str(status)).inc()
        self._child(self.request_duration, route).observe(duration_s)

    def upstream_answered(self, model: str, latency_s: float) -> None:
        """The upstream's response headers arrived ``latency_s`` seconds after the request was sent."""
        self._child(self.upstream_latency, model).observe(latency_s)

    def chat_forwarded(self, model: str, tokens_client: int | None, tokens_forwarded: int | None,
                       applied: tuple[str, ...] | list[str] = ()) -> None:
        """A chat request finished: its prompt tokens as sent and as forwarded, the defenses applied."""
        if tokens_client is not None:
            self._child(self.tokens_client, model).inc(tokens_client)
        if tokens_forwarded is not None:
            self._child(self.tokens_forwarded, model).inc(tokens_forwarded)
        for defense in applied:
            self._child(self.defenses, defense).inc()

    def compaction_stored(self, kind: str) -> None:
        """A compaction event (``summary``, ``truncate_args``, ``media``, ...) was stored."""
        self._child(self.compactions, kind).inc()

    def overflow(self, outcome: str) -> None:
        """``retried`` (compacted and sent again), ``recovered`` (a retry succeeded) or ``unrecoverable``."""
        self._child(self.overflows, outcome).inc()

    def artifacts_stored(self, count: int, *, ok: bool = True) -> None:
        """``count`` artifacts were stored (``ok``) or failed to store."""
        self._child(self.artifacts, "stored" if ok else "failed").inc(count)

    def database_error(self, where: str) -> None:
        """A ``StorageError`` surfaced at ``where`` (``request``, ``log``, ``artifacts``, ``events``...)."""
        self._child(self.database_errors, where).inc()

    def tokenizer(self, encoding: str, exact: bool) -> None:
        """Whether ``encoding`` is counted exactly (tiktoken loaded) or estimated."""
        self._child(self.tokenizer_exact, encoding).set(1 if exact else 0)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    async def endpoint(self, request: Request) -> Response:
        """The ``GET /metrics`` handler."""
        body, content_type = self.render()
        return Response(body, media_type=content_type)


class MetricsMiddleware:
    """Pure ASGI middleware: opens the request's log context, counts the request when its last byte
    is sent (streams included) and writes one access line. Never buffers a body."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        started = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        with request_context() as fields:
            try:
                await self.app(scope, receive, send_wrapper)
            finally:
                served(self.metrics, scope.get("method", ""), _route_of(scope), fields.get("model", ""), status, started)


def served(metrics: Metrics, method: str, route: str, model: str, status: int, started: float) -> None:
    """Count one answered request (``started``: its ``time.perf_counter()`` on arrival) and write
    its access line (DEBUG for ``QUIET_ROUTES``, else INFO)."""
    duration_s = time.perf_counter() - started
    metrics.request_served(route, model, status, duration_s)
    level = logging.DEBUG if route in QUIET_ROUTES else logging.INFO
    extra = {"route": route, "status": status, "duration_ms": round(duration_s * 1000, 1)}
    if not write_direct(access_log, level, f"{method} {route} {status}", extra):
        access_log.log(level, "%s %s %d", method, route, status, extra=extra)


def _route_of(scope: Scope) -> str:
    """The matched route's path template (``/sessions/{session_id}``), never the raw path (whose ids
    would make one time series per session); ``unmatched`` for a 404 outside every route."""
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"
