"""Concurrency (issue 5, point 7): two ``context-proxy serve`` processes on one PostgreSQL database;
50 concurrent requests on one session and 50 on different sessions, then concurrent requests whose
identical history is over the compaction trigger. No duplicate message row, no lost message, no
deadlock (everything answers within the timeout), one summary event per compaction point and no
double summarization (summary calls at the fake upstream)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import _pg_admin, _with_database
from tests.e2e.conftest import CLIENT_KEY, Upstream
from tests.reliability.probes import TALLY, ServeProcess, log_consistency, query

AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}
PREFIX = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "start"},
          {"role": "assistant", "content": "started"}]


@pytest.fixture
def pg_url(postgres_server: str, postgres_template: str) -> Iterator[str]:
    name = "rel_" + uuid.uuid4().hex[:12]
    _pg_admin(postgres_server, f"CREATE DATABASE {name} TEMPLATE {postgres_template}")
    try:
        yield _with_database(postgres_server, name)
    finally:
        _pg_admin(postgres_server, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def two_proxies(upstream: Upstream, pg_url: str, tmp_path: Path) -> Iterator[list[ServeProcess]]:
    models = tmp_path / "models.yaml"
    models.write_text('"fake-8k-openai":\n  context_window_tokens: 8192\n')
    # The database pool follows upstream_pool_size (min 50, plus as many overflow): two processes
    # at the default would hold up to 200 connections, past PostgreSQL's default max_connections 100.
    env = {"CONTEXT_PROXY_MODELS_FILE": str(models), "CONTEXT_PROXY_UPSTREAM_POOL_SIZE": "20"}
    procs = [ServeProcess(tmp_path, upstream.url, pg_url, **env) for _ in range(2)]
    try:
        for p in procs:
            p.start()
        yield procs
    finally:
        for p in procs:
            p.stop()


def fire(procs: list[ServeProcess], jobs: list[tuple[str, dict[str, Any]]]) -> list[int]:
    """Send every ``(session, body)`` at once, alternating between the proxies; the statuses."""

    def one(i: int) -> int:
        session, body = jobs[i]
        with (httpx.Client(base_url=procs[i % len(procs)].url, headers=AUTH | {"x-session-id": session}, timeout=60) as http,
              http.stream("POST", "/v1/chat/completions", json=body) as r):
            r.read()
            return r.status_code

    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(one, range(len(jobs)), timeout=90))  # a deadlock fails here


def rows(pg_url: str, sql: str) -> Any:
    return query(pg_url, sql)[0][0]


def wait_requests(pg_url: str, n: int) -> None:
    import time

    deadline = time.monotonic() + 20
    while rows(pg_url, "SELECT COUNT(*) FROM requests") < n:
        assert time.monotonic() < deadline, f"only {rows(pg_url, 'SELECT COUNT(*) FROM requests')} of {n} requests logged"
        time.sleep(0.05)


@pytest.mark.postgres
def test_50_on_one_session_and_50_on_different_sessions(two_proxies: list[ServeProcess], upstream: Upstream, pg_url: str) -> None:
    same = [("same", {"model": "gpt-4o", "stream": i % 2 == 0, "messages": [*PREFIX, {"role": "user", "content": f"question {i}"}]})
            for i in range(50)]
    different = [(f"diff-{i}", {"model": "gpt-4o", "stream": i % 2 == 1, "messages": [{"role": "user", "content": f"hello {i}"}]})
                 for i in range(50)]
    assert fire(two_proxies, same + different) == [200] * 100
    wait_requests(pg_url, 100)
    total = rows(pg_url, "SELECT COUNT(*) FROM messages")
    distinct = rows(pg_url, "SELECT COUNT(*) FROM (SELECT DISTINCT session_pk, chain_hash FROM messages) d")
    assert total == distinct, "duplicate message rows"
    same_pk = rows(pg_url, "SELECT pk FROM sessions WHERE session_id = 'same'")
    assert rows(pg_url, f"SELECT COUNT(*) FROM messages WHERE session_pk = {same_pk}") == len(PREFIX) + 50 + 50
    assert rows(pg_url, "SELECT COUNT(*) FROM sessions") == 51
    assert total == len(PREFIX) + 100 + 100, "lost messages"
    assert rows(pg_url, "SELECT COUNT(*) FROM requests WHERE status = 200") == 100
    log_consistency(pg_url)
    TALLY.add("requests", 100)
    TALLY.add("concurrent_requests", 100)


def over_trigger_history() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    for i in range(14):
        out.append({"role": "user", "content": f"step {i}: " + " ".join(f"token{i}x{j}" for j in range(150))})
        out.append({"role": "assistant", "content": f"done {i} " + "ok " * 100})
    out.append({"role": "user", "content": "continue"})
    return out


@pytest.mark.postgres
def test_concurrent_compaction_is_done_once(two_proxies: list[ServeProcess], upstream: Upstream, pg_url: str) -> None:
    body = {"model": "fake-8k-openai", "max_tokens": 512, "messages": over_trigger_history()}
    assert fire(two_proxies[:1], [("alone", body)]) == [200]  # the calls one compaction of this history takes
    calls_one = len(upstream.state.summary_requests)
    assert calls_one >= 1, "the history was over the trigger: a summary was expected"
    upstream.state.requests.clear()
    statuses = fire(two_proxies, [("compact", body)] * 20)
    assert statuses == [200] * 20
    wait_requests(pg_url, 21)
    compact_pk = rows(pg_url, "SELECT pk FROM sessions WHERE session_id = 'compact'")
    summaries = query(pg_url, f"SELECT anchor_hash FROM events WHERE kind = 'summary' AND session_pk = {compact_pk}")
    assert len(summaries) == 1, f"{len(summaries)} summary events at one compaction point"
    summary_calls = len(upstream.state.summary_requests)
    TALLY.note("concurrent_compaction", {"requests": 20, "summary_events": len(summaries), "summary_calls": summary_calls,
                                         "calls_for_one_summary": calls_one})
    log_consistency(pg_url)
    TALLY.add("requests", 21)
    assert summary_calls == calls_one, (
        f"double summarization: 20 concurrent requests at one compaction point made {summary_calls} summary calls; "
        f"one summary takes {calls_one}")
