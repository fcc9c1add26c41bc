"""``GET /sessions?model=&updated_after=&updated_before=`` (issue 20, the viewer's filters), in
process on SQLite and PostgreSQL: the filters apply before the page is cut, keyset paging works
under them, an admin's listing is filtered too, and bad values are a 400."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from proxy.routes.auth import tenant_of
from storage.records import RequestRecord
from tests.support.inprocess import CLIENT_KEY, InProcessProxy

OTHER_KEY = "sk-other-tenant-key-9876543210"
ADMIN_KEY = "sk-admin-key-for-filters-5555"


@pytest.fixture
def inprocess_database_url(database_url: str) -> str:
    return database_url


def day(n: int) -> datetime:
    return datetime(2026, 1, n, 12, tzinfo=UTC)


async def sessions(proxy: InProcessProxy) -> None:
    """a (Jan 1, m1), b (Jan 2, m2), c (Jan 3, m1 and m2), d (Jan 4, no request); another tenant's e (Jan 5, m1)."""
    store = proxy.app.state.proxy.store
    mine = tenant_of(CLIENT_KEY, proxy.settings.tenant_salt)
    other = tenant_of(OTHER_KEY, proxy.settings.tenant_salt)
    plan: list[tuple[str, str, int, list[str]]] = [("a", mine, 1, ["m1"]), ("b", mine, 2, ["m2"]),
                                                   ("c", mine, 3, ["m1", "m2"]), ("d", mine, 4, []), ("e", other, 5, ["m1"])]
    for session_id, tenant, n, models in plan:
        session = await store.get_or_create_session(tenant, session_id, day(n))
        for i, model in enumerate(models):
            await store.add_request(RequestRecord(f"req_{session_id}{i}", session.pk, model, 200, 1.0, False, None, 0,
                                                  None, 10, 10, created_at=day(n)))


async def ids(proxy: InProcessProxy, key: str = CLIENT_KEY, **params: Any) -> tuple[list[str], bool, str | None]:
    resp = await proxy.http_client(key).get("/sessions", params=params)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    return [s["id"] for s in body["data"]], body["has_more"], body["last_id"]


async def test_sessions_are_filtered_by_model_and_time_before_paging(inprocess_factory: Any) -> None:
    proxy = await inprocess_factory(admin_api_keys=ADMIN_KEY)
    await sessions(proxy)
    jan = {n: int(day(n).timestamp()) for n in range(1, 6)}
    assert (await ids(proxy))[0] == ["d", "c", "b", "a"]
    assert (await ids(proxy, model="m1"))[0] == ["c", "a"]
    assert (await ids(proxy, model="m2"))[0] == ["c", "b"]
    assert (await ids(proxy, model="m3"))[0] == []
    assert (await ids(proxy, updated_after=jan[2]))[0] == ["d", "c", "b"]  # at or after
    assert (await ids(proxy, updated_before=jan[3]))[0] == ["b", "a"]  # strictly before
    assert (await ids(proxy, model="m1", updated_before=jan[3]))[0] == ["a"]
    # keyset pages under a filter
    first, more, last = await ids(proxy, model="m1", limit=1)
    assert (first, more, last) == (["c"], True, "c")
    assert (await ids(proxy, model="m1", limit=1, after=last))[:2] == (["a"], False)
    # an admin's listing, every tenant's
    assert (await ids(proxy, ADMIN_KEY, model="m1"))[0] == ["e", "c", "a"]
    assert (await ids(proxy, ADMIN_KEY, model="m1", updated_after=jan[4]))[0] == ["e"]


async def test_bad_filter_values_are_a_400(inprocess_proxy: InProcessProxy) -> None:
    for params in ({"model": ""}, {"model": "m" * 201}, {"updated_after": -1}, {"updated_before": "yesterday"},
                   {"updated_after": 10**13}):
        resp = await inprocess_proxy.http.get("/sessions", params=params)
        assert resp.status_code == 400, (params, resp.text)
        assert resp.json()["error"]["type"] == "invalid_request_error"
