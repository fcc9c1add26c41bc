"""``GET /sessions/{id}/archive/search`` and ``GET /artifacts/{id}/search`` (issue 20, for the
web viewer), in process: the read tool's search (``proxy.tools.search.Searcher``) over one
document, its matches numbered as ``?offset=`` numbers the document's lines, bounded queries
refused in the API's envelope, scoped to the tenant."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from proxy.routes.auth import tenant_of
from proxy.tools.search import MAX_QUERY_CHARS, Searcher
from storage.records import ArtifactRecord
from tests.support.inprocess import CLIENT_KEY, InProcessProxy

OTHER_KEY = "sk-other-tenant-key-9876543210"
ART = "art_" + "ab" * 16


async def two_turns(proxy: InProcessProxy) -> None:
    proxy.provider.state.script.extend([{"role": "assistant", "content": "the needle is in hay"},
                                        {"role": "assistant", "content": "plain answer"}])
    first = [{"role": "user", "content": "Where is the needle?\nand the thread"}]
    r = await proxy.chat({"model": "gpt-4o", "messages": first}, headers={"x-session-id": "doc"})
    assert r.status_code == 200, r.text
    second = [*first, {"role": "assistant", "content": "the needle is in hay"}, {"role": "user", "content": "thread only"}]
    r = await proxy.chat({"model": "gpt-4o", "messages": second}, headers={"x-session-id": "doc"})
    assert r.status_code == 200, r.text
    await proxy.wait_logged("doc", requests=2)


async def test_archive_matches_name_the_lines_the_archive_pages_by(inprocess_proxy: InProcessProxy) -> None:
    await two_turns(inprocess_proxy)
    http = inprocess_proxy.http
    lines = (await http.get("/sessions/doc/archive")).text.split("\n")
    resp = await http.get("/sessions/doc/archive/search", params={"q": "needle thread"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "list" and body["stopped"] is False and body["has_more"] is False
    expected = [n for n, line in enumerate(lines) if "needle" in line.lower() or "thread" in line.lower()]
    assert body["total"] == len(expected) >= 4
    assert sorted(m["line"] for m in body["data"]) == expected
    for match in body["data"]:
        assert match["object"] == "search.match"
        assert match["text"] == lines[match["line"]]
        page = (await http.get("/sessions/doc/archive", params={"offset": match["line"], "limit": 1})).text
        assert page == lines[match["line"]] + "\n"
        assert all(c["text"] == lines[c["line"]] for c in match["context"])
    # best first: a line with both words ranks above the later lines with one
    both = [n for n in expected if "needle" in lines[n].lower() and "thread" in lines[n].lower()]
    assert [m["line"] for m in body["data"][: len(both)]] == sorted(both, reverse=True)
    # a page of the matches
    one = (await http.get("/sessions/doc/archive/search", params={"q": "needle thread", "limit": 1, "offset": 1})).json()
    assert one["data"] == body["data"][1:2] and one["has_more"] is True


async def test_a_regex_runs_on_re2_and_a_refused_query_is_a_400(inprocess_proxy: InProcessProxy) -> None:
    await two_turns(inprocess_proxy)
    http = inprocess_proxy.http
    found = (await http.get("/sessions/doc/archive/search", params={"q": "ne+dle is", "regex": "true"})).json()
    assert [m["text"].strip() for m in found["data"]] == ["the needle is in hay"]
    for params in ({"q": "(unclosed", "regex": "true"}, {"q": "x" * (MAX_QUERY_CHARS + 1)}, {"q": ""}, {"q": "   "},
                   {"q": "a", "limit": 201}, {"q": "a", "offset": -1}):
        resp = await http.get("/sessions/doc/archive/search", params=params)
        assert resp.status_code == 400, (params, resp.text)
        assert resp.json()["error"]["type"] == "invalid_request_error"
    resp = await http.get("/sessions/doc/archive/search", params={"q": "(unclosed", "regex": "true"})
    assert "does not compile" in resp.json()["error"]["message"] and resp.json()["error"]["param"] == "q"


async def test_a_branch_is_searched_by_its_leaf(inprocess_proxy: InProcessProxy) -> None:
    await two_turns(inprocess_proxy)
    inprocess_proxy.provider.state.script.append({"role": "assistant", "content": "a haystack elsewhere"})
    fork = [{"role": "user", "content": "Where is the needle?\nand the thread"},
            {"role": "assistant", "content": "the needle is in hay"}, {"role": "user", "content": "fork here"}]
    r = await inprocess_proxy.chat({"model": "gpt-4o", "messages": fork}, headers={"x-session-id": "doc"})
    assert r.status_code == 200
    await inprocess_proxy.wait_logged("doc", requests=3)
    http = inprocess_proxy.http
    branches = (await http.get("/sessions/doc/branches")).json()["data"]
    totals = {}
    for branch in branches:
        found = (await http.get("/sessions/doc/archive/search", params={"q": "haystack", "leaf": branch["leaf"]})).json()
        totals[branch["newest"]] = found["total"]
    assert totals == {True: 1, False: 0}
    missing = await http.get("/sessions/doc/archive/search", params={"q": "x", "leaf": "0" * 64})
    assert missing.status_code == 404


async def test_artifact_matches_name_the_lines_it_pages_by(inprocess_proxy: InProcessProxy) -> None:
    await two_turns(inprocess_proxy)
    content = "".join(f"row {i}: {'target' if i % 7 == 3 else 'filler'}\r\n" if i % 2 else f"row {i} plain\n"
                      for i in range(60))
    tenant = tenant_of(CLIENT_KEY, inprocess_proxy.settings.tenant_salt)
    await inprocess_proxy.app.state.proxy.store.put_artifacts([ArtifactRecord(
        ART, tenant, None, "text/plain", content, len(content.encode()), 60, datetime.now(UTC))])
    http = inprocess_proxy.http
    found = (await http.get(f"/artifacts/{ART}/search", params={"q": "target", "limit": 200})).json()
    assert found["total"] == len(found["data"]) == sum(1 for i in range(60) if i % 2 and i % 7 == 3)
    for match in found["data"]:
        line = (await http.get(f"/artifacts/{ART}", params={"offset": match["line"], "limit": 1})).json()["content"]
        assert line.rstrip("\r\n") == match["text"] and "target" in line


async def test_another_tenant_finds_nothing(inprocess_proxy: InProcessProxy) -> None:
    await two_turns(inprocess_proxy)
    tenant = tenant_of(CLIENT_KEY, inprocess_proxy.settings.tenant_salt)
    await inprocess_proxy.app.state.proxy.store.put_artifacts([ArtifactRecord(
        ART, tenant, None, "text/plain", "needle\n", 7, 1, datetime.now(UTC))])
    other = inprocess_proxy.http_client(OTHER_KEY)
    for path in ("/sessions/doc/archive/search", f"/artifacts/{ART}/search"):
        resp = await other.get(path, params={"q": "needle"})
        assert resp.status_code == 404, resp.text
        assert resp.json()["error"]["type"] == "not_found_error"
    mine = await inprocess_proxy.http.get(f"/artifacts/{ART}/search", params={"q": "needle"})
    assert mine.json()["total"] == 1


async def test_parallel_searches_run_at_most_the_bound_at_once(
    inprocess_factory: Callable[..., Awaitable[InProcessProxy]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Searches run in worker threads of the default pool that forwarding uses too: however many a
    client sends at once, no more than ``read_api_max_concurrent_searches`` search at a time (the
    rest wait their turn and are answered)."""
    proxy = await inprocess_factory(read_api_max_concurrent_searches=2)
    await two_turns(proxy)
    tenant = tenant_of(CLIENT_KEY, proxy.settings.tenant_salt)
    await proxy.app.state.proxy.store.put_artifacts([ArtifactRecord(
        ART, tenant, None, "text/plain", "needle\n", 7, 1, datetime.now(UTC))])
    running = peak = 0
    lock = threading.Lock()
    feed = Searcher.feed

    def counted(self: Searcher, *args: Any) -> bool:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        try:
            time.sleep(0.05)  # hold the thread, as a search of a big document does
            return feed(self, *args)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(Searcher, "feed", counted)
    paths = ["/sessions/doc/archive/search", f"/artifacts/{ART}/search"] * 5
    answers = await asyncio.gather(*(proxy.http.get(path, params={"q": "needle"}) for path in paths))
    assert [a.status_code for a in answers] == [200] * len(paths)
    assert all(a.json()["total"] >= 1 for a in answers)
    assert peak == 2


async def test_searches_past_the_queue_are_refused_and_queued_ones_hold_no_artifact(
    inprocess_factory: Callable[..., Awaitable[InProcessProxy]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One search runs and ``SEARCHES_WAITING_PER_SLOT`` (4) wait; the next ones are a 503
    ``proxy_busy`` with ``retry-after`` in OpenAI's envelope, not an unbounded queue; an artifact is
    read from the store only once its search holds a slot, so waiting searches hold no content."""
    from proxy.admission import SEARCHES_WAITING_PER_SLOT

    proxy = await inprocess_factory(read_api_max_concurrent_searches=1)
    await two_turns(proxy)
    tenant = tenant_of(CLIENT_KEY, proxy.settings.tenant_salt)
    store = proxy.app.state.proxy.store
    await store.put_artifacts([ArtifactRecord(ART, tenant, None, "text/plain", "needle\n", 7, 1, datetime.now(UTC))])
    loaded: list[str] = []  # each read of an artifact from the store
    read = store.get_artifact
    slots = proxy.app.state.proxy.searches

    async def counted_read(*args: Any) -> Any:
        loaded.append(args[0])
        return await read(*args)

    feed = Searcher.feed

    def slow(self: Searcher, *args: Any) -> bool:
        time.sleep(0.05)
        return feed(self, *args)

    monkeypatch.setattr(store, "get_artifact", counted_read)
    monkeypatch.setattr(Searcher, "feed", slow)
    sent = 1 + SEARCHES_WAITING_PER_SLOT + 3
    answers = await asyncio.gather(*(proxy.http.get(f"/artifacts/{ART}/search", params={"q": "needle"})
                                     for _ in range(sent)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] * (1 + SEARCHES_WAITING_PER_SLOT) + [503] * 3
    busy = next(a for a in answers if a.status_code == 503)
    assert busy.json()["error"]["code"] == "proxy_busy" and busy.headers["retry-after"] == "1"
    assert len(loaded) == 1 + SEARCHES_WAITING_PER_SLOT  # the refused ones never read it
    assert slots.waiting == 0
