"""``GET /sessions/{id}/branches`` (issue 20, item 1), in process on SQLite and PostgreSQL: each
leaf of a session with its message count and last activity, usable as ``?leaf=`` on
``/messages`` and ``/archive``, newest activity first in keyset pages, scoped to the tenant."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from storage.records import NewMessage
from tests.support.inprocess import FakeProvider, InProcessProxy

OTHER_KEY = "sk-other-tenant-key-9876543210"
ADMIN_KEY = "sk-admin-key-for-branches-5555"
SYSTEM = {"role": "system", "content": "You are terse."}
U1 = {"role": "user", "content": "Name a colour"}


@pytest.fixture
def inprocess_database_url(database_url: str) -> str:
    return database_url  # both databases, as the real-server read API tests


async def send(proxy: InProcessProxy, session_id: str, messages: list[dict[str, Any]], n: int) -> dict[str, Any]:
    resp = await proxy.chat({"model": "gpt-4o", "messages": messages}, headers={"x-session-id": session_id})
    assert resp.status_code == 200, resp.text
    await proxy.wait_logged(session_id, requests=n)
    reply: dict[str, Any] = resp.json()["choices"][0]["message"]
    return {"role": "assistant", "content": reply["content"]}


async def three_branches(proxy: InProcessProxy, provider: FakeProvider, session_id: str = "tree") -> None:
    """System, user, Blue, then 'Another' -> Green (branch 1), edited 'Another one, warm' -> Red
    (branch 2), 'Another' regenerated -> Purple (branch 3): 8 messages, 3 leaves."""
    provider.state.script.extend({"role": "assistant", "content": c} for c in ("Blue", "Green", "Red", "Purple"))
    a1 = await send(proxy, session_id, [SYSTEM, U1], 1)
    await send(proxy, session_id, [SYSTEM, U1, a1, {"role": "user", "content": "Another"}], 2)
    await send(proxy, session_id, [SYSTEM, U1, a1, {"role": "user", "content": "Another one, warm"}], 3)
    await send(proxy, session_id, [SYSTEM, U1, a1, {"role": "user", "content": "Another"}], 4)


async def all_messages(http: httpx.AsyncClient, session_id: str, **params: Any) -> list[dict[str, Any]]:
    resp = await http.get(f"/sessions/{session_id}/messages", params={"limit": 1000, **params})
    assert resp.status_code == 200, resp.text
    data: list[dict[str, Any]] = resp.json()["data"]
    return data


async def test_each_leaf_is_listed_and_reaches_its_branch(inprocess_proxy: InProcessProxy,
                                                         fake_provider: FakeProvider) -> None:
    await three_branches(inprocess_proxy, fake_provider)
    http = inprocess_proxy.http
    page = (await http.get("/sessions/tree/branches")).json()
    assert page["object"] == "list" and page["has_more"] is False
    branches = page["data"]
    assert (await http.get("/sessions/tree")).json()["branch_count"] == len(branches) == 3
    assert [b["object"] for b in branches] == ["session.branch"] * 3
    assert page["first_id"] == branches[0]["leaf"] and page["last_id"] == branches[-1]["leaf"]
    assert [b["newest"] for b in branches] == [True, False, False]
    # newest activity first: Purple (regenerated last), Red, Green
    ends = []
    for branch in branches:
        messages = await all_messages(http, "tree", leaf=branch["leaf"])
        assert len(messages) == branch["message_count"] == messages[-1]["seq"] + 1
        assert messages[-1]["id"] == branch["leaf"]
        assert branch["last_activity"] == messages[-1]["created_at"]
        ends.append((messages[-2]["content"], messages[-1]["content"]))
        archive = await http.get("/sessions/tree/archive", params={"leaf": branch["leaf"]})
        assert archive.status_code == 200 and messages[-1]["content"] in archive.text
    assert ends == [("Another", "Purple"), ("Another one, warm", "Red"), ("Another", "Green")]
    assert [b["message_count"] for b in branches] == [5, 5, 5]
    assert [b["last_activity"] for b in branches] == sorted((b["last_activity"] for b in branches), reverse=True)
    # the newest branch is the one /messages shows without ?leaf=
    assert (await all_messages(http, "tree"))[-1]["id"] == branches[0]["leaf"]


async def test_pages_follow_last_id_and_a_foreign_cursor_is_a_400(inprocess_proxy: InProcessProxy,
                                                                  fake_provider: FakeProvider) -> None:
    await three_branches(inprocess_proxy, fake_provider)
    fake_provider.state.script.append({"role": "assistant", "content": "Elsewhere"})
    await send(inprocess_proxy, "other", [U1], 1)
    http = inprocess_proxy.http
    whole = (await http.get("/sessions/tree/branches")).json()["data"]
    seen: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 1}
    for _ in range(5):
        page = (await http.get("/sessions/tree/branches", params=params)).json()
        assert len(page["data"]) == 1
        seen += page["data"]
        if not page["has_more"]:
            break
        params["after"] = page["last_id"]
    assert seen == whole
    page = (await http.get("/sessions/tree/branches", params={"limit": 2})).json()
    assert page["has_more"] and [b["leaf"] for b in page["data"]] == [b["leaf"] for b in whole[:2]]
    foreign = (await http.get("/sessions/other/branches")).json()["data"][0]["leaf"]
    for cursor in (foreign, "0" * 64, "not-a-hash", "x\x00"):
        resp = await http.get("/sessions/tree/branches", params={"after": cursor})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == "after"
    for bad in ({"limit": 0}, {"limit": 101}):
        assert (await http.get("/sessions/tree/branches", params=bad)).status_code == 400


async def test_an_empty_page_past_the_end_and_unknown_sessions(inprocess_proxy: InProcessProxy,
                                                               fake_provider: FakeProvider) -> None:
    fake_provider.state.script.append({"role": "assistant", "content": "Blue"})
    await send(inprocess_proxy, "one", [U1], 1)
    http = inprocess_proxy.http
    only = (await http.get("/sessions/one/branches")).json()
    assert [(b["message_count"], b["newest"]) for b in only["data"]] == [(2, True)]
    after = (await http.get("/sessions/one/branches", params={"after": only["last_id"]})).json()
    assert after == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}
    missing = await http.get("/sessions/nobody/branches")
    assert missing.status_code == 404 and missing.json()["error"]["type"]


async def test_another_tenants_session_is_a_404_and_admins_name_the_tenant(
        inprocess_factory: Callable[..., Awaitable[InProcessProxy]], fake_provider: FakeProvider) -> None:
    proxy = await inprocess_factory(compaction_enabled=False, admin_api_keys=ADMIN_KEY)
    await three_branches(proxy, fake_provider)
    mine = (await proxy.http.get("/sessions/tree/branches")).json()
    other, admin = proxy.http_client(OTHER_KEY), proxy.http_client(ADMIN_KEY)
    assert (await other.get("/sessions/tree/branches")).status_code == 404
    tenant = (await admin.get("/sessions")).json()["data"][0]["tenant"]
    assert (await other.get("/sessions/tree/branches", params={"tenant": tenant})).status_code == 404
    assert (await admin.get("/sessions/tree/branches", params={"tenant": tenant})).json() == mine
    assert (await admin.get("/sessions/tree/branches")).json() == mine
    assert (await admin.get("/sessions/tree/branches", params={"tenant": "t_nobody"})).status_code == 404


async def every_page(http: httpx.AsyncClient, path: str, key: str, limit: int) -> list[str]:
    """The ``key`` of every item of ``path``'s list, following ``last_id`` page by page; checks each
    page's ``last_id`` and that the page after the last one is empty."""
    seen: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    while True:
        page = (await http.get(path, params=params)).json()
        assert page["last_id"] == (page["data"][-1][key] if page["data"] else None)
        seen += [item[key] for item in page["data"]]
        if not page["has_more"]:
            break
        params["after"] = page["last_id"]
    past_end = (await http.get(path, params={"after": seen[-1]})).json()
    assert past_end["data"] == [] and past_end["has_more"] is False
    return seen


async def test_pages_over_leaves_with_equal_times_list_each_once(inprocess_proxy: InProcessProxy,
                                                                 fake_provider: FakeProvider) -> None:
    """23 replies to one message, stored at two instants (10 and 13 leaves sharing a time), plus the
    session's first exchange: every page size lists the 24 leaves once each, in the full list's order."""
    fake_provider.state.script.append({"role": "assistant", "content": "Blue"})
    await send(inprocess_proxy, "ties", [U1], 1)
    store = inprocess_proxy.app.state.proxy.store
    session = await store.find_session("ties", None)
    assert session is not None

    def chain(name: str) -> str:
        return hashlib.sha256(name.encode()).hexdigest()

    root = NewMessage(chain("root"), None, 0, "user", {"role": "user", "content": "Pick one"})
    replies = [NewMessage(chain(f"reply {i}"), root.chain_hash, 1, "assistant", {"role": "assistant", "content": f"{i}"})
               for i in range(23)]
    when = datetime(2026, 1, 1, tzinfo=UTC)
    await store.append_messages(session.pk, [root, *replies[:10]], when)
    await store.append_messages(session.pk, replies[10:], when.replace(second=1))
    whole = (await inprocess_proxy.http.get("/sessions/ties/branches", params={"limit": 100})).json()["data"]
    assert len(whole) == 24
    for limit in (1, 2, 3, 7, 10, 23, 24):
        assert await every_page(inprocess_proxy.http, "/sessions/ties/branches", "leaf", limit) == [
            b["leaf"] for b in whole], limit
