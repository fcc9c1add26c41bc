"""Secrets (issue 5, point 2): after a session that exercises chat (streamed and not), pass-through,
the read API, errors and the proxy-held upstream key, no client key and not the upstream key
appears in any table, in any log line (captured records, each also rendered by the proxy's JSON
formatter, at DEBUG), in /metrics, or in any response body or header.

The keys are random hex (the shape of Azure keys), not ``sk-…``: the log formatter masks
``sk-`` shapes, and this test must not pass only because of that mask.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable

import httpx
import openai
import pytest

from proxy.telemetry.logs import JsonFormatter
from tests.e2e.conftest import Proxy, Upstream
from tests.reliability.probes import TALLY, database_text, query

CLIENT_KEYS = [secrets.token_hex(16), secrets.token_hex(16)]
ADMIN_KEY = secrets.token_hex(16)
UPSTREAM_KEY = secrets.token_hex(20)
WRONG_KEY = secrets.token_hex(16)
ALL_KEYS = (*CLIENT_KEYS, ADMIN_KEY, UPSTREAM_KEY, WRONG_KEY)


def test_no_key_anywhere_after_a_full_session(proxy_factory: Callable[..., Proxy], upstream: Upstream,
                                              database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    proxy = proxy_factory(upstream_api_key=UPSTREAM_KEY, client_api_keys=",".join(CLIENT_KEYS),
                          admin_api_keys=ADMIN_KEY, offload_tool_tokens=200, log_level="debug")
    seen: list[str] = []  # every response: status line, headers and body

    def keep(r: httpx.Response) -> httpx.Response:
        r.read()
        seen.append(f"{r.status_code} {dict(r.headers)} {r.text}")
        return r

    for i, key in enumerate(CLIENT_KEYS):
        client = proxy.client(key, default_headers={"x-session-id": f"secret-{i}"},
                              http_client=httpx.Client(event_hooks={"response": [keep]}))
        history = [{"role": "user", "content": f"hello {i}"}]
        reply = client.chat.completions.create(model="gpt-4o", messages=history)
        history += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="gpt-4o", messages=history, stream=True, stream_options={"include_usage": True}) if c.choices)
        assert text
        big = "\n".join(f"log line {n}" for n in range(500))
        client.chat.completions.create(model="gpt-4o", messages=[*history, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": big}])
        client.models.list()
        client.embeddings.create(model="text-embedding-3-small", input="hi")
        upstream.state.fail_next.append(("status", 500, {"error": {"message": "boom", "type": "server_error"}}))
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="gpt-4o", messages=history)
        upstream.state.fail_next.append(("cut_stream", 2))
        with pytest.raises(openai.APIError):
            list(client.chat.completions.create(model="gpt-4o", messages=history, stream=True))
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "wizard", "content": "x"}])
        TALLY.add("requests", 8)

    with httpx.Client(base_url=proxy.url, event_hooks={"response": [keep]}, timeout=30) as http:
        for key in (WRONG_KEY, None):
            headers = {"authorization": f"Bearer {key}"} if key else {}
            for path in ("/v1/chat/completions", "/v1/models"):
                r = http.post(path, headers=headers, json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]})
                assert r.status_code in (401, 405) if path == "/v1/models" else r.status_code == 401
            assert http.get("/sessions", headers=headers).status_code == 401
        for key in (*CLIENT_KEYS, ADMIN_KEY):
            auth = {"authorization": f"Bearer {key}", "api-key": key, "x-api-key": key}
            http.get("/sessions", headers=auth)
            for sid in ("secret-0", "secret-1"):
                for suffix in ("", "/messages", "/events", "/archive"):
                    http.get(f"/sessions/{sid}{suffix}", headers=auth)
            http.get("/artifacts/art_00000000000000000000000000000000", headers=auth)
        seen.append(http.get("/metrics").text)
        TALLY.add("requests", 40)

    deadline = time.monotonic() + 10  # the log is written after the replies: wait for every chat record
    while query(database_url, "SELECT COUNT(*) FROM requests")[0][0] < 2 * 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    db = database_text(database_url)
    assert "secret-0" in db and "hello 1" in db  # the dump sees the logged sessions
    for request in upstream.state.requests:  # the upstream got the proxy's key, never a client's
        assert request.headers.get("authorization") == f"Bearer {UPSTREAM_KEY}"
        assert not any(k in str(request.headers) for k in (*CLIENT_KEYS, ADMIN_KEY))
    formatter = JsonFormatter()
    logs = "\n".join([caplog.text, *(formatter.format(r) for r in caplog.records)])
    assert len(caplog.records) > 0
    responses = "\n".join(seen)
    for key in ALL_KEYS:
        assert key not in db, "a key is stored in the database"
        assert key not in logs, "a key is in the proxy's log"
        assert key not in responses, "a key is in a response"
    TALLY.add("secrets_searched_chars", len(db) + len(logs) + len(responses))
    TALLY.add("secret_keys_searched", len(ALL_KEYS))
