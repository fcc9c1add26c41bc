"""``GET /sessions/{id}/artifacts`` (issue 20, item 1), in process on SQLite and PostgreSQL: the
artifacts a session offloaded, oldest first in keyset pages, each with its size in bytes and
lines, its kind and the message it came from (``artifacts.message_hash``, migration 0006), scoped
to the tenant; and the message found by content (``proxy.compaction.artifact_sources``)."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from proxy.compaction.artifact_sources import source_messages
from proxy.defenses.offload import ArtifactToStore, artifact_id
from storage.records import ArtifactRecord
from tests.support.inprocess import FakeProvider, InProcessProxy

OTHER_KEY = "sk-other-tenant-key-9876543210"
ADMIN_KEY = "sk-admin-key-for-artifacts-5555"
SETTINGS = {"offload_tool_tokens": 300, "compaction_enabled": True}


@pytest.fixture
def inprocess_database_url(database_url: str) -> str:
    return database_url  # both databases, as the real-server read API tests


def listing(n: int, word: str) -> str:
    """A tool result of ``n`` lines (over the 300-token threshold for n >= 100), non-ASCII included."""
    return "\n".join(f"{word} line {i}: café ✓ {'x' * (i % 7)}" for i in range(n))


def call(*call_ids: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": c, "type": "function", "function": {"name": "read_file", "arguments": "{}"}} for c in call_ids]}


async def offloading_session(proxy: InProcessProxy, provider: FakeProvider, session_id: str = "big") -> list[str]:
    """Two requests: the first offloads one tool result, the second two more; returns the contents
    in the order they were offloaded."""
    contents = [listing(200, "alpha"), listing(150, "beta"), listing(120, "gamma") + "\n"]
    history: list[dict[str, Any]] = [{"role": "user", "content": "Read the files."}, call("c1"),
                                     {"role": "tool", "tool_call_id": "c1", "content": contents[0]}]
    provider.state.script.extend([{"role": "assistant", "content": "Read one."}, {"role": "assistant", "content": "Done."}])
    for n, more in enumerate(([], [{"role": "assistant", "content": "Read one."}, call("c2", "c2b"),
                                   {"role": "tool", "tool_call_id": "c2", "content": contents[1]},
                                   {"role": "tool", "tool_call_id": "c2b", "content": contents[2]}])):
        history += more
        resp = await proxy.chat({"model": "gpt-4o", "messages": history}, headers={"x-session-id": session_id})
        assert resp.status_code == 200, resp.text
        await proxy.wait_logged(session_id, requests=n + 1)
    forwarded = provider.state.chat_requests[-1].json["messages"]
    assert all(artifact_id(c) in str(forwarded) for c in contents), "the proxy offloaded the three results"
    return contents


async def test_each_artifact_with_its_size_kind_and_message(inprocess_factory: Callable[..., Awaitable[InProcessProxy]],
                                                            fake_provider: FakeProvider) -> None:
    proxy = await inprocess_factory(**SETTINGS)
    contents = await offloading_session(proxy, fake_provider)
    http = proxy.http
    page = (await http.get("/sessions/big/artifacts")).json()
    assert page["object"] == "list" and page["has_more"] is False
    data = page["data"]
    first, rest = data[0], data[1:]
    assert first["id"] == artifact_id(contents[0]), "oldest first: the first request's artifact"
    assert sorted(a["id"] for a in rest) == sorted(artifact_id(c) for c in contents[1:])
    assert data[0]["created_at"] <= data[1]["created_at"] == data[2]["created_at"]
    assert [page["first_id"], page["last_id"]] == [data[0]["id"], data[-1]["id"]]
    messages = (await http.get("/sessions/big/messages", params={"limit": 1000})).json()["data"]
    by_content = {m["content"]: m["id"] for m in messages if m["role"] == "tool"}
    for artifact in data:
        content = next(c for c in contents if artifact_id(c) == artifact["id"])
        assert artifact == {"object": "session.artifact", "id": artifact_id(content), "bytes": len(content.encode()),
                            "lines": len(content.splitlines()), "kind": "text", "media_type": "text/plain",
                            "message": by_content[content], "created_at": artifact["created_at"]}
        stored = (await http.get(f"/artifacts/{artifact['id']}", params={"limit": 100_000})).json()
        assert stored["content"] == content and stored["size_bytes"] == artifact["bytes"]


async def test_pages_follow_last_id_and_cursors_stay_in_their_session(
        inprocess_factory: Callable[..., Awaitable[InProcessProxy]], fake_provider: FakeProvider) -> None:
    proxy = await inprocess_factory(**SETTINGS)
    await offloading_session(proxy, fake_provider)
    http = proxy.http
    whole = (await http.get("/sessions/big/artifacts")).json()["data"]
    seen: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 1}
    for _ in range(5):
        page = (await http.get("/sessions/big/artifacts", params=params)).json()
        seen += page["data"]
        if not page["has_more"]:
            break
        params["after"] = page["last_id"]
    assert seen == whole and len(whole) == 3
    fake_provider.state.script.append({"role": "assistant", "content": "Hi"})
    await proxy.chat({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
                     headers={"x-session-id": "small"})
    await proxy.wait_logged("small", requests=1)
    assert (await http.get("/sessions/small/artifacts")).json()["data"] == []
    for cursor in (whole[0]["id"], "art_unknown", "x\x00"):
        resp = await http.get("/sessions/small/artifacts", params={"after": cursor})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "after", resp.text
    assert (await http.get("/sessions/big/artifacts", params={"after": "a" * 201})).status_code == 400
    assert (await http.get("/sessions/nobody/artifacts")).status_code == 404


async def test_an_artifact_stored_without_its_message_says_null(
        inprocess_factory: Callable[..., Awaitable[InProcessProxy]], fake_provider: FakeProvider) -> None:
    """Rows written before migration 0006 (or whose content was not found) have no message."""
    proxy = await inprocess_factory(**SETTINGS)
    fake_provider.state.script.append({"role": "assistant", "content": "Hi"})
    await proxy.chat({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
                     headers={"x-session-id": "old"})
    session = await proxy.wait_logged("old", requests=1)
    store = proxy.app.state.proxy.store
    record = await store.find_session("old", None)
    assert record is not None and session["id"] == "old"
    when = datetime(2026, 1, 1, tzinfo=UTC)
    await store.put_artifacts([ArtifactRecord("art_old", record.tenant, record.pk, "image/png", "data:image/png;base64,AA",
                                              24, 1, when)])
    (artifact,) = (await proxy.http.get("/sessions/old/artifacts")).json()["data"]
    assert artifact == {"object": "session.artifact", "id": "art_old", "bytes": 24, "lines": 1, "kind": "image",
                        "media_type": "image/png", "message": None, "created_at": int(when.timestamp())}


async def test_another_tenants_session_is_a_404_and_admins_name_the_tenant(
        inprocess_factory: Callable[..., Awaitable[InProcessProxy]], fake_provider: FakeProvider) -> None:
    proxy = await inprocess_factory(**SETTINGS, admin_api_keys=ADMIN_KEY)
    await offloading_session(proxy, fake_provider)
    mine = (await proxy.http.get("/sessions/big/artifacts")).json()
    other, admin = proxy.http_client(OTHER_KEY), proxy.http_client(ADMIN_KEY)
    assert (await other.get("/sessions/big/artifacts")).status_code == 404
    tenant = (await admin.get("/sessions")).json()["data"][0]["tenant"]
    assert (await other.get("/sessions/big/artifacts", params={"tenant": tenant})).status_code == 404
    assert (await admin.get("/sessions/big/artifacts", params={"tenant": tenant})).json() == mine
    assert (await admin.get("/sessions/big/artifacts", params={"tenant": "t_nobody"})).status_code == 404


def test_the_source_is_the_newest_message_holding_the_content() -> None:
    png = base64.b64encode(b"\x89PNG" + bytes(range(200))).decode()
    text = "a long tool result\n" * 50
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "look"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": text},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": png + "AA"}}]}]},
        {"role": "tool", "tool_call_id": "d", "content": text},  # the same content again: the newest wins
        {"role": "user", "content": "and now?"},
    ]
    chain = [f"{i:064x}" for i in range(len(messages))]
    arts = [ArtifactToStore(artifact_id(text), text, "text/plain"),
            ArtifactToStore("art_png", f"data:image/png;base64,{png}", "image/png"),
            ArtifactToStore("art_gif", f"data:image/gif;base64,{png}AA", "image/gif"),
            ArtifactToStore("art_joined", "a long tool", "text/plain")]
    assert source_messages(messages, chain, arts) == {artifact_id(text): chain[4], "art_png": chain[1],
                                                      "art_gif": chain[3]}
    assert source_messages(messages[:4], chain[:4], arts[:1]) == {artifact_id(text): chain[2]}
    assert source_messages(messages, chain, []) == {}


async def test_pages_over_artifacts_with_equal_times_list_each_once(
        inprocess_factory: Callable[..., Awaitable[InProcessProxy]], fake_provider: FakeProvider) -> None:
    """31 artifacts stored at two instants (ties on ``created_at``): every page size lists each once,
    oldest first, ties by id."""
    from tests.test_read_branches import every_page

    proxy = await inprocess_factory(**SETTINGS)
    fake_provider.state.script.append({"role": "assistant", "content": "Hi"})
    await proxy.chat({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
                     headers={"x-session-id": "ties"})
    await proxy.wait_logged("ties", requests=1)
    store = proxy.app.state.proxy.store
    session = await store.find_session("ties", None)
    assert session is not None
    early, late = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    await store.put_artifacts([ArtifactRecord(f"art_{i:03d}", session.tenant, session.pk, "text/plain", f"c{i}", 2, 1,
                                              late if i % 3 == 0 else early) for i in range(31)])
    order = sorted((f"art_{i:03d}" for i in range(31)), key=lambda a: (int(a[4:]) % 3 == 0, a))
    for limit in (1, 2, 4, 10, 20, 30, 31):
        assert await every_page(proxy.http, "/sessions/ties/artifacts", "id", limit) == order, limit


async def test_the_message_is_the_one_offloaded_not_a_newer_one_holding_the_text(
        inprocess_factory: Callable[..., Awaitable[InProcessProxy]], fake_provider: FakeProvider) -> None:
    """A tool result over the tool threshold and the same text pasted in the next user message,
    under the user threshold (forwarded as sent): the artifact came from the tool message (the
    newest message holding the text was named before)."""
    proxy = await inprocess_factory(**SETTINGS)
    text = listing(200, "alpha")
    history = [{"role": "user", "content": "Read the file."}, call("c1"),
               {"role": "tool", "tool_call_id": "c1", "content": text}, {"role": "user", "content": text}]
    fake_provider.state.script.append({"role": "assistant", "content": "Read."})
    resp = await proxy.chat({"model": "gpt-4o", "messages": history}, headers={"x-session-id": "pasted"})
    assert resp.status_code == 200, resp.text
    await proxy.wait_logged("pasted", requests=1)
    forwarded = fake_provider.state.chat_requests[-1].json["messages"]
    assert [m["content"] == text for m in forwarded] == [False, False, False, True], "the tool result was offloaded"
    (artifact,) = (await proxy.http.get("/sessions/pasted/artifacts")).json()["data"]
    messages = (await proxy.http.get("/sessions/pasted/messages")).json()["data"]
    assert artifact["id"] == artifact_id(text)
    assert artifact["message"] == messages[2]["id"] and messages[2]["role"] == "tool"
