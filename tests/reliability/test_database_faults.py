"""Database faults (issue 5, point 6): down at start (alive, not ready, migration retried until it
works), down while serving (``database_failure_mode`` closed: a 503 envelope; open: forwarded,
warned in ``x-context-proxy-warning``), and kill -9 in the middle of a stream and of a compaction
(the log stays consistent and the session's next request works).

The stop/start tests use a PostgreSQL cluster of their own (``PgCluster``), never the shared one.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.app import create_app
from proxy.settings import Settings
from tests.conftest import SHARED_DIR
from tests.e2e.conftest import CLIENT_KEY, Proxy, Upstream
from tests.fakes.server import UvicornServer
from tests.reliability.probes import (
    TALLY,
    PgCluster,
    ServeProcess,
    assert_envelope,
    log_consistency,
    query,
)

BODY = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]}
AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    c = PgCluster()
    try:
        yield c
    finally:
        c.remove()


def serve(upstream: Upstream, database_url: str, **overrides: Any) -> UvicornServer:
    settings = Settings(upstream_url=upstream.url, database_url=database_url, tiktoken_cache_dir=str(SHARED_DIR / "tiktoken"),
                        **overrides)
    return UvicornServer(create_app(settings)).start()


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout_s, f"not {what} after {timeout_s} s"
        time.sleep(0.1)
    return time.monotonic() - t0


def ready(http: httpx.Client) -> bool:
    return http.get("/readyz").status_code == 200


@pytest.mark.postgres
def test_database_down_at_start_then_ready(upstream: Upstream, cluster: PgCluster) -> None:
    server = serve(upstream, cluster.url)  # nothing listens on the cluster's port yet
    try:
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as http:
            assert http.get("/healthz").status_code == 200
            r = http.get("/readyz")
            assert r.status_code == 503 and r.json()["status"] == "not ready"
            assert_envelope(http.post("/v1/chat/completions", json=BODY), 503)
            cluster.start()
            took = wait_until(lambda: ready(http), 45, "ready once the database is up")
            r = http.post("/v1/chat/completions", json=BODY, headers={"x-session-id": "late"})
            assert r.status_code == 200, r.text
            wait_until(lambda: http.get("/sessions/late").json().get("request_count") == 1, 10, "logged")
    finally:
        server.stop()
    TALLY.add("faults_injected")
    TALLY.note("ready_after_database_started_s", round(took, 2))


@pytest.mark.postgres
def test_database_down_while_serving_closed_and_open(upstream: Upstream, cluster: PgCluster) -> None:
    cluster.start()
    closed = serve(upstream, cluster.url, database_failure_mode="closed")
    opened = serve(upstream, cluster.url, database_failure_mode="open")
    try:
        with httpx.Client(base_url=closed.url, headers=AUTH, timeout=30) as c, httpx.Client(base_url=opened.url, headers=AUTH, timeout=30) as o:
            wait_until(lambda: ready(c) and ready(o), 20, "ready")
            for http in (c, o):
                assert http.post("/v1/chat/completions", json=BODY, headers={"x-session-id": "s"}).status_code == 200
            cluster.stop()
            sent = len(upstream.state.chat_requests)
            # a new session, then the session just served (whose rows the proxy may have cached)
            for session, stream in (("new", False), ("new", True), ("s", False), ("s", True)):
                t0 = time.monotonic()
                r = c.post("/v1/chat/completions", json=BODY | {"stream": stream}, headers={"x-session-id": session})
                assert r.status_code == 503, f"fail-closed answered {r.status_code} for session {session!r} (stream={stream})"
                assert assert_envelope(r, 503)["code"] == "database_unavailable"
                assert time.monotonic() - t0 < 10
            assert len(upstream.state.chat_requests) == sent, "fail-closed must not forward"
            assert c.get("/readyz").status_code == 503
            for session, stream in (("new", False), ("new", True), ("s", False), ("s", True)):
                r = o.post("/v1/chat/completions", json=BODY | {"stream": stream}, headers={"x-session-id": session})
                assert r.status_code == 200, r.text
                assert r.headers.get("x-context-proxy-warning"), f"fail-open did not warn for session {session!r} (stream={stream})"
                if stream:
                    assert r.text.rstrip().endswith("data: [DONE]")
                else:
                    assert r.json()["choices"][0]["message"]["content"]
            assert len(upstream.state.chat_requests) == sent + 4
            assert "fail_open" in o.get("/metrics").text
            cluster.start()  # the database comes back: both serve and log again
            wait_until(lambda: ready(c), 30, "ready again")
            attempts = 0
            for http in (c, o):
                for _ in range(3):
                    attempts += 1
                    r = http.post("/v1/chat/completions", json=BODY | {"messages": [{"role": "user", "content": "back"}]},
                                  headers={"x-session-id": "back"})
                    if r.status_code == 200:
                        break
                    time.sleep(0.5)  # as a client does after a 503
                assert r.status_code == 200 and "x-context-proxy-warning" not in r.headers, r.text
            TALLY.note("requests_to_recover_after_database_restart", attempts)
            wait_until(lambda: c.get("/sessions/back").json().get("request_count", 0) >= 1, 10, "logged after recovery")
    finally:
        closed.stop()
        opened.stop()
    TALLY.add("faults_injected", 6)


# --- kill -9 ----------------------------------------------------------------------------------------


def long_history(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    for i in range(turns):
        out.append({"role": "user", "content": f"step {i}: " + " ".join(f"token{i}x{j}" for j in range(150))})
        out.append({"role": "assistant", "content": f"done {i} " + "ok " * 100})
    out.append({"role": "user", "content": "continue"})
    return out


def in_thread(fn: Callable[[], Any]) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def post_quietly(url: str, body: dict[str, Any], session: str) -> None:
    try:
        with (httpx.Client(timeout=60) as http,
              http.stream("POST", url + "/v1/chat/completions", json=body, headers=AUTH | {"x-session-id": session}) as r):
            for _ in r.iter_raw():
                pass
    except httpx.HTTPError:
        pass  # the proxy was killed under it


def test_kill_9_mid_stream_and_mid_compaction_leaves_a_consistent_log(upstream: Upstream, database_url: str, tmp_path: Path) -> None:
    models = tmp_path / "models.yaml"
    models.write_text('"fake-8k-openai":\n  context_window_tokens: 8192\n')
    env = {"CONTEXT_PROXY_MODELS_FILE": str(models)}
    proxy = ServeProcess(tmp_path, upstream.url, database_url, **env).start()
    try:
        # 1. mid-stream: the upstream has sent 3 chunks, the rest waits on the gate
        gate = threading.Event()
        upstream.state.stream_gate, upstream.state.stream_gate_after_chunks = gate, 3
        upstream.state.script.append({"role": "assistant", "content": " ".join(f"w{i}" for i in range(80))})
        history = [{"role": "user", "content": "a story please"}]
        client = in_thread(lambda: post_quietly(proxy.url, {"model": "gpt-4o", "stream": True, "messages": history}, "crash-stream"))
        assert upstream.state.first_chunk_sent.wait(10)
        time.sleep(0.2)
        proxy.kill9()
        gate.set()
        client.join(10)
        upstream.state.stream_gate = None
        proxy = ServeProcess(tmp_path, upstream.url, database_url, **env).start()
        log_consistency(database_url)
        with httpx.Client(base_url=proxy.url, headers=AUTH, timeout=60) as http:
            r = http.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": history}, headers={"x-session-id": "crash-stream"})
            assert r.status_code == 200, r.text
            wait_until(lambda: http.get("/sessions/crash-stream").json().get("request_count", 0) >= 1, 10, "logged")

        # 2. mid-compaction: the summary call hangs; kill while it does
        history = long_history(14)
        upstream.state.fail_next.append(("delay", 60))
        body = {"model": "fake-8k-openai", "max_tokens": 512, "messages": history}
        client = in_thread(lambda: post_quietly(proxy.url, body, "crash-compaction"))
        # (a delayed request is classified only after its delay: look at the bodies themselves)
        wait_until(lambda: any(b"summarize the conversation" in r.body.lower() for r in upstream.state.chat_requests), 20, "summarizing")
        time.sleep(0.2)
        proxy.kill9()
        client.join(10)
        assert not query(database_url, "SELECT id FROM events"), "no event may exist before its summary came back"
        proxy = ServeProcess(tmp_path, upstream.url, database_url, **env).start()
        counts = log_consistency(database_url)
        upstream.state.fail_next.clear()
        with httpx.Client(base_url=proxy.url, headers=AUTH, timeout=60) as http:
            r = http.post("/v1/chat/completions", json=body, headers={"x-session-id": "crash-compaction"})
            assert r.status_code == 200, r.text
            assert "summary" in r.headers.get("x-context-proxy-defenses", ""), r.headers
            wait_until(lambda: http.get("/sessions/crash-compaction").json().get("request_count", 0) >= 1, 10, "logged")
        after = log_consistency(database_url)
        assert after["events"] >= 1 and after["messages"] > counts["messages"]
        assert "Traceback" not in proxy.log_text()
    finally:
        proxy.stop()
    TALLY.add("faults_injected", 2)
    TALLY.add("kill9_restarts", 2)


def test_a_slow_database_holds_new_requests_back_instead_of_growing_a_backlog(
    proxy_factory: Callable[..., Any], upstream: Upstream, sqlite_database_url: str
) -> None:
    """With the log's writes stuck (another connection holds SQLite's write lock), at most
    ``max_pending_log_writes`` answered requests wait to be logged; the next request waits
    before it is served (bounded memory), and once the database moves, everything is logged."""
    import sqlite3

    from tests.e2e.conftest import wait_logged

    proxy = proxy_factory(database_url=sqlite_database_url, max_pending_log_writes=2)
    sessions = [f"slow-db-{i}" for i in range(3)]

    def ask(session: str, text: str) -> None:
        with proxy.http() as http:
            r = http.post("/v1/chat/completions", headers={"x-session-id": session}, timeout=30,
                          json={"model": "gpt-4o", "messages": [{"role": "user", "content": text}]})
            assert r.status_code == 200, r.text

    for s in sessions:  # the sessions exist (and are cached): no write before forwarding
        ask(s, "first")
        wait_logged(proxy, s, 1)
    lock = sqlite3.connect(sqlite_database_url.removeprefix("sqlite:///"), isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    try:
        ask(sessions[0], "first")  # answered; its log write waits for the lock
        ask(sessions[1], "first")
        third = threading.Thread(target=ask, args=(sessions[2], "first"))
        third.start()
        third.join(1.5)
        assert third.is_alive(), "a third request was served with two log writes already waiting"
    finally:
        lock.execute("COMMIT")
        lock.close()
    third.join(30)
    assert not third.is_alive()
    for s in sessions:
        assert wait_logged(proxy, s, 2)["request_count"] == 2


def test_a_refused_reply_write_is_counted_and_logged_and_the_next_one_lands(
    proxy_factory: Callable[..., Any], upstream: Upstream, sqlite_database_url: str, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The end of a request is queued without a task on SQLite (``Store.append_and_record``). When that write
    is refused, the client has its answer all the same; the failure is logged with the request's
    ids and counted (``database_errors_total{where="log"}``), and the next request is logged."""
    import logging
    import sqlite3

    from tests.e2e.conftest import wait_logged

    proxy = proxy_factory(database_url=sqlite_database_url)
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]}
    path = sqlite_database_url.removeprefix("sqlite:///")
    with proxy.http() as http:
        assert http.post("/v1/chat/completions", headers={"x-session-id": "refused"}, json=body).status_code == 200
        wait_logged(proxy, "refused", 1)  # the session's messages are known: the next end is queued
        pipeline = proxy.server.config.app.state.proxy.pipeline
        tasks: list[int] = []
        real_after = pipeline.writer._after_append
        monkeypatch.setattr(pipeline.writer, "_after_append", lambda *a, **k: tasks.append(1) or real_after(*a, **k))
        monkeypatch.setattr(pipeline.log, "_spawn", lambda *a, **k: tasks.append(1))  # (a read first: a task)
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("CREATE TRIGGER refuse BEFORE INSERT ON requests BEGIN SELECT RAISE(ABORT, 'refused'); END")
        try:
            with caplog.at_level(logging.ERROR, logger="context_proxy.pipeline"):
                r = http.post("/v1/chat/completions", headers={"x-session-id": "refused"}, json=body)
                assert r.status_code == 200
                wait_until(lambda: any(rec.getMessage() == "logging the reply failed" for rec in caplog.records), 10,
                           "the failure logged")
            failed = next(rec for rec in caplog.records if rec.getMessage() == "logging the reply failed")
            assert failed.request_id == r.headers["x-context-proxy-request-id"] and failed.exc_info is not None
            assert 'context_proxy_database_errors_total{where="log"} 1.0' in http.get("/metrics").text
            assert tasks == []  # queued, not in a task
        finally:
            db.execute("DROP TRIGGER refuse")
            db.close()
        assert http.post("/v1/chat/completions", headers={"x-session-id": "refused"}, json=body).status_code == 200
        wait_logged(proxy, "refused", 2)


def test_a_reply_nested_deeper_than_orjson_writes_is_answered_and_logged(sqlite_database_url: str) -> None:
    """An upstream reply nested deeper than orjson writes (254 levels; it reads 1,024): the client
    gets it as sent, and it is logged, read back as it came, on the task path (a session's first
    request) as on the queued one (the next ones, once the session's messages are known stored).
    Before, hashing it for the log raised: the client had its answer, the log nothing of the
    request (``logging the reply failed``, with the request's id)."""

    def extra(turn: int) -> str:  # (turn 1's is shallow: after it the session is known stored)
        return str(turn) if turn == 1 else '{"x":' * 300 + str(turn) + "}" * 300

    def reply(turn: int) -> bytes:
        return ('{"id":"c","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,'
                '"finish_reason":"stop","message":{"role":"assistant","content":"hi","extra":' + extra(turn) + '}}],'
                '"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}').encode()

    async def deep_upstream(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        while (await receive()).get("more_body"):
            pass
        calls.append(1)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": reply(len(calls) - 1)})

    calls: list[int] = []
    with UvicornServer(deep_upstream) as upstream_server:
        settings = Settings(upstream_url=upstream_server.url + "/v1", database_url=sqlite_database_url,
                            tiktoken_cache_dir=str(SHARED_DIR / "tiktoken"))
        proxy = UvicornServer(create_app(settings)).start()
        try:
            with httpx.Client(base_url=proxy.url, headers=AUTH, timeout=30) as http:
                body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]}
                for turn in range(4):  # each reply a branch of its own, the newest
                    r = http.post("/v1/chat/completions", headers={"x-session-id": "deep"}, json=body)
                    assert r.status_code == 200 and r.content == reply(turn)
                    from tests.e2e.conftest import wait_logged
                    wait_logged(Proxy(proxy, settings), "deep", turn + 1)
                    logged = http.get("/sessions/deep/messages").json()["data"]
                    assert logged[-1]["extra"] == json.loads(extra(turn))
        finally:
            proxy.stop()


def test_a_queued_write_that_fails_logs_in_its_own_requests_context(
    proxy_factory: Callable[..., Any], upstream: Upstream, sqlite_database_url: str
) -> None:
    """Queued writes end in a flush that another request's timer or store call runs; the failure
    of each is still logged in its own request's context (the ids a text-format line shows)."""
    import logging
    import sqlite3
    from concurrent.futures import ThreadPoolExecutor

    from proxy.telemetry.logs import current_context
    from tests.e2e.conftest import wait_logged

    seen: list[tuple[str, dict[str, str]]] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append((record.getMessage(), current_context()))

    proxy = proxy_factory(database_url=sqlite_database_url)
    capture = Capture(level=logging.ERROR)
    logging.getLogger("context_proxy.pipeline").addHandler(capture)
    db = sqlite3.connect(sqlite_database_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        with proxy.http() as http:
            def ask(session: str) -> str:
                r = http.post("/v1/chat/completions", headers={"x-session-id": session},
                              json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 200
                return r.headers["x-context-proxy-request-id"]

            for s in ("ctx-a", "ctx-b"):
                ask(s)
                wait_logged(proxy, s, 1)
            db.execute("CREATE TRIGGER refuse BEFORE INSERT ON requests BEGIN SELECT RAISE(ABORT, 'refused'); END")
            with ThreadPoolExecutor(2) as pool:
                ids = set(pool.map(ask, ["ctx-a", "ctx-b", "ctx-a", "ctx-b"]))
            wait_until(lambda: sum(m == "logging the reply failed" for m, _ in seen) >= 4, 10, "the failures logged")
        failed = [context for message, context in seen if message == "logging the reply failed"]
        assert {c.get("request_id") for c in failed} == ids
        assert all(c.get("session_id") in ("ctx-a", "ctx-b") for c in failed)
    finally:
        logging.getLogger("context_proxy.pipeline").removeHandler(capture)
        db.execute("DROP TRIGGER IF EXISTS refuse")
        db.close()
