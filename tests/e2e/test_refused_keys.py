"""Issue 16 item 5: in the default mode (client keys passed through) a request the provider answers
401 or 403 keeps no content: no messages (nor reply) in the log, only the request record, on
SQLite and PostgreSQL. An accepted key's request is logged as before."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import sqlalchemy as sa

from storage.store import Store
from storage.tables import artifacts
from tests.e2e.conftest import Proxy, Upstream
from tests.support.shared import needs_exact_encodings

SECRET = "the secret text of a request whose key was refused"


def _refusal(status: int) -> tuple[Any, ...]:
    kind = "invalid_request_error" if status == 401 else "permission_error"
    return ("status", status, {"error": {"message": "Incorrect API key provided: sk-bad***", "type": kind,
                                         "param": None, "code": "invalid_api_key"}})


async def _rows(database_url: str, session_id: str) -> tuple[int, list[Any], int]:
    """(messages, request records, artifacts) of ``session_id``. Three reads, the records first: a
    later read sees every commit an earlier one saw, so the content committed with a record seen
    is counted (read the other way round, a record committed between the reads came without it)."""
    store = await Store.open(database_url)
    try:
        session = await store.find_session(session_id, None)
        assert session is not None
        requests, _ = await store.list_requests(session.pk, 10, None)
        summary = await store.session_summary(session)
        async with store._engine.connect() as conn:
            stored = (await conn.execute(sa.select(sa.func.count()).select_from(artifacts)
                                         .where(artifacts.c.session_pk == session.pk))).scalar_one()
        return summary.message_count, requests, stored
    finally:
        await store.close()


def _settled(database_url: str, session_id: str, records: int = 1, *, request_id: str | None = None,
             ) -> tuple[int, list[Any], int]:
    """The rows of ``session_id`` once ``records`` request records are stored (``request_id``'s
    among them, if given). A request's record is written in the transaction that writes its
    content (a refused one's: that deletes it): once it is there, so is the rest."""
    deadline = time.monotonic() + 10
    while True:
        rows = asyncio.run(_rows(database_url, session_id))
        if len(rows[1]) >= records and (request_id is None or any(q.id == request_id for q in rows[1])):
            return rows
        assert time.monotonic() < deadline, rows
        time.sleep(0.05)


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_keeps_only_the_request_record(proxy: Proxy, upstream: Upstream, database_url: str, status: int) -> None:
    upstream.state.fail_next.append(_refusal(status))
    with proxy.http(key="sk-made-up-key-0123456789") as http:
        body = {"model": "gpt-4o", "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": SECRET * 1000}]}
        r = http.post("/v1/chat/completions", json=body, headers={"x-session-id": "refused"})
        assert r.status_code == status  # the provider's answer, as it came
    messages, requests, _ = _settled(database_url, "refused")
    assert [(q.status, q.added_messages) for q in requests] == [(status, 0)]
    assert messages == 0
    assert "sk-bad" not in (requests[0].error or "")
    # the same conversation under an accepted key is logged in full
    with proxy.http() as http:
        r = http.post("/v1/chat/completions", json=body, headers={"x-session-id": "accepted"})
        assert r.status_code == 200
        deadline = time.monotonic() + 10
        while (rows := asyncio.run(_rows(database_url, "accepted")))[0] < 3:  # system, user, reply
            assert time.monotonic() < deadline, rows
            time.sleep(0.05)


def test_a_refused_key_keeps_no_artifact_of_an_offloaded_body(proxy: Proxy, upstream: Upstream, database_url: str) -> None:
    """A large user message is offloaded (its artifact stored) before the request is forwarded; the
    provider's 401 then removes it: the record alone stays. Accepted, the same body keeps its artifact."""
    big = " ".join(f"{SECRET} {i}" for i in range(8000))  # about 100k tokens: over offload_user_tokens
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": big}, {"role": "assistant", "content": "ok"},
                                            {"role": "user", "content": "and now?"}]}
    upstream.state.fail_next.append(_refusal(401))
    with proxy.http(key="sk-made-up-key-9876543210") as http:
        r = http.post("/v1/chat/completions", json=body, headers={"x-session-id": "refused-big"})
    assert r.status_code == 401
    assert "offload" in r.headers["x-context-proxy-defenses"]  # the artifact was stored before the answer
    messages, requests, stored = _settled(database_url, "refused-big")
    assert [(q.status, q.added_messages) for q in requests] == [(401, 0)]
    assert (messages, stored) == (0, 0)
    with proxy.http() as http:
        r = http.post("/v1/chat/completions", json=body, headers={"x-session-id": "accepted-big"})
    assert r.status_code == 200 and "offload" in r.headers["x-context-proxy-defenses"]
    messages, requests, stored = _settled(database_url, "accepted-big")
    assert stored >= 1


def test_after_a_403_the_same_tenants_accepted_request_stores_its_artifact_again(
    proxy: Proxy, upstream: Upstream, database_url: str,
) -> None:
    """A 403 can be for one model only: the tenant's next, accepted request with the same content
    must store the artifact the refused one's cleanup removed (not assume it is still stored)."""
    big = " ".join(f"{SECRET} {i}" for i in range(8000))
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": big}, {"role": "assistant", "content": "ok"},
                                            {"role": "user", "content": "and now?"}]}
    upstream.state.fail_next.append(_refusal(403))
    with proxy.http() as http:
        assert http.post("/v1/chat/completions", json=body, headers={"x-session-id": "same"}).status_code == 403
        assert _settled(database_url, "same")[2] == 0
        r = http.post("/v1/chat/completions", json=body, headers={"x-session-id": "same"})
        assert r.status_code == 200
        deadline = time.monotonic() + 10
        while (rows := asyncio.run(_rows(database_url, "same")))[0] < 4:
            assert time.monotonic() < deadline, rows
            time.sleep(0.05)
    assert rows[2] >= 1


async def _artifact_texts(database_url: str, session_id: str) -> dict[str, str]:
    store = await Store.open(database_url)
    try:
        session = await store.find_session(session_id, None)
        assert session is not None
        async with store._engine.connect() as conn:
            ids = (await conn.execute(sa.select(artifacts.c.id).where(artifacts.c.session_pk == session.pk))).scalars().all()
        out = {}
        for artifact_id in ids:
            artifact = await store.get_artifact(artifact_id, None)
            assert artifact is not None
            out[artifact_id] = artifact.content
        return out
    finally:
        await store.close()


@needs_exact_encodings  # the bodies are sized to be offloaded as tiktoken counts them
@pytest.mark.parametrize("same_body", [True, False], ids=["same_body", "other_body"])
def test_a_refused_request_s_cleanup_keeps_a_concurrent_accepted_request_s_content(
    proxy: Proxy, upstream: Upstream, database_url: str, same_body: bool,
) -> None:
    """B (a large body: its artifact is stored; the provider answers 403 after 2 s, a key refused
    for one model) starts first; A, of the same tenant and session, is accepted and logged while B
    waits. After both, A's messages and the artifacts A's forwarded body names are all there."""
    def body(marker: str) -> dict[str, Any]:
        big = " ".join(f"{marker} {i}" for i in range(8000))
        return {"model": "gpt-4o", "messages": [{"role": "user", "content": big}, {"role": "assistant", "content": "ok"},
                                                {"role": "user", "content": "and now?"}]}

    body_b = body("B's secret words")
    body_a = body_b if same_body else body("A's own words")
    upstream.state.fail_next.append(("delay", 2.0, _refusal(403)))
    with proxy.http() as http, ThreadPoolExecutor(1) as pool:
        refused = pool.submit(http.post, "/v1/chat/completions", json=body_b, headers={"x-session-id": "shared"})
        deadline = time.monotonic() + 10
        while not any(r.path == "/v1/chat/completions" for r in upstream.state.requests):  # B's artifact is stored
            assert time.monotonic() < deadline and not refused.done()
            time.sleep(0.02)
        r = http.post("/v1/chat/completions", json=body_a, headers={"x-session-id": "shared"})
        assert r.status_code == 200 and "offload" in r.headers["x-context-proxy-defenses"]
        assert not refused.done()  # A was answered while B waited
        # A's record, not B's: under load B's may come first (its content gone, A's not yet written)
        messages, requests, _ = _settled(database_url, "shared", 1, request_id=r.headers["x-context-proxy-request-id"])
        assert messages == 4  # A's three and its reply
        assert refused.result().status_code == 403
    messages, requests, _ = _settled(database_url, "shared", 2)
    assert sorted(q.status for q in requests) == [200, 403]
    assert messages == 4
    texts = asyncio.run(_artifact_texts(database_url, "shared"))
    assert any("A's own words" in t or (same_body and "B's secret words" in t) for t in texts.values()), texts.keys()
    # what A's forwarded body names is there to read
    forwarded = [q for q in upstream.state.requests if q.path == "/v1/chat/completions"][1].body.decode()
    assert [i for i in texts if i in forwarded]


@needs_exact_encodings
def test_a_refused_request_s_cleanup_waits_for_the_write_of_a_request_answered_before_it(
    proxy: Proxy, upstream: Upstream, database_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The interleaving the test above meets under load, forced: A (same tenant, session and body:
    B's artifact found stored, named in A's forwarded body) is answered while B waits, and A's log
    write is still pending when B is refused. B's cleanup must come after A's record (which keeps
    the artifact), not delete the artifact under it. A's write is held until B's cleanup ran, for
    at most 1 s after B's answer (the cleanup that waits for A's write ends the hold that way)."""
    b_answered, b_cleaned = threading.Event(), threading.Event()
    append_and_record, record_refused = Store.append_and_record, Store.record_refused

    def held(self: Store, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        async def later() -> Any:
            if args[2].status == 200:  # (session_pk, messages, record, now): A's write
                await asyncio.to_thread(b_answered.wait, 10)
                await asyncio.to_thread(b_cleaned.wait, 1)
            written = append_and_record(self, *args, **kwargs)
            return await written if inspect.isawaitable(written) else written
        return asyncio.ensure_future(later())

    async def noted(self: Store, *args: Any, **kwargs: Any) -> Any:
        try:
            return await record_refused(self, *args, **kwargs)
        finally:
            b_cleaned.set()

    monkeypatch.setattr(Store, "append_and_record", held)
    monkeypatch.setattr(Store, "record_refused", noted)
    if hasattr(Store, "append_and_record_nowait"):  # (the old tree's queued write: through the held one)
        monkeypatch.setattr(Store, "append_and_record_nowait", lambda self, *a, **k: False)
    big = " ".join(f"B's secret words {i}" for i in range(8000))
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": big}, {"role": "assistant", "content": "ok"},
                                            {"role": "user", "content": "and now?"}]}
    upstream.state.fail_next.append(("delay", 2.0, _refusal(403)))
    with proxy.http() as http, ThreadPoolExecutor(1) as pool:
        refused = pool.submit(http.post, "/v1/chat/completions", json=body, headers={"x-session-id": "held"})
        deadline = time.monotonic() + 10
        while not any(r.path == "/v1/chat/completions" for r in upstream.state.requests):  # B's artifact is stored
            assert time.monotonic() < deadline and not refused.done()
            time.sleep(0.02)
        r = http.post("/v1/chat/completions", json=body, headers={"x-session-id": "held"})
        assert r.status_code == 200 and "offload" in r.headers["x-context-proxy-defenses"]
        assert not refused.done()
        assert refused.result().status_code == 403
        b_answered.set()
    messages, requests, _ = _settled(database_url, "held", 2)
    assert sorted(q.status for q in requests) == [200, 403]
    assert messages == 4
    texts = asyncio.run(_artifact_texts(database_url, "held"))
    forwarded = [q for q in upstream.state.requests if q.path == "/v1/chat/completions"][1].body.decode()
    assert [i for i in texts if i in forwarded], texts.keys()  # what A's forwarded body names is there


def test_a_refused_request_s_cached_rows_are_forgotten_even_when_the_cache_let_them_go() -> None:
    """What the process cached of a refused request's deleted rows is dropped: its artifacts
    (even when the cache already let them go: no KeyError that would fail the log write after the
    record) and the session's cached events, so no later request applies an event whose row is
    gone (review)."""
    from proxy.compaction.compactor import ProjectingCompactor
    from proxy.settings import Settings
    from proxy.telemetry.metrics import Metrics
    from proxy.tokens.counter import load_counter

    upstream = type("Upstream", (), {"base_url": "http://upstream.invalid/v1"})()
    compactor = ProjectingCompactor(Settings(), None, upstream, load_counter(None),  # type: ignore[arg-type]
                                    metrics=Metrics())
    compactor._stored.put(("t", "art_kept"), True)
    compactor._events.put(7, ["an event"])
    compactor._events.put(8, ["another session's"])
    compactor.forget_refused(7, "t", ["art_kept", "art_never_cached"], events_deleted=True)
    assert compactor._stored.fresh(("t", "art_kept")) is None
    assert compactor._events.fresh(7) is None and compactor._events.fresh(8) == ["another session's"]
