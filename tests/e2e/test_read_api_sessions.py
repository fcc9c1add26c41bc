"""End to end (real uvicorn, the openai SDK and httpx, SQLite and PostgreSQL): session ids as sent,
the archive streamed and paged by lines, cursors scoped to their session, admins reaching every
tenant's session (issue 16 items 3 (archive), 13, 14, 15; issue 17 item 7)."""

from __future__ import annotations

import threading
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import openai
import pytest

from proxy.conversation.canonical import digests_and_chain
from storage.records import NewMessage
from storage.store import Store
from tests.e2e.conftest import Proxy, Upstream
from tests.e2e.test_read_api import settled

OTHER_KEY = "sk-other-tenant-key-9876543210"
ADMIN_KEY = "sk-admin-key-for-sessions-5555"


def chat(client: openai.OpenAI, session_id: str | bytes, content: str) -> Any:
    return client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": content}],
                                          extra_headers={"X-Session-Id": session_id})  # type: ignore[dict-item]


def assert_envelope(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert {"message", "type", "param", "code"} <= set(error)
    return error


# --- session ids (16.13) ---------------------------------------------------------------------


def test_a_long_session_id_is_refused_not_cut(proxy_factory: Callable[..., Proxy], upstream: Upstream) -> None:
    proxy = proxy_factory(compaction_enabled=False)
    client = proxy.client()
    prefix = "p" * 200
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, prefix + "-one", "first")
    assert refused.value.status_code == 400 and "X-Session-Id" in refused.value.message
    assert refused.value.body["param"] == "X-Session-Id"  # type: ignore[index]
    assert upstream.state.chat_requests == [], "nothing was forwarded"
    chat(client, prefix, "exactly 200 characters is fine")
    with proxy.http() as http:
        assert settled(http, prefix, 1)["id"] == prefix
        assert [s["id"] for s in http.get("/sessions").json()["data"]] == [prefix]


@pytest.mark.parametrize("session_id", ["a/b", "/lead", "..", "."])
def test_an_id_the_read_api_cannot_address_is_refused(proxy_factory: Callable[..., Proxy], upstream: Upstream,
                                                      session_id: str) -> None:
    proxy = proxy_factory(compaction_enabled=False)
    with proxy.http() as http:
        resp = http.post("/v1/chat/completions", headers={"x-session-id": session_id},
                         json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
        error = assert_envelope(resp, 400)
        assert error["param"] == "X-Session-Id" and "'/'" in error["message"]
        assert http.get("/sessions").json()["data"] == []


def test_a_utf8_session_id_is_stored_and_read_by_the_id_sent(proxy_factory: Callable[..., Proxy]) -> None:
    proxy = proxy_factory(compaction_enabled=False)
    session_id = "café-会话-🚀"
    with proxy.http() as http:  # the SDK sends str headers as ASCII only: httpx sends the UTF-8 bytes
        resp = http.post("/v1/chat/completions", headers={"x-session-id": session_id.encode()},
                         json={"model": "gpt-4o", "messages": [{"role": "user", "content": "unicode id"}]})
        assert resp.status_code == 200, resp.text
        echoed = dict(resp.headers.raw)[b"x-context-proxy-session-id"]
        assert echoed.decode("utf-8") == session_id, "the id goes back as the bytes it came as"
        assert settled(http, session_id, 1)["id"] == session_id  # httpx percent-encodes the path as UTF-8
        assert [s["id"] for s in http.get("/sessions").json()["data"]] == [session_id]
        archive = http.get(f"/sessions/{session_id}/archive")
        assert archive.status_code == 200 and "unicode id" in archive.text
    # bytes that are not UTF-8 are read as Latin-1, as before
    with proxy.http() as http:
        resp = http.post("/v1/chat/completions", headers={"x-session-id": b"caf\xe9"},
                         json={"model": "gpt-4o", "messages": [{"role": "user", "content": "latin-1 id"}]})
        assert resp.status_code == 200
        assert settled(http, "café", 1)["id"] == "café"


# --- the archive: streamed, paged by lines, 404 for an unknown leaf (16.3, 16.15, 17.7) ------------


def test_archive_pages_by_lines_and_an_unknown_leaf_is_404(proxy_factory: Callable[..., Proxy]) -> None:
    proxy = proxy_factory(compaction_enabled=False)
    client = proxy.client()
    history: list[dict[str, Any]] = []
    for n in range(4):
        history.append({"role": "user", "content": f"question {n}\nsecond line of {n}"})
        reply = client.chat.completions.create(model="gpt-4o", messages=history, extra_headers={"X-Session-Id": "paged"})
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    with proxy.http() as http:
        settled(http, "paged", 4)
        whole = http.get("/sessions/paged/archive")
        assert whole.status_code == 200 and whole.headers["content-type"].startswith("text/markdown")
        lines = whole.text.split("\n")[:-1]
        assert whole.text.startswith("# Archive of session `paged`") and "question 3" in whole.text
        pages: list[str] = []
        offset = 0
        for _ in range(len(lines) // 7 + 1):
            page = http.get("/sessions/paged/archive", params={"offset": offset, "limit": 7})
            assert page.status_code == 200
            got = page.text.split("\n")[:-1]
            pages += got
            if len(got) < 7:
                break
            offset += 7
        assert pages == lines, "the pages are the document's lines, in order"
        assert http.get("/sessions/paged/archive", params={"offset": len(lines)}).text == ""
        assert http.get("/sessions/paged/archive", params={"offset": 3, "limit": 2}).text.split("\n")[:-1] == lines[3:5]

        for leaf in ("0" * 64, "not-a-hash"):
            from_messages = assert_envelope(http.get("/sessions/paged/messages", params={"leaf": leaf}), 404)
            from_archive = assert_envelope(http.get("/sessions/paged/archive", params={"leaf": leaf}), 404)
            assert from_archive == from_messages
        assert_envelope(http.get("/sessions/paged/archive", params={"offset": -1}), 400)
        assert_envelope(http.get("/sessions/paged/archive", params={"limit": 0}), 400)


def _log_big_session(database_url: str, messages: int, chars: int) -> None:
    """Add a branch of ``messages`` messages of ``chars`` characters each to the session "big"
    (created through the proxy), written to the store directly (faster than through the proxy)."""
    import asyncio

    async def write() -> None:
        store = await Store.open(database_url, pool_size=2)
        try:
            session = await store.find_session("big", None)
            assert session is not None
            now = datetime.now(UTC)
            body = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} " + "y" * chars} for i in range(messages)]
            _, chain = digests_and_chain(body)
            rows = [NewMessage(chain[i], chain[i - 1] if i else None, i, body[i]["role"], body[i]) for i in range(messages)]
            for i in range(0, messages, 100):
                await store.append_messages(session.pk, rows[i : i + 100], now)
        finally:
            await store.close()

    asyncio.run(write())


def test_concurrent_archives_of_a_large_session_are_streamed_in_bounded_memory(
    proxy_factory: Callable[..., Proxy], database_url: str
) -> None:
    messages, chars = 1500, 20_000  # a 30 MB archive
    proxy = proxy_factory(compaction_enabled=False)
    chat(proxy.client(), "big", "start")
    with proxy.http() as http:
        settled(http, "big", 1)
    _log_big_session(database_url, messages, chars)
    sizes: list[int] = []

    def fetch() -> None:
        with proxy.http() as http, http.stream("GET", "/sessions/big/archive") as resp:
            assert resp.status_code == 200
            sizes.append(sum(len(chunk) for chunk in resp.iter_bytes()))

    tracemalloc.start()
    try:
        threads = [threading.Thread(target=fetch) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(sizes) == 4 and len(set(sizes)) == 1 and sizes[0] > messages * chars
    print(f"\n4 concurrent archives of {sizes[0] / 1e6:.1f} MB each: peak {peak / 1e6:.1f} MB traced")
    assert peak < sizes[0], f"4 concurrent archives of {sizes[0] / 1e6:.1f} MB peaked at {peak / 1e6:.1f} MB"


# --- cursors and admins (16.14) --------------------------------------------------------------


def test_request_cursor_is_scoped_to_the_session_and_checked(proxy_factory: Callable[..., Proxy]) -> None:
    proxy = proxy_factory(compaction_enabled=False)
    for n in range(3):
        chat(proxy.client(), "mine", f"turn {n}")
    chat(proxy.client(), "elsewhere", "other session")
    chat(proxy.client(OTHER_KEY), "theirs", "other tenant")
    with proxy.http() as http, proxy.http(OTHER_KEY) as other:
        settled(http, "mine", 3), settled(http, "elsewhere", 1), settled(other, "theirs", 1)
        mine = http.get("/sessions/mine/requests").json()["data"]
        first = http.get("/sessions/mine/requests", params={"limit": 1}).json()
        assert first["has_more"] and first["data"][0]["id"] == mine[0]["id"]
        rest = http.get("/sessions/mine/requests", params={"after": first["last_id"]}).json()["data"]
        assert [r["id"] for r in rest] == [r["id"] for r in mine[1:]]
        foreign = [http.get("/sessions/elsewhere/requests").json()["data"][0]["id"],
                   other.get("/sessions/theirs/requests").json()["data"][0]["id"], "req_unknown"]
        for cursor in foreign:
            error = assert_envelope(http.get("/sessions/mine/requests", params={"after": cursor}), 400)
            assert error["param"] == "after"


def test_admins_see_tenants_and_reach_both_sessions_sharing_an_id(proxy_factory: Callable[..., Proxy]) -> None:
    proxy = proxy_factory(compaction_enabled=False, admin_api_keys=ADMIN_KEY)
    chat(proxy.client(), "shared", "from tenant A")
    with proxy.http() as a:
        settled(a, "shared", 1)
    chat(proxy.client(OTHER_KEY), "shared", "from tenant B")
    with proxy.http() as a, proxy.http(OTHER_KEY) as b, proxy.http(ADMIN_KEY) as admin:
        settled(b, "shared", 1)
        assert "tenant" not in a.get("/sessions").json()["data"][0], "non-admins: no change"
        assert "tenant" not in a.get("/sessions/shared").json()
        listed = admin.get("/sessions").json()["data"]
        assert [s["id"] for s in listed] == ["shared", "shared"]
        tenants = [s["tenant"] for s in listed]
        assert len(set(tenants)) == 2 and all(t.startswith("t_") for t in tenants)
        seen = {}
        for tenant in tenants:
            assert admin.get("/sessions", params={"tenant": tenant}).json()["data"][0]["tenant"] == tenant
            assert admin.get("/sessions/shared", params={"tenant": tenant}).json()["tenant"] == tenant
            data = admin.get("/sessions/shared/messages", params={"tenant": tenant}).json()["data"]
            seen[tenant] = data[0]["content"]
            assert admin.get("/sessions/shared/requests", params={"tenant": tenant}).json()["data"]
            assert admin.get("/sessions/shared/events", params={"tenant": tenant}).status_code == 200
            assert data[0]["content"] in admin.get("/sessions/shared/archive", params={"tenant": tenant}).text
        assert sorted(seen.values()) == ["from tenant A", "from tenant B"]
        assert_envelope(admin.get("/sessions/shared", params={"tenant": "t_nobody"}), 404)
        # a tenant naming another tenant sees nothing, as if the session did not exist
        other_tenant = next(t for t in tenants if seen[t] == "from tenant B")
        assert_envelope(a.get("/sessions/shared", params={"tenant": other_tenant}), 404)
        assert a.get("/sessions", params={"tenant": other_tenant}).json()["data"] == []
        own = next(t for t in tenants if seen[t] == "from tenant A")
        assert a.get("/sessions/shared/messages", params={"tenant": own}).json()["data"][0]["content"] == "from tenant A"


def test_admin_session_pages_reach_every_session_when_tenants_share_an_id(proxy_factory: Callable[..., Proxy]) -> None:
    """Newest first W, X (tenant B), Z, X (tenant A), Y in pages of 2: following ``last_id`` reaches
    each session once (a plain id as cursor named the newest X, so the pages after [Z, X_A]
    repeated forever and Y was never listed)."""
    proxy = proxy_factory(compaction_enabled=False, admin_api_keys=ADMIN_KEY)
    with proxy.http() as a, proxy.http(OTHER_KEY) as b, proxy.http(ADMIN_KEY) as admin:
        for key, http, session_id in [(None, a, "Y"), (None, a, "X"), (None, a, "Z"), (OTHER_KEY, b, "X"), (None, a, "W")]:
            chat(proxy.client() if key is None else proxy.client(key), session_id, "hi " + session_id)
            settled(http, session_id, 1)
        everyone = admin.get("/sessions").json()["data"]
        assert [s["id"] for s in everyone] == ["W", "X", "Z", "X", "Y"]
        expected = [(s["tenant"], s["id"]) for s in everyone]
        for scope in ({}, {"tenant": everyone[0]["tenant"]}, {"tenant": everyone[1]["tenant"]}):
            seen: list[tuple[str, str]] = []
            pages = []
            params: dict[str, Any] = {"limit": 2, **scope}
            for _ in range(len(everyone)):
                pages.append(page := admin.get("/sessions", params=params).json())
                seen += [(s["tenant"], s["id"]) for s in page["data"]]
                if not page["has_more"]:
                    break
                params["after"] = page["last_id"]
            assert seen == [t for t in expected if t[0] == scope.get("tenant", t[0])], scope
            for page in pages:  # an admin's cursors name the tenant too: "<tenant>:<session id>"
                assert page["first_id"] == f"{page['data'][0]['tenant']}:{page['data'][0]['id']}"
                assert page["last_id"] == f"{page['data'][-1]['tenant']}:{page['data'][-1]['id']}"
        tenant_a = everyone[0]["tenant"]
        # a plain session id is still a cursor for admins (the newest session of that id)
        assert [s["id"] for s in admin.get("/sessions", params={"after": "Z"}).json()["data"]] == ["X", "Y"]
        assert [s["id"] for s in admin.get("/sessions", params={"after": "X"}).json()["data"]] == ["Z", "X", "Y"]
        # a tenant and id naming no session, or a session outside ?tenant=, is a bad cursor
        for params in ({"after": f"{tenant_a}:nobody"}, {"after": "t_nobody:X"},
                       {"after": f"{everyone[1]['tenant']}:X", "tenant": tenant_a}):
            assert assert_envelope(admin.get("/sessions", params=params), 400)["param"] == "after"
        # non-admins: plain ids as before; the admin form names no session of theirs
        page = a.get("/sessions", params={"limit": 2}).json()
        assert (page["first_id"], page["last_id"]) == ("W", "Z") and "tenant" not in page["data"][0]
        assert [s["id"] for s in a.get("/sessions", params={"after": page["last_id"]}).json()["data"]] == ["X", "Y"]
        for cursor in (f"{tenant_a}:Z", f"{everyone[1]['tenant']}:X"):
            assert assert_envelope(a.get("/sessions", params={"after": cursor}), 400)["param"] == "after"


def test_session_ids_with_a_colon_page_for_their_tenant_and_admins(proxy_factory: Callable[..., Proxy]) -> None:
    """A colon is allowed in a session id: the admin cursor splits at the first one (tenants have none)."""
    proxy = proxy_factory(compaction_enabled=False, admin_api_keys=ADMIN_KEY)
    ids = ["a:1", "t_x:b", "anonymous:c"]
    with proxy.http() as a, proxy.http(ADMIN_KEY) as admin:
        for session_id in ids:
            chat(proxy.client(), session_id, "colon " + session_id)
            settled(a, session_id, 1)
        for http in (a, admin):
            seen, params = [], {"limit": 1}
            for _ in ids:
                page = http.get("/sessions", params=params).json()
                seen += [s["id"] for s in page["data"]]
                if not page["has_more"]:
                    break
                params["after"] = page["last_id"]
            assert seen == ids[::-1]
