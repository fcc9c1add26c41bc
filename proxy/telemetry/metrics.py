"""Prometheus metrics of one app, served at ``/metrics``, and the middleware that counts requests.

``Metrics`` owns its own ``CollectorRegistry`` (created in ``create_app``; no module-level
registry, so several apps in one process, as in the tests, never clash). Metric names:

| metric | type | labels | recorded by |
|---|---|---|---|
| ``context_proxy_requests_total`` | counter | route, model, status | middleware, every HTTP request |
| ``context_proxy_request_duration_seconds`` | histogram | route | middleware (until the last byte) |
| ``context_proxy_upstream_latency_seconds`` | histogram | model | pipeline (to the upstream's headers) |
| ``context_proxy_tokens_client_total`` | counter | model | pipeline: the request's prompt + reserved output |
| ``context_proxy_tokens_forwarded_total`` | counter | model | pipeline: the same, as forwarded |
| ``context_proxy_defenses_applied_total`` | counter | defense | pipeline: forwarded requests a defense changed |
| ``context_proxy_compactions_total`` | counter | kind | compactor: compaction events stored |
| ``context_proxy_overflows_total`` | counter | outcome | pipeline: ``retried``, ``recovered``, ``unrecoverable`` |
| ``context_proxy_artifacts_stored_total`` | counter | outcome | compactor: ``stored`` / ``failed`` |
| ``context_proxy_database_errors_total`` | counter | where | app, pipeline, compactor |
| ``context_proxy_tokenizer_exact`` | gauge | encoding | compactor: 1 = tiktoken, 0 = byte estimate |
| ``context_proxy_learned_limits_total`` | counter | source | limits: ``overflow``, ``usage``, ``forgotten`` |
| ``context_proxy_token_estimate_ratio`` | gauge | model | limits: provider's prompt tokens per estimated token |

Tokens are the proxy's tiktoken estimates (``proxy.tokens.counter``), summed over requests: graph
``rate(tokens_client) - rate(tokens_forwarded)`` for tokens saved. ``model`` is the request's
``model`` field (empty for routes that carry none): the first ``MODEL_LABELS`` distinct names of
at most ``MODEL_LABEL_CHARS`` characters, every other one ``other`` (client-chosen strings never
grow the exposition without bound).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.telemetry.logs import request_context, write_access

access_log = logging.getLogger("context_proxy.access")

LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
"""Seconds; LLM calls take from tens of milliseconds (errors) to minutes (long generations)."""
MODEL_LABELS = 256
"""Distinct ``model`` label values, at most: the first names seen (a series, once exposed, stays),
the rest ``other``. Model names are client-chosen strings (2,000 distinct 20 KB names grew
``/metrics`` to 924 MB)."""
MODEL_LABEL_CHARS = 100
"""A model name longer than this is ``other`` (no real model name is that long)."""
OTHER_MODEL = "other"
SERVED_KEPT = 1024
"""(route, model, status) triples whose series ``Metrics.request_served`` remembers (models of at
most ``MODEL_LABEL_CHARS`` characters; emptied whole when full)."""
LATENCY_KEPT = 1024
"""Models whose ``upstream_latency`` series ``Metrics.upstream_answered`` remembers (names of at most
``MODEL_LABEL_CHARS`` characters; emptied whole when full)."""
QUIET_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})
"""Probe and scrape routes: counted, but their access lines are DEBUG, not INFO."""


class LoopCounter:
    """A labelled counter updated on the event loop's thread only, as plain floats; exposed exactly
    as ``prometheus_client.Counter`` exposes one (``_total`` and ``_created`` per label set) through
    a custom collector (``collect``, prometheus_client's documented extension point); ``_created``
    only when prometheus_client writes those (``_created_series``).

    For the counters a chat request moves: ``Counter.inc`` validates and takes a lock at each call,
    and the request-path metrics took about 3% of a small chat request's instructions that way
    (callgrind, ``tests/benchmarks``). ``inc(labels, amount)``: ``labels`` a tuple of strings in
    ``labelnames`` order."""

    __slots__ = ("documentation", "labelnames", "name", "series")

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...]) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, labelnames
        self.series: dict[tuple[str, ...], list[float]] = {}  # labels -> [value, created (epoch s)]

    def inc(self, labels: tuple[str, ...], amount: float = 1.0) -> None:
        self.entry(labels)[0] += amount

    def entry(self, labels: tuple[str, ...]) -> list[float]:
        """The series of ``labels``, ``[value, created]`` (made at its first use); ``entry[0] +=
        amount`` is ``inc``."""
        entry = self.series.get(labels)
        if entry is None:
            entry = self.series[labels] = [0.0, time.time()]
        return entry

    def collect(self) -> Metric:
        family = Metric(self.name, self.documentation, "counter")
        for labels, (value, created) in list(self.series.items()):
            named = dict(zip(self.labelnames, labels, strict=True))
            family.add_sample(self.name + "_total", named, value)
            if _created_series():
                family.add_sample(self.name + "_created", named, created)
        return family


class LoopHistogram:
    """A labelled histogram updated on the event loop's thread only (see ``LoopCounter``); exposed as
    ``prometheus_client.Histogram`` exposes one: cumulative ``_bucket``s with ``le`` (``+Inf``
    last), ``_count``, ``_sum``, and ``_created`` when prometheus_client writes those.
    ``observe(labels, value)``: a value counts in the first bucket whose bound is at least it."""

    __slots__ = ("bounds", "documentation", "labelnames", "name", "series")

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...], buckets: tuple[float, ...]) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, labelnames
        self.bounds = [float(b) for b in buckets]
        # labels -> [count per bucket (+Inf last)..., sum, created]
        self.series: dict[tuple[str, ...], list[float]] = {}

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        self.observe_into(self.entry(labels), value)

    def entry(self, labels: tuple[str, ...]) -> list[float]:
        """The series of ``labels`` (made at its first use), for ``observe_into``."""
        entry = self.series.get(labels)
        if entry is None:
            entry = self.series[labels] = [0.0] * (len(self.bounds) + 1) + [0.0, time.time()]
        return entry

    def observe_into(self, entry: list[float], value: float) -> None:
        """``observe`` into a series ``entry`` returned."""
        if value == value:  # NaN: in no bucket (every ``<=`` is false), as prometheus_client
            entry[bisect.bisect_left(self.bounds, value)] += 1
        entry[-2] += value

    def collect(self) -> Metric:
        family = Metric(self.name, self.documentation, "histogram")
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        for labels, entry in list(self.series.items()):
            named = dict(zip(self.labelnames, labels, strict=True))
            acc = 0.0
            for le, count in zip(les, entry, strict=False):
                acc += count
                family.add_sample(self.name + "_bucket", {**named, "le": le}, acc)
            family.add_sample(self.name + "_count", named, acc)
            family.add_sample(self.name + "_sum", named, entry[-2])
            if _created_series():
                family.add_sample(self.name + "_created", named, entry[-1])
        return family


def _created_series() -> bool:
    """Whether prometheus_client writes ``_created`` samples (off after ``disable_created_metrics()``
    or with ``PROMETHEUS_DISABLE_CREATED_SERIES=true``): ours follow its switch."""
    return bool(getattr(prometheus_metrics, "_use_created", True))


class _LoopCollector:
    """Hands a registry the families of ``LoopCounter``s and ``LoopHistogram``s."""

    def __init__(self, metrics: list[LoopCounter | LoopHistogram]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        for metric in self.metrics:
            yield metric.collect()

    def describe(self) -> list[Metric]:
        return [Metric(m.name, m.documentation, "counter" if isinstance(m, LoopCounter) else "histogram")
                for m in self.metrics]


class Metrics:
    """The proxy's metrics in a registry of their own. Methods never raise on bad label values.
    The request-path ones are ``LoopCounter``s and ``LoopHistogram``s: their methods must be called
    on the event loop's thread (every caller is: the middleware, the pipeline)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        r = self.registry
        self.requests = LoopCounter("context_proxy_requests", "HTTP requests by route, model and status.",
                                    ("route", "model", "status"))
        self.request_duration = LoopHistogram("context_proxy_request_duration_seconds",
                                              "Time to serve a request, until its last byte (streams included).",
                                              ("route",), LATENCY_BUCKETS_S)
        self.upstream_latency = LoopHistogram("context_proxy_upstream_latency_seconds",
                                              "Time from sending a chat request upstream to its response headers.",
                                              ("model",), LATENCY_BUCKETS_S)
        self.tokens_client = LoopCounter(
            "context_proxy_tokens_client", "Tokens the clients' requests need: prompt + reserved output (estimate).",
            ("model",))
        self.tokens_forwarded = LoopCounter(
            "context_proxy_tokens_forwarded",
            "Tokens of the requests forwarded upstream: prompt + reserved output (estimate).", ("model",))
        self.defenses = LoopCounter("context_proxy_defenses_applied", "Forwarded requests changed by each defense.",
                                    ("defense",))
        r.register(_LoopCollector([self.requests, self.request_duration, self.upstream_latency, self.tokens_client,
                                   self.tokens_forwarded, self.defenses]))
        self.compactions = Counter("context_proxy_compactions", "Compaction events stored, by kind.",
                                   ("kind",), registry=r)
        self.overflows = Counter("context_proxy_overflows", "Context-overflow errors from the upstream, by outcome.",
                                 ("outcome",), registry=r)
        self.artifacts = Counter("context_proxy_artifacts_stored", "Artifacts written (offloaded content), by outcome.",
                                 ("outcome",), registry=r)
        self.database_errors = Counter("context_proxy_database_errors", "Database errors, by where they surfaced.",
                                       ("where",), registry=r)
        self.deep_unlogged = Counter(
            "context_proxy_deep_unlogged", "Requests forwarded unlogged for content nested past orjson's depth "
            "beyond the per-request budget (json_depth.DEEP_BUDGET_CONTAINERS).",
            ("what",), registry=r)
        self.tokenizer_exact = Gauge("context_proxy_tokenizer_exact",
                                     "1 if the tiktoken encoding is loaded (exact counts), 0 if counts are estimated.",
                                     ("encoding",), registry=r)
        self.learned = Counter("context_proxy_learned_limits", "Windows learned (overflow, usage) or forgotten.",
                               ("source",), registry=r)
        self.ratio = Gauge("context_proxy_token_estimate_ratio",
                           "The provider's prompt tokens per estimated token, as last stored for a model (any tenant).",
                           ("model",), registry=r)
        self._model_labels: dict[str, str] = {}
        self._served: dict[tuple[str, str, int], tuple[list[float], list[float]]] = {}
        """(route, model, status) -> its ``requests`` and ``request_duration`` series (``request_served``)."""
        self._latency: dict[str, list[float]] = {}
        """model -> its ``upstream_latency`` series (``upstream_answered``)."""

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

    def model_label(self, model: str) -> str:
        """The ``model`` label for a client's model name (``MODEL_LABELS``, ``MODEL_LABEL_CHARS``)."""
        label = self._model_labels.get(model)
        if label is None:
            ok = len(model) <= MODEL_LABEL_CHARS and len(self._model_labels) < MODEL_LABELS
            label = model if ok else OTHER_MODEL
            if ok:
                self._model_labels[model] = label
        return label

    def request_served(self, route: str, model: str, status: int, duration_s: float) -> None:
        """One HTTP request answered (by the middleware). The two series a (route, model, status)
        moves are remembered (``SERVED_KEPT``; a request's label lookups and two calls were about
        half of this method's instructions)."""
        key = (route, model, status)
        series = self._served.get(key)
        if series is None:
            series = (self.requests.entry((route, self.model_label(model), str(status))),
                      self.request_duration.entry((route,)))
            if len(model) <= MODEL_LABEL_CHARS:  # (a longer one is ``other``: not kept by its text)
                if len(self._served) >= SERVED_KEPT:
                    self._served.clear()
                self._served[key] = series
        series[0][0] += 1.0
        self.request_duration.observe_into(series[1], duration_s)

    def upstream_answered(self, model: str, latency_s: float) -> None:
        """The upstream's response headers arrived ``latency_s`` seconds after the request was sent.
        The series a model moves is remembered (``LATENCY_KEPT``), as ``request_served``'s: a
        model's label never changes once given."""
        series = self._latency.get(model)
        if series is None:
            series = self.upstream_latency.entry((self.model_label(model),))
            if len(model) <= MODEL_LABEL_CHARS:  # (a longer one is ``other``: not kept by its text)
                if len(self._latency) >= LATENCY_KEPT:
                    self._latency.clear()
                self._latency[model] = series
        self.upstream_latency.observe_into(series, latency_s)

    def chat_forwarded(self, model: str, tokens_client: int | None, tokens_forwarded: int | None,
                       applied: tuple[str, ...] | list[str] = ()) -> None:
        """A chat request finished: its prompt tokens as sent and as forwarded, the defenses applied."""
        label = self.model_label(model)
        if tokens_client is not None:
            self.tokens_client.inc((label,), tokens_client)
        if tokens_forwarded is not None:
            self.tokens_forwarded.inc((label,), tokens_forwarded)
        for defense in applied:
            self.defenses.inc((defense,))

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

    def deep_over_budget(self, what: str) -> None:
        """A ``request`` forwarded unlogged: nested deeper than orjson writes, past
        ``json_depth.DEEP_BUDGET_CONTAINERS`` (a reply logged without its content is a warning in
        the log: ``messages_codec.reply_view``)."""
        self._child(self.deep_unlogged, what).inc()

    def tokenizer(self, encoding: str, exact: bool) -> None:
        """Whether ``encoding`` is counted exactly (tiktoken loaded) or estimated."""
        self._child(self.tokenizer_exact, encoding).set(1 if exact else 0)

    def limit_learned(self, source: str) -> None:
        """A window was learned (``overflow``, ``usage``) or ``forgotten`` (a reply proved it wrong)."""
        self._child(self.learned, source).inc()

    def estimate_ratio(self, model: str, ratio: float) -> None:
        """The estimate ratio stored for ``model`` (label as ``model_label``)."""
        self._child(self.ratio, self.model_label(model)).set(ratio)

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
                served(self.metrics, scope.get("method", ""), _route_of(scope), fields.get("model", ""), status,
                       started)


def served(metrics: Metrics, method: str, route: str, model: str, status: int, started: float) -> None:
    """Count one answered request (``started``: its ``time.perf_counter()`` on arrival) and write
    its access line (DEBUG for ``QUIET_ROUTES``, else INFO)."""
    duration_s = time.perf_counter() - started
    metrics.request_served(route, model, status, duration_s)
    level = logging.DEBUG if route in QUIET_ROUTES else logging.INFO
    if not write_access(access_log, level, method, route, status, duration_s):
        extra = {"route": route, "status": status, "duration_ms": round(duration_s * 1000, 1)}
        access_log.log(level, "%s %s %d", method, route, status, extra=extra)


def _route_of(scope: Scope) -> str:
    """The matched route's path template (``/sessions/{session_id}``), never the raw path (whose ids
    would make one time series per session); ``unmatched`` for a 404 outside every route."""
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"
