"""A request record's ``(added_messages, first_added_seq)`` names exactly the client's messages the
request inserted when some of those it tried were stored meanwhile, unknown to the stored length
this process had noted (by another replica on the same database; by the last reply's write, still
queued): the early write of a stream (``SessionLog.append_request``) and the end-of-request write
(``SessionLog.finish``, ``Store.append_and_record``: SQLite's deferred batch, PostgreSQL's
transaction) alike. In-process proxies, the official ``anthropic`` SDK, the strict fake Anthropic
provider, SQLite and PostgreSQL; read back through the read API."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from proxy.app import create_app
from proxy.settings import Settings
from storage.sqlite import batch
from tests.fakes.anthropic import FakeAnthropic, create_fake_anthropic, reply
from tests.support.asgi import LifespanManager, StreamingASGITransport
from tests.support.polling import wait_for_async
from tests.support.shared import tiktoken_cache_dir

try:  # the SDK's own HTTP library: httpx2 from anthropic 2.x on, httpx before
    import httpx2 as sdk_http
except ImportError:  # pragma: no cover - older SDKs
    import httpx as sdk_http  # type: ignore[no-redef]

KEY = "sk-ant-client-0123456789"
SESSION = "two-replicas"
MODEL = "claude-sonnet-4-5"


@dataclass
class _Replica:
    sdk: anthropic.AsyncAnthropic
    http: httpx.AsyncClient
    """On the same app, for the read API."""


@contextlib.asynccontextmanager
async def _replica(database_url: str, provider: FakeAnthropic) -> AsyncIterator[_Replica]:
    """A proxy app on ``database_url`` with ``provider`` upstream (one replica), and clients on it."""
    settings = Settings(anthropic_upstream_url="http://anthropic.test", upstream_url="http://127.0.0.1:9/v1",
                        database_url=database_url, tiktoken_cache_dir=tiktoken_cache_dir())
    app = create_app(settings, upstream_transport=StreamingASGITransport(provider, raise_app_exceptions=False))
    async with LifespanManager(app), \
            httpx.AsyncClient(transport=StreamingASGITransport(app), base_url="http://proxy.test",
                              headers={"x-api-key": KEY}, timeout=30.0) as http, \
            sdk_http.AsyncClient(transport=sdk_http.ASGITransport(app=app), base_url="http://proxy.test",
                                 timeout=30.0) as sdk_client, \
            anthropic.AsyncAnthropic(base_url="http://proxy.test", api_key=KEY, max_retries=0,
                                     http_client=sdk_client, default_headers={"x-session-id": SESSION}) as sdk:
        yield _Replica(sdk, http)


async def _turn(replica: _Replica, messages: list[Any], stream: bool) -> dict[str, Any]:
    """One request through ``replica``; the assistant turn as the client echoes it next time."""
    if stream:
        async with replica.sdk.messages.stream(model=MODEL, max_tokens=256, messages=messages) as s:
            message = await s.get_final_message()
    else:
        message = await replica.sdk.messages.create(model=MODEL, max_tokens=256, messages=messages)
    return {"role": "assistant", "content": [{"type": "text", "text": b.text} for b in message.content
                                             if b.type == "text"]}


async def _logged(replica: _Replica, requests: int) -> tuple[list[Any], list[Any]]:
    """The session's request records (oldest first) and messages, once ``requests`` are recorded."""
    async def records() -> list[Any] | None:
        resp = await replica.http.get(f"/sessions/{SESSION}/requests")
        data: list[Any] = resp.json().get("data", []) if resp.status_code == 200 else []
        return data if len(data) >= requests else None

    found = await wait_for_async(records, 10.0)
    assert found is not None, f"{requests} request records not logged"
    messages = (await replica.http.get(f"/sessions/{SESSION}/messages")).json()["data"]
    return sorted(found, key=lambda r: r["created_at"]), messages


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_a_record_counts_only_the_messages_it_inserted_when_another_replica_stored_some(
        database_url: str, stream: bool) -> None:
    provider, state = create_fake_anthropic()
    state.script.extend([reply("One."), reply("Two."), reply("Three.")])
    u1, u2, u3 = ({"role": "user", "content": f"Question {k}?"} for k in (1, 2, 3))
    async with _replica(database_url, provider) as a, _replica(database_url, provider) as b:
        a1 = await _turn(a, [u1], stream)  # replica a: u1 and a1 stored (seq 0, 1), and a knows it
        await _logged(a, 1)
        a2 = await _turn(b, [u1, a1, u2], stream)  # replica b: u2 and a2 (seq 2, 3); a does not know
        await _logged(b, 2)
        await _turn(a, [u1, a1, u2, a2, u3], stream)  # a: u2 and a2 found stored, only u3 (seq 4) added
        records, messages = await _logged(a, 3)
    assert [(m["seq"], m["role"]) for m in messages] == [
        (0, "user"), (1, "assistant"), (2, "user"), (3, "assistant"), (4, "user"), (5, "assistant")]
    assert [(r["added_messages"], r["first_added_seq"]) for r in records] == [(1, 0), (1, 2), (1, 4)]
    assert [r["status"] for r in records] == [200, 200, 200]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_a_record_counts_only_the_messages_it_inserted_when_the_last_reply_was_still_queued(
        tmp_path: Path, sqlite_template: Path, monkeypatch: pytest.MonkeyPatch, stream: bool) -> None:
    """An agent's next request arrives before its last reply's write, queued in SQLite's deferred
    batch, is committed (here the batch's timer waits longer than the test: the store's next
    operation commits it): this process knows the client's messages of the last turn stored, not
    its reply, which that queued write stores. (The reviewer's case: a Messages stream logged
    first_added_seq 14 where it added seq 15.)"""
    monkeypatch.setattr(batch, "DEFER_WRITE_S", 60.0)
    shutil.copyfile(sqlite_template, tmp_path / "one.db")
    provider, state = create_fake_anthropic()
    state.script.extend([reply("One."), reply("Two."), reply("Three.")])
    u1, u2, u3 = ({"role": "user", "content": f"Question {k}?"} for k in (1, 2, 3))
    async with _replica(f"sqlite:///{tmp_path}/one.db", provider) as a:
        a1 = await _turn(a, [u1], stream)
        a2 = await _turn(a, [u1, a1, u2], stream)  # sent at once: a1's write may still be queued
        await _turn(a, [u1, a1, u2, a2, u3], stream)  # a2's too
        records, messages = await _logged(a, 3)
    assert [(m["seq"], m["role"]) for m in messages] == [
        (0, "user"), (1, "assistant"), (2, "user"), (3, "assistant"), (4, "user"), (5, "assistant")]
    assert [(r["added_messages"], r["first_added_seq"]) for r in records] == [(1, 0), (1, 2), (1, 4)]
