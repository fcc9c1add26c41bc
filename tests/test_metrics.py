"""proxy/telemetry/metrics.py: a registry per app, and the counters moving during a real session through the
proxy (fake upstream, real uvicorn, SQLite and PostgreSQL)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from proxy.telemetry.metrics import Metrics
from tests.support.real_server import Proxy, Upstream
from tests.support.shared import needs_exact_encodings

MODEL = "fake-4k-openai"
FILLER = "alpha beta gamma delta epsilon zeta eta theta " * 75  # about 600 tokens


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _scrape(proxy: Proxy) -> dict:
    with proxy.http(key=None) as http:
        resp = http.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    return _samples(resp.text)


def _scrape_until(proxy: Proxy, done: Callable[[dict], bool], timeout_s: float = 10.0) -> dict:
    """Counters of a request are recorded as its last byte goes out (and its log task finishes)."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = _scrape(proxy)
        if done(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


def _models_file(tmp_path: Path, window_tokens: int) -> str:
    path = tmp_path / "models.yaml"
    path.write_text(f"{MODEL}:\n  context_window_tokens: {window_tokens}\n  max_output_tokens: 1024\n")
    return str(path)


def _session(proxy: Proxy, turns: int) -> list[dict]:
    client = proxy.client()
    messages: list[dict] = [{"role": "system", "content": "You are terse."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"FACT: key{turn}=value{turn}\n{FILLER}"})
        reply = client.chat.completions.create(model=MODEL, messages=messages, extra_headers={"X-Session-Id": "metrics"})
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    return messages


def test_each_metrics_has_its_own_registry() -> None:
    first, second = Metrics(), Metrics()
    first.request_served("/healthz", "", 200, 0.01)
    first.chat_forwarded("m", 100, 40, ("summary",))
    one, two = _samples(first.render()[0].decode()), _samples(second.render()[0].decode())
    assert _value(one, "context_proxy_requests_total", route="/healthz", model="", status="200") == 1
    assert _value(two, "context_proxy_requests_total", route="/healthz", model="", status="200") == 0
    assert _value(one, "context_proxy_tokens_client_total", model="m") == 100
    assert _value(one, "context_proxy_tokens_forwarded_total", model="m") == 40
    assert _value(one, "context_proxy_defenses_applied_total", defense="summary") == 1


@needs_exact_encodings  # the tokenizer gauge says exact
def test_counters_move_during_a_session(proxy_factory: Callable[..., Proxy], upstream: Upstream, tmp_path: Path) -> None:
    proxy = proxy_factory(models_file=_models_file(tmp_path, 4096))
    before = _scrape(proxy)
    assert _value(before, "context_proxy_tokenizer_exact", encoding="o200k_base") == 1
    turns = 8
    _session(proxy, turns)
    with proxy.http() as http:
        assert http.get("/sessions/metrics").status_code == 200
    chat = {"route": "/v1/chat/completions", "model": MODEL, "status": "200"}
    after = _scrape_until(proxy, lambda s: _value(s, "context_proxy_requests_total", **chat) == turns
                          and _value(s, "context_proxy_upstream_latency_seconds_count", model=MODEL) == turns
                          and _value(s, "context_proxy_tokens_client_total", model=MODEL) > 0)
    assert _value(after, "context_proxy_requests_total", **chat) == turns
    # Route templates, not raw paths: one series for every session id.
    assert _value(after, "context_proxy_requests_total", route="/sessions/{session_id}", model="", status="200") == 1
    assert _value(after, "context_proxy_upstream_latency_seconds_count", model=MODEL) == turns
    sent = _value(after, "context_proxy_tokens_client_total", model=MODEL)
    forwarded = _value(after, "context_proxy_tokens_forwarded_total", model=MODEL)
    assert sent > turns * 500, "the client resent a growing history"
    assert 0 < forwarded < sent, "compaction forwards fewer tokens than the client sent"
    summaries = _value(after, "context_proxy_compactions_total", kind="summary")
    assert summaries >= 1
    assert _value(after, "context_proxy_defenses_applied_total", defense="summary") >= 1
    assert len(upstream.state.summary_requests) >= summaries
    assert _value(after, "context_proxy_database_errors_total", where="log") == 0


def test_overflow_retries_and_recovery_are_counted(proxy_factory: Callable[..., Proxy], upstream: Upstream,
                                                   tmp_path: Path) -> None:
    # The proxy believes the window is 4x larger than the upstream's: the upstream rejects, the
    # proxy learns the stated limit, compacts and retries.
    proxy = proxy_factory(models_file=_models_file(tmp_path, 16384))
    _session(proxy, 8)
    after = _scrape_until(proxy, lambda s: _value(s, "context_proxy_overflows_total", outcome="recovered") >= 1)
    assert _value(after, "context_proxy_overflows_total", outcome="retried") >= 1
    assert _value(after, "context_proxy_overflows_total", outcome="recovered") >= 1
    assert _value(after, "context_proxy_overflows_total", outcome="unrecoverable") == 0
    assert _value(after, "context_proxy_requests_total", route="/v1/chat/completions", model=MODEL, status="200") == 8


def test_a_traced_app_serves_and_counts_chat_through_its_middleware(proxy_factory: Callable[..., Proxy],
                                                                    upstream: Upstream, tmp_path: Path) -> None:
    """When FastAPI's OpenTelemetry instrumentation is on, the chat route goes through FastAPI,
    ``MetricsMiddleware`` and the router instead of straight to ``ChatEndpoint.counted``:
    both paths answer alike and count alike."""
    for traced in (False, True):
        proxy = proxy_factory(models_file=_models_file(tmp_path, 4096))
        app = proxy.server.config.app
        assert app.chat_traced() is False  # no provider configured
        app._traced = traced  # as if one had been (its SDK is not installed here)
        with proxy.http() as http:
            resp = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
            assert resp.status_code == 200 and resp.headers["x-context-proxy-request-id"].startswith("req_")
            bad = http.post("/v1/chat/completions", content=b"{not json")
            assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
        after = _scrape_until(proxy, lambda s: _value(s, "context_proxy_requests_total", route="/v1/chat/completions",
                                                      model="", status="400") == 1)
        assert _value(after, "context_proxy_requests_total", route="/v1/chat/completions", model=MODEL, status="200") == 1
        assert _value(after, "context_proxy_requests_total", route="/v1/chat/completions", model="", status="400") == 1
        assert _value(after, "context_proxy_request_duration_seconds_count", route="/v1/chat/completions") == 2


def test_a_configured_provider_is_detected_as_fastapi_detects_it() -> None:
    from proxy.app import create_app
    from proxy.settings import Settings

    app = create_app(Settings(upstream_url="http://127.0.0.1:9/v1", database_url="sqlite:///unused.db"))
    telemetry = getattr(app, "_telemetry", None)
    if telemetry is None:  # a FastAPI without native telemetry: never traced
        assert app.chat_traced() is False
        return
    telemetry["tracer_provider"] = object()  # what FastAPI's enabled() looks at
    assert app.chat_traced() is True


async def test_a_stream_that_fails_after_its_start_is_counted_with_the_status_it_sent() -> None:
    """The chat route's own counting (``ChatEndpoint.counted``, no wrapped ``send``) counts the status
    whose response started, as ``MetricsMiddleware`` does: a relay failing mid-stream is a 200
    that went wrong, not a 500 that was never sent."""
    import asyncio
    from types import SimpleNamespace

    import pytest
    from starlette.datastructures import State

    from proxy.forward.answers import Streamed
    from proxy.routes.chat import ChatEndpoint

    async def chunks():  # type: ignore[no-untyped-def]
        yield b"data: {}\n\n"
        raise RuntimeError("the relay broke")

    class Pipeline:
        async def handle(self, raw, headers, items, tenant):  # type: ignore[no-untyped-def]
            return Streamed(200, {"content-type": "text/event-stream"}, chunks())

    metrics = Metrics()
    proxy_state = SimpleNamespace(auth=SimpleNamespace(chat_tenant=lambda headers: "t"),
                                  settings=SimpleNamespace(max_body_bytes=1 << 20), pipeline=Pipeline())
    app = SimpleNamespace(state=State({"proxy": proxy_state, "metrics": metrics}))  # the app's ``state`` is one
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [], "app": app}
    messages = [{"type": "http.request", "body": b"{}", "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # the client stays
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    from proxy.admission import BodyBudget

    budget = BodyBudget(1 << 20, 1 << 20)
    with pytest.raises(RuntimeError, match="the relay broke"):
        await ChatEndpoint().counted(scope, receive, send, budget)
    assert budget.held_bytes == 0  # the body's 2 bytes were held while it ran, given back at its end
    assert sent[0] == {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    samples = _samples(metrics.render()[0].decode())
    assert _value(samples, "context_proxy_requests_total", route="/v1/chat/completions", model="", status="200") == 1
    assert _value(samples, "context_proxy_requests_total", route="/v1/chat/completions", model="", status="500") == 0


def test_request_path_metrics_are_exposed_as_prometheus_client_exposes_its_own() -> None:
    """``LoopCounter`` and ``LoopHistogram`` keep plain numbers; their exposition is line for line
    prometheus_client's ``Counter`` and ``Histogram`` given the same calls (creation times aside),
    bucket bounds included (a value equal to a bound counts in that bucket)."""
    import re

    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from proxy.telemetry.metrics import LATENCY_BUCKETS_S

    ours = Metrics()
    reference = CollectorRegistry()
    requests = Counter("context_proxy_requests", "HTTP requests by route, model and status.",
                       ("route", "model", "status"), registry=reference)
    duration = Histogram("context_proxy_request_duration_seconds",
                         "Time to serve a request, until its last byte (streams included).", ("route",),
                         buckets=LATENCY_BUCKETS_S, registry=reference)
    upstream = Histogram("context_proxy_upstream_latency_seconds",
                         "Time from sending a chat request upstream to its response headers.", ("model",),
                         buckets=LATENCY_BUCKETS_S, registry=reference)
    tokens_client = Counter("context_proxy_tokens_client", "Tokens the clients' requests need: prompt + reserved output (estimate).", ("model",),
                            registry=reference)
    tokens_forwarded = Counter("context_proxy_tokens_forwarded", "Tokens of the requests forwarded upstream: prompt + reserved output (estimate).",
                               ("model",), registry=reference)
    defenses = Counter("context_proxy_defenses_applied", "Forwarded requests changed by each defense.", ("defense",),
                       registry=reference)
    calls = [("/v1/chat/completions", "gpt-4o", 200, 0.0123), ("/v1/chat/completions", "gpt-4o", 200, 0.05),
             ("/v1/chat/completions", "gpt-4o", 502, 700.0), ("/healthz", "", 200, 0.001),
             ("/v1/chat/completions", "o3 \"quoted\"\n", 200, 2.5)]
    for route, model, status, seconds in calls:
        ours.request_served(route, model, status, seconds)
        requests.labels(route, model, str(status)).inc()
        duration.labels(route).observe(seconds)
        ours.upstream_answered(model, seconds / 2)
        upstream.labels(model).observe(seconds / 2)
        ours.chat_forwarded(model, 1200, 800, ("summary", "offload"))
        tokens_client.labels(model).inc(1200)
        tokens_forwarded.labels(model).inc(800)
        for defense in ("summary", "offload"):
            defenses.labels(defense).inc()

    def text(exposition: bytes) -> list[str]:
        lines = exposition.decode().splitlines()
        return [re.sub(r"(_created\{.*\}) \S+$", r"\1 T", line) for line in lines if "context_proxy_" in line]

    others = ("compactions", "overflows", "artifacts_stored", "database_errors", "deep_unlogged", "tokenizer_exact",
              "learned_limits", "token_estimate_ratio")  # not these kinds
    mine = [line for line in text(ours.render()[0]) if not any(f"context_proxy_{name}" in line for name in others)]
    assert mine == text(generate_latest(reference))
    # ``request_served``'s remembered series: one per (route, model, status), the repeated one found again
    assert set(ours._served) == {(r, m, s) for r, m, s, _ in calls} and len(ours._served) == len(calls) - 1
    # ``upstream_answered``'s: one per model, the repeated one found again
    assert set(ours._latency) == {m for _, m, _, _ in calls} and len(ours._latency) == 3


def test_model_labels_are_bounded() -> None:
    """Model names are client-chosen: at most ``MODEL_LABELS`` label values over every metric, long
    names never one (``other``), so ``/metrics`` stays small whatever clients send (2,000 distinct
    20 KB names grew it to 924 MB before)."""
    from proxy.telemetry.metrics import MODEL_LABEL_CHARS, MODEL_LABELS

    m = Metrics()
    for i in range(MODEL_LABELS + 50):
        name = f"model-{i}"
        m.request_served("/v1/chat/completions", name, 200, 0.01)
        m.upstream_answered(name, 0.01)
        m.chat_forwarded(name, 10, 10)
        m.estimate_ratio(name, 1.25)
    for i in range(100):
        m.request_served("/v1/chat/completions", f"{i}" + "x" * 20_000, 200, 0.01)
    text = m.render()[0].decode()
    assert len(text) < 2_000_000  # (about 480 KB: 256 models in two histograms and three counters)
    labels = {line.split('model="', 1)[1].split('"', 1)[0] for line in text.splitlines() if 'model="' in line}
    assert len(labels) == MODEL_LABELS + 1 and "other" in labels
    assert max(map(len, labels)) <= MODEL_LABEL_CHARS
    assert max(len(model) for _, model, _ in m._served) <= MODEL_LABEL_CHARS  # long names never kept
    for i in range(100):
        m.upstream_answered(f"{i}" + "x" * 20_000, 0.01)
    assert max(map(len, m._latency)) <= MODEL_LABEL_CHARS
