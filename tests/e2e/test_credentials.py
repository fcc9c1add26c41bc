"""End to end: credentials and tenancy (issue 2, points 5 and 7).

By default the client's key goes upstream unchanged; with ``upstream_api_key`` the proxy holds the
provider's key and accepts only configured client keys. A tenant is a salted hash of its key: other
tenants get 404s, admin keys see everything, and no raw key is ever written to the database or
the log lines.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import Any

import openai
import pytest

from storage.columns import unpack
from storage.tables import PACKED_COLUMNS
from tests.e2e.conftest import CLIENT_KEY, Proxy, Upstream
from tests.support.polling import wait_for

OTHER_KEY = "sk-other-tenant-key-9876543210"
ADMIN_KEY = "sk-admin-key-5555555555"
UPSTREAM_KEY = "sk-upstream-provider-key-4242424242"
ALL_KEYS = (CLIENT_KEY, OTHER_KEY, ADMIN_KEY, UPSTREAM_KEY)


def database_text(database_url: str) -> str:
    """Every row of every table of the database, as text (SQLite's dump; PostgreSQL rows as JSON)."""
    if database_url.startswith("sqlite:///"):
        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:
            packed = [unpack(v).decode() for c in PACKED_COLUMNS  # compressed values, as their text
                      for (v,) in conn.execute(f"SELECT {c.name} FROM {c.table.name} WHERE typeof({c.name}) = 'blob'")]
            return "\n".join([*conn.iterdump(), *packed])
    import psycopg

    with psycopg.connect(database_url) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE'")]
        assert {"sessions", "messages", "requests"} <= set(tables)
        lines = []
        for table in tables:
            lines += [r[0] for r in conn.execute(f'SELECT row_to_json(t)::text FROM "{table}" t')]
        return "\n".join(lines)


def assert_no_raw_keys(database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    text = database_text(database_url)
    assert "sess-" in text or "sess_" in text  # the dump did see the logged sessions
    for key in ALL_KEYS:
        assert key not in text
        assert key not in caplog.text


def chat(client: openai.OpenAI, session_id: str, content: str = "hello") -> Any:
    return client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": content}],
                                          extra_headers={"X-Session-Id": session_id})


def test_what_was_sent_without_a_key_is_read_with_an_admin_key_only(proxy_factory: Callable[..., Proxy]) -> None:
    """Pass-through mode: a request without a key is forwarded and logged (the ``anonymous`` tenant),
    but anybody who reaches the port could send that (no key), so no call without a key reads the log:
    401 in OpenAI's envelope on every read route, while an admin key reads it."""
    proxy = proxy_factory(admin_api_keys=ADMIN_KEY)
    with proxy.http(None) as anonymous, proxy.http(ADMIN_KEY) as admin, proxy.http() as a:
        resp = anonymous.post("/v1/chat/completions", headers={"x-session-id": "sess-keyless"},
                              json={"model": "gpt-4o", "messages": [{"role": "user", "content": "no key here"}]})
        assert resp.status_code == 200
        assert wait_for(lambda: admin.get("/sessions/sess-keyless").status_code == 200)
        for path in ("/sessions", "/sessions/sess-keyless", "/sessions/sess-keyless/messages",
                     "/sessions/sess-keyless/archive", "/sessions/sess-keyless/branches"):
            resp = anonymous.get(path)
            assert resp.status_code == 401, path
            assert resp.json()["error"]["type"] == "authentication_error"
            assert "Traceback" not in resp.text
        assert anonymous.get("/sessions", headers={"x-api-key": ""}).status_code == 401
        # an SDK given an empty key sends "Authorization: Bearer": no key, not a tenant named "Bearer"
        resp = anonymous.post("/v1/chat/completions", headers={"x-session-id": "sess-empty-bearer",
                                                               "authorization": "Bearer"},
                              json={"model": "gpt-4o", "messages": [{"role": "user", "content": "empty key"}]})
        assert resp.status_code == 200
        assert wait_for(lambda: admin.get("/sessions/sess-empty-bearer").status_code == 200)
        assert admin.get("/sessions/sess-empty-bearer").json()["tenant"] == "anonymous"
        for header in ("Bearer", "bearer"):
            assert anonymous.get("/sessions/sess-empty-bearer", headers={"authorization": header}).status_code == 401
        assert admin.get("/sessions/sess-keyless/messages").json()["data"][0]["content"] == "no key here"
        assert a.get("/sessions/sess-keyless").status_code == 404  # a key's tenant is not the keyless one


def test_tenants_are_isolated_and_admin_sees_all(proxy_factory: Callable[..., Proxy], upstream: Upstream,
                                                 database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    proxy = proxy_factory(admin_api_keys=ADMIN_KEY)
    chat(proxy.client(), "sess-shared-name", "from tenant A")
    chat(proxy.client(OTHER_KEY), "sess-b-only", "from tenant B")
    assert upstream.state.chat_requests[0].headers["authorization"] == f"Bearer {CLIENT_KEY}"  # passed unchanged
    assert upstream.state.chat_requests[1].headers["authorization"] == f"Bearer {OTHER_KEY}"

    with proxy.http() as a, proxy.http(OTHER_KEY) as b, proxy.http(ADMIN_KEY) as admin, proxy.http(None) as anonymous:
        assert wait_for(lambda: a.get("/sessions/sess-shared-name").json().get("request_count") == 1)
        for path in ("/sessions/sess-shared-name", "/sessions/sess-shared-name/messages",
                     "/sessions/sess-shared-name/events", "/sessions/sess-shared-name/archive"):
            resp = b.get(path)
            assert resp.status_code == 404, path
            assert resp.json()["error"]["type"] == "not_found_error"
            assert anonymous.get(path).status_code == 401  # the read API takes no call without a key
            assert admin.get(path).status_code == 200, path
        assert a.get("/sessions/sess-b-only").status_code == 404
        assert [s["id"] for s in a.get("/sessions").json()["data"]] == ["sess-shared-name"]
        assert [s["id"] for s in b.get("/sessions").json()["data"]] == ["sess-b-only"]
        assert {s["id"] for s in admin.get("/sessions").json()["data"]} == {"sess-shared-name", "sess-b-only"}
        seen_by_admin = admin.get("/sessions/sess-shared-name/messages").json()["data"]
        assert [m["content"] for m in seen_by_admin] == ["from tenant A", "OK: from tenant A"]

        # Two tenants may use the same session name without seeing each other's log.
        chat(proxy.client(OTHER_KEY), "sess-shared-name", "B's own conversation")
        assert wait_for(lambda: b.get("/sessions/sess-shared-name").status_code == 200)
        assert [m["content"] for m in a.get("/sessions/sess-shared-name/messages").json()["data"]][0] == "from tenant A"
        assert [m["content"] for m in b.get("/sessions/sess-shared-name/messages").json()["data"]][0] == "B's own conversation"
    assert_no_raw_keys(database_url, caplog)


def test_proxy_holds_the_upstream_key(proxy_factory: Callable[..., Proxy], upstream: Upstream,
                                      database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    proxy = proxy_factory(upstream_api_key=UPSTREAM_KEY, client_api_keys=f"{CLIENT_KEY}, {OTHER_KEY}",
                          admin_api_keys=ADMIN_KEY)
    reply = chat(proxy.client(), "sess-held-key")
    assert reply.choices[0].message.content == "OK: hello"
    list(proxy.client().chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "streamed"}],
                                                stream=True, extra_headers={"X-Session-Id": "sess-held-key-2"}))
    proxy.client(OTHER_KEY).models.list()
    proxy.client(ADMIN_KEY).embeddings.create(model="text-embedding-3-small", input="x")
    assert len(upstream.state.requests) == 4
    for received in upstream.state.requests:
        assert received.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
        for key in (CLIENT_KEY, OTHER_KEY, ADMIN_KEY):
            assert all(key not in value for value in received.headers.values())

    with pytest.raises(openai.AuthenticationError) as caught:
        chat(proxy.client("sk-unknown-client-key"), "sess-intruder")
    assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        proxy.client("sk-unknown-client-key").models.list()
    with proxy.http(None) as anonymous, proxy.http("sk-unknown-client-key") as unknown, proxy.http() as a:
        resp = anonymous.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]})
        assert resp.status_code == 401 and resp.json()["error"]["type"] == "authentication_error"
        assert unknown.get("/sessions").status_code == 401
        assert wait_for(lambda: a.get("/sessions/sess-held-key").json().get("request_count") == 1)
    assert len(upstream.state.requests) == 4  # refused clients never reached the upstream
    assert_no_raw_keys(database_url, caplog)


def test_alternative_key_headers_identify_the_same_tenant(proxy_factory: Callable[..., Proxy], upstream: Upstream) -> None:
    """Azure's ``api-key`` and Anthropic-style ``x-api-key`` name the same tenant as ``Authorization: Bearer``."""
    proxy = proxy_factory(compaction_enabled=False)
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "azure style"}]}
    with proxy.http(None) as http:
        assert http.post("/v1/chat/completions", json=body, headers={"api-key": CLIENT_KEY, "X-Session-Id": "sess-azure"}).status_code == 200
        assert upstream.state.chat_requests[-1].headers["api-key"] == CLIENT_KEY
        assert wait_for(lambda: http.get("/sessions/sess-azure", headers={"x-api-key": CLIENT_KEY}).status_code == 200)
    with proxy.http() as bearer:
        assert bearer.get("/sessions/sess-azure").status_code == 200
    with proxy.http(OTHER_KEY) as other:
        assert other.get("/sessions/sess-azure").status_code == 404


def test_shared_upstream_key_only_reaches_stateless_paths(proxy_factory, upstream) -> None:
    """With the proxy's own upstream key, a tenant cannot read account-wide state (files, batches,
    stored completions) that other tenants created under the same key; an admin can."""
    import httpx as _httpx

    proxy = proxy_factory(upstream_api_key="sk-upstream-secret", client_api_keys="sk-a,sk-b", admin_api_keys="sk-admin")
    with _httpx.Client(base_url=proxy.url, timeout=30) as http:
        auth = {"authorization": "Bearer sk-a", "openai-organization": "org-chosen-by-client"}
        assert http.get("/v1/models", headers=auth).status_code == 200
        assert http.post("/v1/embeddings", json={"model": "e", "input": "hi"}, headers=auth).status_code == 200
        for method, path in (("GET", "/v1/files"), ("GET", "/v1/batches"), ("GET", "/v1/chat/completions"), ("DELETE", "/v1/files/f1")):
            r = http.request(method, path, headers=auth)
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (method, path)
        admin = http.get("/v1/echo/files", headers={"authorization": "Bearer sk-admin"})
        assert admin.status_code == 200
    sent = [r for r in upstream.state.requests if r.path.startswith("/v1/models")]
    assert sent and "openai-organization" not in sent[-1].headers
    assert sent[-1].headers["authorization"] == "Bearer sk-upstream-secret"
