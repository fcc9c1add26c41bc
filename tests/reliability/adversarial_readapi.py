"""Adversarial attempts on session ids and the read API (issue 16 items 13-15), and the checks of
what the issue found holding: tenant scoping, keys and content kept out of the database and logs."""

from __future__ import annotations

import json
import time
from urllib.parse import quote

import httpx

from tests.reliability.adversarial_env import (
    Ctx,
    Proxy,
    chat_body,
    database_contains,
    key_headers,
    uid,
)
from tests.reliability.adversarial_logic import _logged, _post

ADMIN_KEY = "admin-adv-key-0123456789"


def session_ids(ctx: Ctx, proxy: Proxy) -> None:
    key = ctx.key()
    prefix = "s" * 200 + uid("-")
    r1 = _post(proxy, key, prefix + "-one", chat_body("long id one"))
    r2 = _post(proxy, key, prefix + "-two", chat_body("long id two"))
    refused = all(400 <= r.status_code < 500 for r in (r1, r2))
    ctx.record(13, "two session ids over 200 characters sharing a prefix", f"{len(prefix) + 4}-character ids",
               "held" if refused else "defect", f"statuses {r1.status_code}, {r2.status_code} (400 expected; 200 merges them)")
    exact = uid("x") + "e" * 187  # 200 characters: the longest id kept
    mark = ctx.marker()
    r = _post(proxy, key, exact, chat_body(f"200-character id {mark}"))
    logged = _logged(proxy, key, exact, mark, wait_s=4) if r.status_code == 200 else False
    ctx.record(13, "a session id of exactly 200 characters", "the longest id allowed", "held" if logged else "defect",
               f"chat {r.status_code}; readable by its id: {logged}")
    sid = uid("sessión-ü-")
    mark = ctx.marker()
    r = httpx.post(proxy.url + "/v1/chat/completions", json=chat_body(f"utf8 id {mark}"), timeout=30,
                   headers=[("authorization", f"Bearer {key}"), ("x-session-id", sid.encode("utf-8"))])  # type: ignore[arg-type]
    logged = _logged(proxy, key, sid, mark, wait_s=4) if r.status_code == 200 else False
    ctx.record(13, "a UTF-8 session id, read back by the id sent", f"X-Session-Id: {sid} (UTF-8 bytes)",
               "held" if logged or 400 <= r.status_code < 500 else "defect",
               f"chat {r.status_code}; readable at /sessions/{quote(sid)}: {logged}")
    sid = uid("team/agent-")
    mark = ctx.marker()
    r = _post(proxy, key, sid, chat_body(f"slash id {mark}"))
    logged = _logged(proxy, key, sid, mark, wait_s=4) if r.status_code == 200 else False
    ctx.record(13, "a session id containing '/'", f"X-Session-Id: {sid}", "held" if logged or 400 <= r.status_code < 500 else "defect",
               f"chat {r.status_code}; readable at /sessions/{quote(sid, safe='')}: {logged}")


def cursors_and_admins(ctx: Ctx, proxy: Proxy) -> None:
    ka, kb = ctx.key(), ctx.key()
    sa, sb = uid("curA-"), uid("curB-")
    _post(proxy, ka, sa, chat_body("tenant A"))
    _post(proxy, kb, sb, chat_body("tenant B"))
    time.sleep(1.5)
    reqs = httpx.get(proxy.url + f"/sessions/{sa}/requests", headers=key_headers(ka), timeout=30).json().get("data", [])
    if not reqs:
        ctx.record(14, "request cursor of another tenant", "", "n/a", "tenant A's request record not found")
    else:
        other = httpx.get(proxy.url + f"/sessions/{sb}/requests", params={"after": reqs[0]["id"]}, headers=key_headers(kb), timeout=30)
        none = httpx.get(proxy.url + f"/sessions/{sb}/requests", params={"after": "req_" + "0" * 32}, headers=key_headers(kb), timeout=30)
        bad = httpx.get(proxy.url + f"/sessions/{sb}/requests", params={"after": "not-a-cursor"}, headers=key_headers(kb), timeout=30)
        same = other.status_code == none.status_code == 400
        ctx.record(14, "request cursor of another tenant (existence oracle)", "?after=<tenant A's request id> on tenant B's session",
                   "held" if same else "defect",
                   f"another tenant's id: {other.status_code}; unknown id: {none.status_code} (both 400 expected)")
        ctx.record(14, "a bad request cursor", "?after=not-a-cursor", "held" if bad.status_code == 400 else "defect",
                   f"status {bad.status_code} (400 like the other lists)")
    shared = uid("shared-")
    _post(proxy, ka, shared, chat_body("older, tenant A"))
    time.sleep(1.1)
    _post(proxy, kb, shared, chat_body("newer, tenant B"))
    _post(proxy, kb, shared, chat_body("newer, tenant B again"))
    time.sleep(1.5)
    listed = httpx.get(proxy.url + "/sessions", params={"limit": 100}, headers=key_headers(ADMIN_KEY), timeout=30)
    rows = [s for s in listed.json().get("data", []) if s.get("id") == shared] if listed.status_code == 200 else []
    tenants = [s.get("tenant") or s.get("tenant_id") or s.get("tenant_hash") for s in rows]
    ctx.record(14, "admin list shows the tenant of sessions sharing an id", "two tenants, one X-Session-Id",
               "held" if len(rows) == 2 and all(tenants) and len(set(tenants)) == 2 else "defect",
               f"list {listed.status_code}: {len(rows)} rows for the id, tenants {tenants}")
    reached = False
    for t in [t for t in tenants if t]:
        for params in ({"tenant": t},):
            r = httpx.get(proxy.url + f"/sessions/{shared}/messages", params=params, headers=key_headers(ADMIN_KEY), timeout=30)
            reached = reached or (r.status_code == 200 and "older, tenant A" in r.text)
    ctx.record(14, "admin reaches the older of two sessions sharing an id", "GET /sessions/{id}/messages?tenant=<its tenant>",
               "held" if reached else "defect", f"older session's messages reached: {reached}")


def unknown_leaf(ctx: Ctx, proxy: Proxy) -> None:
    key, session = ctx.key(), uid("leaf-")
    _post(proxy, key, session, chat_body("leaf"))
    time.sleep(1)
    arch = httpx.get(proxy.url + f"/sessions/{session}/archive", params={"leaf": "0" * 64}, headers=key_headers(key), timeout=30)
    msgs = httpx.get(proxy.url + f"/sessions/{session}/messages", params={"leaf": "0" * 64}, headers=key_headers(key), timeout=30)
    ctx.record(15, "/archive?leaf=<unknown>", "an unknown leaf hash", "held" if arch.status_code == 404 else "defect",
               f"/archive {arch.status_code}, /messages {msgs.status_code} (404 expected for both)")


def held_before(ctx: Ctx, proxy: Proxy) -> None:
    """What the issue found holding: tenant scoping, body size and nesting limits."""
    ka, kb, session = ctx.key(), ctx.key(), uid("scope-")
    _post(proxy, ka, session, chat_body("tenant A only"))
    time.sleep(1)
    statuses = [httpx.get(proxy.url + f"/sessions/{session}{suffix}", headers=key_headers(kb), timeout=30).status_code
                for suffix in ("", "/messages", "/requests", "/events", "/archive")]
    ctx.record(0, "tenant scoping of the read routes", "tenant B reads tenant A's session", "held" if set(statuses) == {404} else "defect",
               f"statuses {statuses}")
    big = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * (65 << 20) + b'"}]}'
    try:
        r = httpx.post(proxy.url + "/v1/chat/completions", content=big, timeout=60, headers=key_headers(ka) | {"content-type": "application/json"})
        st = r.status_code
    except httpx.HTTPError:
        st = 0
    ctx.record(0, "body over the size limit", "65 MB JSON body", "held" if st == 413 else "defect", f"status {st} (413 expected)")
    deep = b'{"model":"m","messages":[{"role":"user","content":"a","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}]}"
    r = httpx.post(proxy.url + "/v1/chat/completions", content=deep, timeout=60, headers=key_headers(ka) | {"content-type": "application/json"})
    ctx.record(0, "nesting 100,000 levels deep", "a JSON body nested 100,000 arrays deep", "held" if 400 <= r.status_code < 500 else "defect",
               f"status {r.status_code}")


def secrets_and_logs(ctx: Ctx) -> None:
    """Keys never in the database or logs; content never in logs; no SQL parameters logged."""
    logs = "\n".join(p.log_text() for p in ctx.proxies)
    keys_logged = [k for k in ctx.keys if k in logs]
    keys_stored = database_contains(ctx.database_url, ctx.keys)
    ctx.record(0, "client keys kept out of the database and logs", f"{len(ctx.keys)} keys used",
               "defect" if keys_logged or keys_stored else "held", f"in logs: {len(keys_logged)}; in the database: {len(keys_stored)}")
    content = [m for m in ctx.markers if m in logs]
    params = logs.count("[parameters:")
    ctx.record(11, "no message content in the proxy's log (content logging off)", f"{len(ctx.markers)} markers planted in content",
               "defect" if content or params else "held", f"markers found in the log: {len(content)}; '[parameters:' lines: {params}")
    print(json.dumps({"log_bytes": len(logs)}))
