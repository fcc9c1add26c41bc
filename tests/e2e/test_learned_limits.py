"""Learned limits end to end (issue 15): scoped by tenant, listed and reset by operators, never a
reason to refuse. Real proxy and strict fake provider under uvicorn, SQLite and PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner

from proxy.cli import app as cli
from proxy.routes.auth import tenant_of
from tests.e2e.conftest import CLIENT_KEY, Proxy, Upstream, wait_logged

ADMIN_KEY = "sk-admin-0123456789abcdef"
OTHER_KEY = "sk-other-tenant-0123456789"
MODEL = "fake-8k-openai"  # an 8,192-token window the proxy does not know


def big_request(seed: str) -> dict[str, Any]:
    """About 11,000 tokens: over the window, so the provider answers with its overflow error."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful assistant."}]
    for i in range(12):
        history += [{"role": "user", "content": f"{seed} part {i}: " + "the quick brown fox jumps over it. " * 100},
                    {"role": "assistant", "content": f"Noted part {i}."}]
    history.append({"role": "user", "content": "Summarize what you read."})
    return {"model": MODEL, "messages": history}


def post(proxy: Proxy, key: str, body: dict[str, Any], session: str) -> Any:
    with proxy.http(key) as http:
        return http.post("/v1/chat/completions", json=body, headers={"x-session-id": session})


def limits(proxy: Proxy, key: str = ADMIN_KEY, method: str = "GET", **params: str) -> Any:
    with proxy.http(key) as http:
        return http.request(method, "/limits", params=params)


def test_a_learned_window_is_the_tenants_own_and_operators_can_list_and_reset_it(proxy_factory: Any,
                                                                                 upstream: Upstream) -> None:
    proxy = proxy_factory(admin_api_keys=ADMIN_KEY)
    mine = tenant_of(CLIENT_KEY, proxy.settings.tenant_salt)

    first = post(proxy, CLIENT_KEY, big_request("alpha"), "a1")
    assert first.status_code == 200, first.text
    assert first.headers["x-context-proxy-overflow-retries"] == "1"  # learned from the provider's overflow
    again = post(proxy, CLIENT_KEY, big_request("beta"), "a2")
    assert again.status_code == 200 and "x-context-proxy-overflow-retries" not in again.headers  # compacted first
    # the request records say it too (the web viewer shows them)
    for session, retries in (("a1", 1), ("a2", 0)):
        wait_logged(proxy, session, 1)
        with proxy.http(CLIENT_KEY) as http:
            records = http.get(f"/sessions/{session}/requests").json()["data"]
        assert [r["overflow_retries"] for r in records] == [retries]

    other = post(proxy, OTHER_KEY, big_request("gamma"), "b1")  # another tenant learns for itself
    assert other.status_code == 200 and other.headers["x-context-proxy-overflow-retries"] == "1"

    listed = limits(proxy)
    assert listed.status_code == 200
    rows = {r["tenant"]: r for r in listed.json()["data"]}
    assert len(rows) == 2 and rows[mine]["model"] == MODEL
    assert (rows[mine]["context_window_tokens"], rows[mine]["source"]) == (8192, "overflow")
    assert rows[mine]["expires_at"] > rows[mine]["updated_at"]

    forbidden = limits(proxy, CLIENT_KEY)
    assert forbidden.status_code == 403 and forbidden.json()["error"]["type"]

    runner = CliRunner()
    shown = runner.invoke(cli, ["limits", "list", "--json", "--database-url", proxy.settings.database_url])
    assert shown.exit_code == 0, shown.output
    assert {r["tenant"] for r in json.loads(shown.output)["data"]} == set(rows)
    table = runner.invoke(cli, ["limits", "list", "--database-url", proxy.settings.database_url])
    assert mine in table.output and "8,192" in table.output
    refused = runner.invoke(cli, ["limits", "reset", "--database-url", proxy.settings.database_url])
    assert refused.exit_code == 2  # no filter and no --all

    reset = limits(proxy, method="DELETE", tenant=mine)
    assert reset.status_code == 200 and reset.json()["deleted"] == 1
    assert mine not in {r["tenant"] for r in limits(proxy).json()["data"]}
    forgotten = post(proxy, CLIENT_KEY, big_request("delta"), "a3")  # learned again, from the provider
    assert forgotten.status_code == 200 and forgotten.headers["x-context-proxy-overflow-retries"] == "1"

    mistyped = limits(proxy, method="DELETE", modle=MODEL)
    assert mistyped.status_code == 400 and len(limits(proxy).json()["data"]) == 2  # nothing forgotten
    cleared = runner.invoke(cli, ["limits", "reset", "--all", "--database-url", proxy.settings.database_url])
    assert cleared.exit_code == 0 and "forgot 2 learned limits" in cleared.output
    assert limits(proxy).json()["data"] == []


def test_the_estimate_counts_what_is_sent_and_nothing_the_proxy_did_not_send(proxy: Proxy, upstream: Upstream) -> None:
    """Finding 1 of issue 15: the read tool's schema (~215 tokens) was counted although it was not
    sent, so ordinary requests looked silently truncated. The provider's ``usage.prompt_tokens``
    (the fake's own count of the body it received) and the proxy's estimate now agree."""
    body = {"model": "gpt-4o", "messages": [{"role": "system", "content": "You are a helpful assistant. " * 50},
                                            {"role": "user", "content": "hi"}]}
    r = post(proxy, CLIENT_KEY, body, "count-1")
    assert r.status_code == 200
    estimate = int(r.headers["x-context-proxy-tokens-forwarded"])
    assert estimate == int(r.headers["x-context-proxy-tokens-client"])
    assert abs(estimate - r.json()["usage"]["prompt_tokens"]) <= 10, (estimate, r.json()["usage"])
    assert "tools" not in upstream.state.chat_requests[-1].json  # the read tool was not sent, nor counted
    assert limits_of_nobody(proxy)


def limits_of_nobody(proxy: Proxy) -> bool:
    """Nothing was learned from an ordinary request (read with an admin-less proxy: the store)."""
    import asyncio

    from storage.store import Store

    async def rows() -> list[Any]:
        store = await Store.open(proxy.settings.database_url, pool_size=1)
        try:
            return await store.list_learned_limits()
        finally:
            await store.close()

    return all(r.context_window_tokens is None for r in asyncio.run(rows()))
