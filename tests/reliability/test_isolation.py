"""Isolation (issue 5, point 1): several tenants, reused and guessed session ids, another tenant's
artifacts. Another tenant's data is a 404 whose body is the same as for an id that does not exist
(no enumeration through error text); an admin key sees every tenant."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.e2e.conftest import Proxy, Upstream
from tests.reliability.probes import TALLY, assert_envelope

KEYS = [secrets.token_hex(16) for _ in range(3)]
ADMIN = secrets.token_hex(16)
ARTIFACT_RE = re.compile(r"art_[0-9a-f]{32}")


def history(tenant: int, turn: int) -> list[dict[str, Any]]:
    big = "\n".join(f"line {i} of tenant {tenant}'s secret build log" for i in range(400))
    return [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": f"Build it (tenant {tenant})"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": big},
        {"role": "user", "content": f"turn {turn}"},
    ]


def wait_requests(http: httpx.Client, session_id: str, n: int, timeout_s: float = 10) -> None:
    """Wait until the caller's session has ``n`` logged requests (the log is written after the reply)."""
    deadline = time.monotonic() + timeout_s
    while http.get(f"/sessions/{session_id}").json().get("request_count", 0) < n:
        assert time.monotonic() < deadline, f"session {session_id} never reached {n} requests"
        time.sleep(0.02)


def same_but_id(a: httpx.Response, b: httpx.Response, id_a: str, id_b: str) -> None:
    """Two error responses are identical once the id each one names is blanked."""
    assert a.status_code == b.status_code == 404
    assert a.text.replace(id_a, "ID") == b.text.replace(id_b, "ID")
    assert set(a.headers) - {"date", "content-length"} == set(b.headers) - {"date", "content-length"}


def test_tenants_reused_and_guessed_ids_and_artifacts(proxy_factory: Callable[..., Proxy], upstream: Upstream) -> None:
    proxy = proxy_factory(admin_api_keys=ADMIN, offload_tool_tokens=200)
    artifacts: dict[int, str] = {}
    for t, key in enumerate(KEYS):
        with proxy.http(key) as http:
            for turn in range(2):
                for sid in ("shared-name", f"own-{t}"):  # the same X-Session-Id string in every tenant
                    r = http.post("/v1/chat/completions", headers={"x-session-id": sid},
                                  json={"model": "gpt-4o", "messages": history(t, turn)})
                    assert r.status_code == 200, r.text
                    TALLY.add("requests")
            forwarded = upstream.state.chat_requests[-1].body.decode()
            artifacts[t] = ARTIFACT_RE.findall(forwarded)[0]
    assert len(set(artifacts.values())) == 3

    clients = [proxy.http(k) for k in KEYS]
    try:
        for t, http in enumerate(clients):
            wait_requests(http, "shared-name", 2)
            # the reused id is this tenant's own session: only its messages
            msgs = http.get("/sessions/shared-name/messages").json()["data"]
            assert msgs and all(f"tenant {t}" in (m["content"] or "") or m["role"] != "user" or m["content"].startswith("turn")
                                for m in msgs)
            texts = " ".join(str(m.get("content")) for m in msgs)
            assert all(f"tenant {o}" not in texts for o in range(3) if o != t)
            listed = {s["id"] for s in http.get("/sessions", params={"limit": 100}).json()["data"]}
            assert listed == {"shared-name", f"own-{t}"}
            # own artifact readable; every other tenant's is a 404 identical to a missing id
            assert http.get(f"/artifacts/{artifacts[t]}").status_code == 200
            missing = "art_" + secrets.token_hex(16)
            for o in range(3):
                if o == t:
                    continue
                foreign = http.get(f"/artifacts/{artifacts[o]}")
                same_but_id(foreign, http.get(f"/artifacts/{missing}"), artifacts[o], missing)
                assert_envelope(foreign, 404)
                for suffix in ("", "/messages", "/events", "/archive"):
                    foreign = http.get(f"/sessions/own-{o}{suffix}")
                    guessed = http.get(f"/sessions/own-guess-{secrets.token_hex(4)}{suffix}")
                    same_but_id(foreign, guessed, f"own-{o}", guessed.url.path.split("/")[2])
                    TALLY.add("isolation_probes")
                # an after-cursor naming another tenant's session leaks nothing either
                r = http.get("/sessions", params={"after": f"own-{o}"})
                r2 = http.get("/sessions", params={"after": "own-nobody"})
                assert r.status_code == r2.status_code == 400
                assert r.text.replace(f"own-{o}", "ID") == r2.text.replace("own-nobody", "ID")
                TALLY.add("isolation_probes", 2)
    finally:
        for http in clients:
            http.close()

    with proxy.http(ADMIN) as admin:
        listed = [s["id"] for s in admin.get("/sessions", params={"limit": 100}).json()["data"]]
        assert sorted(listed) == sorted(["shared-name"] * 3 + [f"own-{t}" for t in range(3)])
        for t in range(3):
            assert admin.get(f"/artifacts/{artifacts[t]}").status_code == 200
            assert admin.get(f"/sessions/own-{t}/messages").status_code == 200


def test_derived_session_ids_do_not_collide_across_tenants(proxy_factory: Callable[..., Proxy]) -> None:
    """Two tenants sending the very same first messages (no X-Session-Id) get separate sessions."""
    proxy = proxy_factory()
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "identical opening message"}]}
    ids = []
    for key in KEYS[:2]:
        with proxy.http(key) as http:
            r = http.post("/v1/chat/completions", json=body)
            assert r.status_code == 200
            ids.append(r.headers["x-context-proxy-session-id"])
    for key, sid, other in ((KEYS[0], ids[0], ids[1]), (KEYS[1], ids[1], ids[0])):
        with proxy.http(key) as http:
            wait_requests(http, sid, 1)
            listed = [s["id"] for s in http.get("/sessions").json()["data"]]
            assert listed == [sid]
            if other != sid:
                assert http.get(f"/sessions/{other}").status_code == 404
